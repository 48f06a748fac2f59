"""The planner: pack weighted spanning trees that maximise collective throughput.

Given a :class:`~jax_blink.topology.Topology`, :func:`plan` solves the
tree-packing LP exactly by column generation (cvxpy + HiGHS; a new tree is a
minimum spanning tree or minimum arborescence under the dual link prices),
certifies the rate against bounds computed without the LP
(:mod:`jax_blink.bounds`), then picks the fewest trees that keep the optimal
rate (or a rate within ``tolerance``) with a MILP, shallow trees breaking ties.

Collectives and families:

* broadcast / reduce: arborescences from / into the root;
* allreduce, family ``"tree"`` (Blink): undirected spanning trees, each
  reduced up to its root and broadcast back down, so a tree edge loads both
  directions of its link;
* allreduce, family ``"rsag"`` (reduce-scatter + all-gather): every rank roots
  trees of equal total weight, carrying its own 1/N slice up and down them.
  Both families load links alike, so their optimal rates agree; the planner
  computes both, keeps the faster, and on a tie prefers ``"rsag"`` when its
  trees are no deeper (every rank then does an equal share of the reduction,
  e.g. N depth-1 stars on shared memory).

Slow links (PCIe, network) are used only when the fast ones (NVLink) do not
join all ranks; ``Plan.link_kinds`` records which kinds a plan uses, and
``bound_gbps`` bounds throughput over those links.

Plans are cached in process and on disk (``$JAX_BLINK_CACHE_DIR``, else
``$XDG_CACHE_HOME/jax_blink``, else ``~/.cache/jax_blink``). :meth:`Plan.lower`
turns a plan into a chunked, pipelined :class:`~jax_blink.schedule.Schedule`.

Pure Python: never imports jax.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

from . import bounds
from ._jsonio import read_document
from .topology import LinkGraph, Topology, TopologyError

__all__ = ["plan", "Plan", "Tree", "PlanError", "ALPHA_SECONDS", "CUDA_LAUNCH_SECONDS",
           "MAX_CHUNKS_PER_TREE",
           "cache_dir", "clear_memory_cache"]

COLLECTIVES = ("allreduce", "broadcast", "reduce")
FORMAT_VERSION = 1
#: Bumped whenever planning changes its results; part of every cache key.
CACHE_VERSION = 1
#: Per-hop latency (seconds) of the pipeline model, by link kind. ``shm`` is
#: measured, not a wire latency: with 8 device threads on 2 cores a step that
#: waits on a peer waits for that peer's thread to be scheduled, and more
#: pipeline chunks did not pay off at any size
#: (``benchmarks/bench_psum_cpu.py --chunks 1,4,12``), so the model picks one
#: chunk per tree up to ~4 MB per device and few above.
ALPHA_SECONDS = {"nvlink": 3e-6, "pcie": 5e-6, "net": 10e-6, "shm": 2e-3}
#: Host cost (seconds) of one pipeline step on the CUDA executor, added to the
#: link latency: a step is about two CUDA API calls (a kernel or copy, and an
#: event record or wait) at ~3.3 us each, measured with 8 ranks enqueueing
#: concurrently on one H100 (``benchmarks/bench_cuda.py --mbytes 1``).
CUDA_LAUNCH_SECONDS = 7e-6
#: Upper clamp on the pipeline chunks the model chooses per tree.
MAX_CHUNKS_PER_TREE = 32
_RATE_RTOL = 1e-6  # rate ties, certificate checks
_PRICE_TOL = 1e-7  # column generation stops when no tree is this much cheaper than 1
_MILP_TIME_LIMIT_S = 1.0
_DIRECTIONS = {"allreduce": "both", "broadcast": "down", "reduce": "up"}


class PlanError(ValueError):
    """Planning was asked something impossible or malformed; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class Tree:
    """One weighted spanning tree of a plan.

    Attributes
    ----------
    weight : float
        Bandwidth share in GB/s: the tree carries ``weight / sum(weights)``
        of the data.
    root : int
        Where the reduction ends and the broadcast starts.
    edges : tuple of (int, int)
        ``(parent, child)`` rank pairs in broadcast direction (a reduce sends
        child to parent). A hop through switches is still one rank-to-rank edge.
    paths : tuple of tuple of int
        The node path of each edge from parent to child (``(parent, child)``
        for a direct link; switch nodes in between otherwise).
    """

    weight: float
    root: int
    edges: tuple
    paths: tuple

    @property
    def depth(self) -> int:
        """Longest root-to-leaf path, in edges."""
        return _depth(self.root, self.edges)

    def to_dict(self) -> dict:
        return {"weight": self.weight, "root": self.root, "edges": [list(e) for e in self.edges],
                "paths": [list(p) for p in self.paths]}

    @classmethod
    def from_dict(cls, d: dict) -> "Tree":
        edges = tuple((int(p), int(c)) for p, c in d["edges"])
        paths = tuple(tuple(int(x) for x in p) for p in d.get("paths", edges))
        return cls(float(d["weight"]), int(d["root"]), edges, paths)


def _depth(root, edges) -> int:
    children = defaultdict(list)
    for p, c in edges:
        children[p].append(c)
    depth, frontier = 0, [root]
    while True:
        frontier = [c for v in frontier for c in children[v]]
        if not frontier:
            return depth
        depth += 1


@dataclasses.dataclass(frozen=True)
class Plan:
    """Weighted spanning trees for one collective on one topology.

    Attributes
    ----------
    collective : str
        ``"allreduce"``, ``"broadcast"`` or ``"reduce"``.
    root : int or None
        Root of a broadcast/reduce; None for allreduce.
    family : str
        ``"tree"`` or ``"rsag"`` (allreduce); ``"tree"`` for broadcast/reduce.
    rate_gbps : float
        Algorithm bandwidth (size / time) for large messages in the link model.
    bound_gbps : float
        Certified upper bound on any tree packing's rate for this collective
        over the same links.
    ring_rate_gbps : float
        Algorithm bandwidth of the best NCCL-style rings on the fast links
        (0 where they form no ring).
    trees : tuple of Tree
    plan_seconds : float
        Wall time the planning took (when it was computed, not looked up).
    topology : Topology
    link_kinds : tuple of str
        Link kinds the trees may use.
    """

    collective: str
    root: int | None
    family: str
    rate_gbps: float
    bound_gbps: float
    ring_rate_gbps: float
    trees: tuple
    plan_seconds: float
    topology: Topology
    link_kinds: tuple

    # ------------------------------------------------------------ invariants
    def check(self) -> "Plan":
        """Check the plan's invariants; return ``self``.

        Every tree spans the ranks from its root along routes that exist
        (interior nodes are switches), no arc carries more than its capacity,
        broadcast/reduce trees start at the root, ``"rsag"`` roots equal
        weight at every rank, and the rate follows from the weights and does
        not exceed the bound.

        Raises
        ------
        PlanError
            Naming the first violation.
        """
        n = self.topology.n
        if self.collective not in COLLECTIVES:
            raise PlanError(f"unknown collective {self.collective!r}; expected one of {COLLECTIVES}")
        if not self.trees:
            raise PlanError("a plan needs at least one tree")
        graph = self.topology.link_graph(self.link_kinds)
        load = np.zeros(len(graph.arcs))
        for i, tree in enumerate(self.trees):
            where = f"tree {i} (root {tree.root})"
            if not tree.weight > 0:
                raise PlanError(f"{where}: weight must be positive, got {tree.weight}")
            if self.collective != "allreduce" and tree.root != self.root:
                raise PlanError(f"{where}: a {self.collective} tree must be rooted at {self.root}")
            reached, parent = {tree.root}, {}
            for (p, c) in tree.edges:
                if c in parent or c == tree.root or not 0 <= c < n or not 0 <= p < n:
                    raise PlanError(f"{where}: edge {p}->{c} is not a tree edge over ranks 0..{n - 1}")
                parent[c] = p
            children = defaultdict(list)
            for p, c in tree.edges:
                children[p].append(c)
            stack = [tree.root]
            while stack:
                for c in children[stack.pop()]:
                    reached.add(c)
                    stack.append(c)
            if len(reached) != n or not 0 <= tree.root < n:
                raise PlanError(f"{where}: does not span the ranks; unreached {sorted(set(range(n)) - reached)}")
            if len(tree.paths) != len(tree.edges):
                raise PlanError(f"{where}: {len(tree.paths)} paths for {len(tree.edges)} edges")
            for (p, c), path in zip(tree.edges, tree.paths):
                if path[0] != p or path[-1] != c or any(x < n for x in path[1:-1]):
                    raise PlanError(f"{where}: path {list(path)} does not join {p} to {c} through switches")
                for x, y in zip(path, path[1:]):
                    if (x, y) not in graph.index:
                        raise PlanError(f"{where}: path {list(path)} uses {x}-{y}, which has no "
                                        f"{'/'.join(self.link_kinds)} link")
            load += tree.weight * graph.usage(tree.edges, tree.paths, _DIRECTIONS[self.collective])
        over = load - graph.capacity_gbps * (1 + 1e-9) - 1e-9
        if over.max(initial=0) > 0:
            a = int(np.argmax(over))
            u, v = graph.arcs[a]
            raise PlanError(f"link {u}->{v} carries {load[a]:.6g} GB/s, over its capacity "
                            f"{graph.capacity_gbps[a]:.6g} GB/s")
        if self.family == "rsag":
            per_root = np.zeros(n)
            for tree in self.trees:
                per_root[tree.root] += tree.weight
            if not np.allclose(per_root, per_root.mean(), rtol=_RATE_RTOL, atol=0):
                raise PlanError(f"rsag plan: ranks root unequal weights {per_root.tolist()}")
            rate = n * per_root.min()
        elif self.family == "tree":
            rate = sum(t.weight for t in self.trees)
        else:
            raise PlanError(f"unknown family {self.family!r}; expected 'tree' or 'rsag'")
        if not math.isclose(rate, self.rate_gbps, rel_tol=1e-9):
            raise PlanError(f"rate_gbps {self.rate_gbps} does not match the tree weights ({rate})")
        if self.rate_gbps > self.bound_gbps * (1 + _RATE_RTOL):
            raise PlanError(f"rate {self.rate_gbps} GB/s exceeds the certified bound {self.bound_gbps} GB/s")
        return self

    # --------------------------------------------------------------- output
    def to_dict(self) -> dict:
        return {"format": "jax_blink.plan", "version": FORMAT_VERSION,
                "collective": self.collective, "root": self.root, "family": self.family,
                "rate_gbps": self.rate_gbps, "bound_gbps": self.bound_gbps,
                "ring_rate_gbps": self.ring_rate_gbps, "plan_seconds": self.plan_seconds,
                "link_kinds": list(self.link_kinds), "topology": self.topology.to_dict(),
                "trees": [t.to_dict() for t in self.trees]}

    def to_json(self, indent=None) -> str:
        """JSON text that :meth:`from_json` reads back."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text) -> "Plan":
        """Load a plan from JSON text, a dict or a file path, and check its invariants."""
        d = read_document(text, fmt="jax_blink.plan", version=FORMAT_VERSION, error=PlanError,
                          what="plan")
        try:
            topology = Topology.from_json(d["topology"])
            result = cls(d["collective"], None if d["root"] is None else int(d["root"]), d["family"],
                         float(d["rate_gbps"]), float(d["bound_gbps"]), float(d["ring_rate_gbps"]),
                         tuple(Tree.from_dict(t) for t in d["trees"]), float(d["plan_seconds"]),
                         topology, tuple(d["link_kinds"]))
        except TopologyError as e:
            raise PlanError(f"malformed plan JSON: its topology: {e}") from None
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise PlanError(f"malformed plan JSON: {type(e).__name__}: {e}") from None
        return result.check()

    # -------------------------------------------------------------- lowering
    def chunks_for(self, size_bytes: int, launch_s: float = 0.0) -> list:
        """Pipeline chunks per tree from the alpha-beta model.

        A tree of depth ``D`` (both phases counted for allreduce) moving
        ``S`` bytes at ``R`` bytes/s in ``k`` chunks takes about
        ``(D + k - 1)(alpha + S / (k R))``, minimal at
        ``k = sqrt((D - 1) S / (alpha R))``; ``alpha`` is the largest
        :data:`ALPHA_SECONDS` of the link kinds the tree uses plus
        ``launch_s``, the executor's host cost per step
        (:data:`CUDA_LAUNCH_SECONDS` on GPUs). The result is rounded and
        clamped to ``[1, MAX_CHUNKS_PER_TREE]``.
        """
        total = sum(t.weight for t in self.trees)
        graph = self.topology.link_graph(self.link_kinds)
        out = []
        for tree in self.trees:
            depth = tree.depth * (2 if self.collective == "allreduce" else 1)
            kinds = {graph.arc_kind[graph.index[x, y]] for path in tree.paths for x, y in zip(path, path[1:])}
            alpha = launch_s + (max(ALPHA_SECONDS[k] for k in kinds) if kinds
                                else min(ALPHA_SECONDS.values()))
            share_bytes = size_bytes * tree.weight / total
            k = math.sqrt(max(depth - 1, 0) * share_bytes / (alpha * tree.weight * 1e9))
            out.append(int(min(max(round(k), 1), MAX_CHUNKS_PER_TREE)))
        return out

    def lower(self, size_bytes: int, dtype, chunks=None, launch_s: float = 0.0):
        """The :class:`~jax_blink.schedule.Schedule` moving ``size_bytes`` of ``dtype``.

        Parameters
        ----------
        size_bytes : int
            Message size; a positive multiple of the dtype's item size.
        dtype : str or numpy dtype
        chunks : int or sequence of int, optional
            Pipeline chunks per tree (one int for all, or one per tree);
            default: :meth:`chunks_for` (with ``launch_s``).
        launch_s : float
            The executor's host cost per pipeline step, for :meth:`chunks_for`.
        """
        from .schedule import DTYPES, dtype_name, lower_trees

        itemsize = DTYPES[dtype_name(dtype)][1]
        if isinstance(size_bytes, bool) or not isinstance(size_bytes, (int, np.integer)) \
                or size_bytes < itemsize or size_bytes % itemsize:
            raise PlanError(f"size_bytes must be a positive multiple of the {itemsize}-byte item size, "
                            f"got {size_bytes!r}")
        if chunks is None:
            chunks = self.chunks_for(int(size_bytes), launch_s)
        return lower_trees(self.trees, nranks=self.topology.n, collective=self.collective,
                           root=-1 if self.root is None else self.root, count=int(size_bytes) // itemsize,
                           dtype=dtype, chunks=chunks)

    def summary(self) -> str:
        """Human-readable description: rate against bound and ring, then the trees."""
        lines = [f"{self.collective} on {self.topology.name} ({self.topology.n} ranks)"
                 + (f", root {self.root}" if self.root is not None else "")
                 + f": family {self.family}, {len(self.trees)} tree(s) over {'/'.join(self.link_kinds)} links",
                 f"  rate {self.rate_gbps:.4g} GB/s   bound {self.bound_gbps:.4g} GB/s   "
                 f"ring {self.ring_rate_gbps:.4g} GB/s   planned in {self.plan_seconds * 1e3:.0f} ms"]
        for i, t in enumerate(self.trees):
            edges = " ".join(f"{p}->{c}" for p, c in t.edges)
            lines.append(f"  tree {i}: weight {t.weight:.4g} GB/s, root {t.root}, depth {t.depth}: {edges}")
        return "\n".join(lines)


# ====================================================================== solve
@dataclasses.dataclass
class _Column:
    root: int
    edges: tuple
    paths: tuple
    use: np.ndarray
    depth: int


def _orient(edges, paths, root):
    """Re-orient an undirected tree (edges with paths) away from ``root``."""
    adjacency = defaultdict(list)
    for (p, c), path in zip(edges, paths):
        adjacency[p].append((c, path))
        adjacency[c].append((p, path[::-1]))
    out_edges, out_paths, seen, frontier = [], [], {root}, [root]
    while frontier:
        nxt = []
        for v in frontier:
            for w, path in sorted(adjacency[v]):
                if w not in seen:
                    seen.add(w)
                    out_edges.append((v, w))
                    out_paths.append(path)
                    nxt.append(w)
        frontier = nxt
    return tuple(out_edges), tuple(out_paths)


class _Packer:
    """Column generation and tree minimisation for one family of one collective."""

    def __init__(self, graph: LinkGraph, collective: str, family: str, root: int | None):
        self.graph = graph
        self.n = graph.n
        self.collective = collective
        self.family = family
        self.root = root
        self.directions = _DIRECTIONS[collective]
        self.columns: list = []
        self.keys: set = set()

    # -- columns
    def add(self, root, edges, paths) -> bool:
        if self.family == "tree" and self.collective == "allreduce":
            # the reduction may end anywhere: root the tree at its centre
            root = min(range(self.n), key=lambda r: (_depth(r, _orient(edges, paths, r)[0]), r))
        edges, paths = _orient(edges, paths, root)
        key = (root if self.family == "rsag" or self.collective != "allreduce" else None,
               frozenset(zip(edges, paths)) if self.directions != "both"
               else frozenset(min(path, path[::-1]) for path in paths))  # routes matter, not direction
        if key in self.keys:
            return False
        self.keys.add(key)
        use = self.graph.usage(edges, paths, self.directions)
        self.columns.append(_Column(root, edges, paths, use, _depth(root, edges)))
        return True

    def seed(self):
        """Shallow starting columns: a breadth-first tree from each root."""
        routes = self.graph.routes(np.ones(len(self.graph.arcs)))
        roots = range(self.n) if self.collective == "allreduce" else [self.root]
        for r in roots:
            edges, paths, seen, frontier = [], [], {r}, [r]
            while frontier:
                nxt = []
                for v in frontier:
                    for w in range(self.n):
                        pair = (v, w) if self.directions != "up" else (w, v)
                        if w not in seen and pair in routes:
                            arcs = routes[pair][1]
                            path = self.graph.path_of(arcs)
                            seen.add(w)
                            edges.append((v, w))
                            paths.append(path if path[0] == v else path[::-1])
                            nxt.append(w)
                frontier = nxt
            self.add(r, tuple(edges), tuple(paths))

    def price(self, arc_price, root_price=None, tol=_PRICE_TOL) -> int:
        """Add the cheapest tree if its reduced cost is negative; return how many columns were added."""
        if self.collective == "allreduce":
            found = self.graph.cheapest_tree(arc_price, "both", 0)
        else:
            found = self.graph.cheapest_tree(arc_price, self.directions, self.root)
        cost, edges, paths = found
        added = 0
        if self.family == "rsag":
            for r in range(self.n):
                if cost < root_price[r] - tol:
                    added += self.add(r, tuple(edges), tuple(paths))
        elif cost < 1.0 - tol:
            added += self.add(self.root if self.root is not None else 0, tuple(edges), tuple(paths))
        return added

    # -- LPs
    def _matrix(self, columns):
        return np.column_stack([c.use for c in columns])

    def _root_matrix(self, columns):
        g = np.zeros((self.n, len(columns)))
        for j, c in enumerate(columns):
            g[c.root, j] = 1.0
        return g

    def solve_lp(self, columns, capacity_gbps=None):
        """Max rate over ``columns``: returns (rate, weights, arc duals, root duals)."""
        import cvxpy as cp

        w = cp.Variable(len(columns), nonneg=True)
        cap = self.graph.capacity_gbps if capacity_gbps is None else capacity_gbps
        capacity = self._matrix(columns) @ w <= cap
        if self.family == "rsag":
            t = cp.Variable()
            per_root = self._root_matrix(columns) @ w >= t / self.n
            problem = cp.Problem(cp.Maximize(t), [capacity, per_root])
        else:
            problem = cp.Problem(cp.Maximize(cp.sum(w)), [capacity])
        problem.solve(solver=cp.HIGHS)
        if problem.status != cp.OPTIMAL:
            raise PlanError(f"internal error: the tree-packing LP ended {problem.status}")
        root_price = np.asarray(per_root.dual_value) if self.family == "rsag" else None
        return (float(problem.value), np.maximum(np.asarray(w.value), 0.0),
                np.asarray(capacity.dual_value), root_price)

    def generate(self, capacity_gbps=None, max_rounds=500):
        """Column generation to LP optimality; returns (rate, weights of the columns, arc duals)."""
        if not self.columns:
            self.seed()
        for _ in range(max_rounds):
            rate, weights, arc_price, root_price = self.solve_lp(self.columns, capacity_gbps)
            if not self.price(arc_price, root_price):
                return rate, weights, arc_price
        raise PlanError(f"internal error: column generation did not converge in {max_rounds} rounds")

    def _propose(self, residual, rng):
        """A spanning tree over the widest residual arcs (ties broken at random), or None."""
        cap = self.graph.capacity_gbps
        excluded = 1e6
        root = 0 if self.collective == "allreduce" else self.root
        for level in np.unique(residual[residual > 1e-9 * cap.max()])[::-1]:
            price = np.where(residual >= level * (1 - 1e-9), rng.uniform(1.0, 2.0, len(cap)), excluded)
            cost, edges, paths = self.graph.cheapest_tree(price, self.directions, root)
            if cost < excluded:
                return root, tuple(edges), tuple(paths)
        return None

    def _oracle(self, residual):
        """Optimal rate on ``residual`` capacities by a closed form, with the
        tight cut: (rate, crossing mask, divisor), or None without one. The
        mask is over links for allreduce (one arc per link), else over arcs."""
        if self.family != "tree":
            return None
        if self.collective == "allreduce":
            if self.graph.has_switches or self.n > bounds.MAX_PARTITION_RANKS:
                return None
            value, mask, parts = bounds.min_partition(self.graph, residual)
            return value, mask[0::2], parts - 1.0
        value, mask = bounds.min_cut(self.graph, self.root, residual, toward_root=self.collective == "reduce")
        return value, mask, 1.0

    def carve(self, rate, tries=4):
        """Carve an optimal packing one heavy tree at a time (Edmonds / Nash-Williams style).

        Each step solves the LP on the residual capacities (adding columns
        as needed) and gives one of its heaviest trees the largest weight
        ``w`` for which the residual still carries the rest of ``rate``,
        checked exactly by min cut or min partition: the residual optimum is
        concave in ``w``, so Newton steps on the tight cut find it. Trees of
        an optimal LP solution cross every tight cut once, so each step makes
        progress. The trees carved this way usually number far fewer than a
        basic LP solution's. Does nothing where no closed form applies.
        """
        residual = self.graph.capacity_gbps.copy()
        remaining = rate
        tol = 1e-9 * rate
        if self._oracle(residual) is None:
            return
        step = slice(0, None, 2) if self.collective == "allreduce" else slice(None)
        while remaining > tol * 10:
            _, weights, _ = self.generate(residual)
            order = [j for j in np.argsort(-weights)[:tries] if weights[j] > tol]
            best = None
            for j in order:
                col = self.columns[j]
                use = col.use
                weight = min(float(np.min(residual[use > 0] / use[use > 0])), remaining)
                for _ in range(30):
                    value, mask, divisor = self._oracle(np.maximum(residual - weight * use, 0.0))
                    if value >= remaining - weight - tol:
                        break
                    # the tight cut is linear in the weight: (C - weight * U) / divisor
                    slope = float(use[step][mask].sum()) / divisor
                    cut_value = float(residual[step][mask].sum()) / divisor
                    weight = max(float(weights[j]), (cut_value - remaining) / (slope - 1.0)) \
                        if slope > 1.0 else float(weights[j])
                else:
                    weight = float(weights[j])
                if best is None or weight > best[0]:
                    best = (weight, use)
            if best is None:
                return
            weight, use = best
            residual = np.maximum(residual - weight * use, 0.0)
            remaining -= weight

    def widest(self, runs, seed=0):
        """Add trees of large weight: greedy packings of widest trees.

        Each run repeatedly takes a widest spanning tree of the residual
        capacities and subtracts it at its full width, until the residual
        graph no longer spans. Used where :meth:`carve` has no closed form.
        """
        rng = np.random.default_rng(seed)
        for _ in range(runs):
            residual = self.graph.capacity_gbps.copy()
            while (proposal := self._propose(residual, rng)) is not None:
                root, edges, paths = proposal
                use = self.graph.usage(edges, paths, self.directions)
                weight = float(np.min(residual[use > 0] / use[use > 0]))
                residual = np.maximum(residual - weight * use, 0.0)
                for r in (range(self.n) if self.family == "rsag" else [root]):
                    self.add(r, edges, paths)

    def minimise(self, target, max_trees):
        """Fewest (then shallowest) columns reaching ``target``; returns the chosen indices.

        With ``max_trees``, the rate is maximised under that count first and
        the target lowered to what it reaches.
        """
        import cvxpy as cp

        cols = self.columns
        m = len(cols)
        matrix = self._matrix(cols)
        big = np.array([np.min(self.graph.capacity_gbps[c.use > 0] / c.use[c.use > 0]) for c in cols])
        z = cp.Variable(m, boolean=True)
        w = cp.Variable(m, nonneg=True)
        base = [matrix @ w <= self.graph.capacity_gbps, w <= cp.multiply(big, z)]
        if max_trees is not None:
            base.append(cp.sum(z) <= max_trees)
        if self.family == "rsag":
            t = cp.Variable()
            base.append(self._root_matrix(cols) @ w >= t / self.n)
            rate = t
        else:
            rate = cp.sum(w)
        opts = dict(solver=cp.HIGHS, time_limit=_MILP_TIME_LIMIT_S)
        if max_trees is not None:
            best = cp.Problem(cp.Maximize(rate), base)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Solution may be inaccurate")
                best.solve(**opts)
            if best.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) or best.value is None:
                raise PlanError(f"internal error: the tree-count MILP ended {best.status}")
            target = min(target, float(best.value) * (1 - 1e-9))
        depth = np.array([c.depth for c in cols], dtype=float)
        epsilon = 1.0 / (m * (depth.max() + 1) + 1)  # depth only breaks ties of the count
        problem = cp.Problem(cp.Minimize(cp.sum(z) + epsilon * depth @ z), base + [rate >= target])
        with warnings.catch_warnings():  # a time-limited MILP keeps its best incumbent
            warnings.filterwarnings("ignore", message="Solution may be inaccurate")
            problem.solve(**opts)
        if z.value is None:
            raise PlanError(f"internal error: the tree-count MILP ended {problem.status}")
        return [j for j in range(m) if z.value[j] > 0.5]

    def finish(self, chosen):
        """Exact weights on the chosen columns; returns (rate, trees)."""
        cols = [self.columns[j] for j in chosen]
        rate, weights, _, _ = self.solve_lp(cols)
        # remove solver slop: scale into capacity, then equalise rsag roots
        load = self._matrix(cols) @ weights
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(load > 0, self.graph.capacity_gbps / load, np.inf)
        weights = weights * min(1.0, float(ratio.min()))
        if self.family == "rsag":
            per_root = self._root_matrix(cols) @ weights
            share = float(per_root.min())
            weights = weights * np.array([share / per_root[c.root] for c in cols])
        keep = [j for j, wt in enumerate(weights) if wt > 1e-9 * max(weights.max(), 1e-300)]
        trees = tuple(Tree(float(weights[j]), cols[j].root, cols[j].edges, cols[j].paths) for j in keep)
        if self.family == "rsag":
            rate = self.n * float(sum(t.weight for t in trees if t.root == 0))
        else:
            rate = float(sum(t.weight for t in trees))
        return rate, trees


def _pack(graph, collective, family, root, max_trees, tolerance):
    """Optimal rate, trees after minimisation, and final arc duals for one family."""
    packer = _Packer(graph, collective, family, root)
    lp_rate, _, arc_price = packer.generate()
    if family == "tree":  # rsag's per-root balance already forces one tree per rank
        packer.carve(lp_rate)
        packer.widest(runs=2)
    target = lp_rate * (1.0 - tolerance) * (1 - 1e-9)
    candidates = []
    for attempt in range(4):  # add columns until the MILP reaches the target
        candidates.append(packer.finish(packer.minimise(target, max_trees)))
        if candidates[-1][0] >= target or max_trees is None:
            break
        packer.widest(runs=2, seed=attempt + 1)
    if tolerance > 0 and max_trees is None:
        # the time-limited MILP may do better aiming at the optimum itself
        candidates.append(packer.finish(packer.minimise(lp_rate * (1 - 1e-9), None)))
    reaching = [c for c in candidates if c[0] >= target]
    best = (min(reaching, key=lambda c: (len(c[1]), -c[0])) if reaching
            else max(candidates, key=lambda c: (c[0], -len(c[1]))))
    return lp_rate, best[0], best[1], arc_price


def _bound(topology, graph, collective, root, arc_prices):
    """Certified upper bound: closed form where it applies, weak-duality bounds always."""
    directions = _DIRECTIONS[collective]
    candidates = [bounds.dual_bound(graph, y, directions, root) for y in arc_prices]
    if collective == "broadcast":
        candidates.append(bounds.broadcast_bound(graph, root))
    elif collective == "reduce":
        candidates.append(bounds.reduce_bound(graph, root))
    else:
        strength = bounds.tree_packing_bound(graph)
        if strength is not None:
            candidates.append(strength)
    return float(min(candidates))


# ====================================================================== cache
_MEMORY_CACHE: dict = {}


def cache_dir() -> Path:
    """Directory of the on-disk plan cache."""
    if os.environ.get("JAX_BLINK_CACHE_DIR"):
        return Path(os.environ["JAX_BLINK_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "jax_blink"
    return Path.home() / ".cache" / "jax_blink"


def clear_memory_cache() -> None:
    """Forget the plans cached in this process (the disk cache stays)."""
    _MEMORY_CACHE.clear()


def _cache_key(fingerprint, collective, root, max_trees, tolerance) -> str:
    options = {"cache_version": CACHE_VERSION, "plan_format": FORMAT_VERSION, "topology": fingerprint,
               "collective": collective, "root": root, "max_trees": max_trees, "tolerance": tolerance}
    return hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:32]


def _disk_load(path: Path, fingerprint: str):
    try:
        cached = Plan.from_json(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None  # missing or corrupt: plan afresh and overwrite
    return cached if cached.topology.fingerprint() == fingerprint else None


def _disk_store(path: Path, result: Plan) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".plan-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(result.to_json())
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs planning time


# ======================================================================= plan
def plan(topology: Topology, collective: str = "allreduce", root: int | None = None,
         max_trees: int | None = None, tolerance: float = 0.0, cache: bool = True) -> Plan:
    """Pack weighted spanning trees for ``collective`` on ``topology``.

    Parameters
    ----------
    topology : Topology
        At least two ranks, all joined by links.
    collective : {"allreduce", "broadcast", "reduce"}
    root : int, optional
        Root of a broadcast/reduce (default 0); must be None for allreduce.
    max_trees : int, optional
        Use at most this many trees (the rate may then fall below the bound).
    tolerance : float
        Accept a rate this fraction below the optimum if it saves trees
        (``0 <= tolerance < 1``).
    cache : bool
        Look up and store the plan in the process and disk caches.

    Returns
    -------
    Plan

    Raises
    ------
    PlanError
        For bad arguments or a topology whose ranks are not all connected.

    Examples
    --------
    >>> p = plan(Topology.preset("dgx1-v100"), "broadcast", root=0)
    >>> round(p.rate_gbps, 6), p.bound_gbps
    (150.0, 150.0)
    """
    if not isinstance(topology, Topology):
        raise PlanError(f"plan() needs a jax_blink.Topology, got {type(topology).__name__}")
    if collective not in COLLECTIVES:
        raise PlanError(f"unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")
    n = topology.n
    if n < 2:
        raise PlanError(f"{topology.name} has {n} rank; a collective needs no plan for one rank")
    if collective == "allreduce":
        if root is not None:
            raise PlanError(f"allreduce has no root; pass root=None (got {root!r})")
    else:
        root = 0 if root is None else root
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < n:
            raise PlanError(f"root {root!r} is out of range: {topology.name} has ranks 0..{n - 1}")
        root = int(root)
    if max_trees is not None and (isinstance(max_trees, bool) or not isinstance(max_trees, (int, np.integer))
                                  or max_trees < 1):
        raise PlanError(f"max_trees must be a positive integer or None, got {max_trees!r}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        raise PlanError(f"tolerance must be a number in [0, 1), got {tolerance!r}")
    max_trees = None if max_trees is None else int(max_trees)
    tolerance = float(tolerance)

    fingerprint = topology.fingerprint()
    key = _cache_key(fingerprint, collective, root, max_trees, tolerance)
    path = cache_dir() / f"plan-{key}.json"
    if cache:
        cached = _MEMORY_CACHE.get(key) or _disk_load(path, fingerprint)
        if cached is not None:
            _MEMORY_CACHE[key] = cached
            return cached if cached.topology is topology else dataclasses.replace(cached, topology=topology)

    result = _plan_uncached(topology, collective, root, max_trees, tolerance)
    if cache:
        _MEMORY_CACHE[key] = result
        _disk_store(path, result)
    return result


def _plan_uncached(topology, collective, root, max_trees, tolerance) -> Plan:
    import cvxpy  # noqa: F401  (imported here, once per process, so plan_seconds is planning only)
    import networkx  # noqa: F401

    start = time.perf_counter()
    unreachable = topology.unreachable()
    if unreachable:
        raise PlanError(f"{topology.name} is disconnected: rank(s) {unreachable} cannot be reached from "
                        f"rank 0 over any link; add the missing links or plan on a connected subset")
    kinds = topology.planning_kinds()
    graph = topology.link_graph(kinds)
    # rsag needs a tree rooted at every rank
    rsag = collective == "allreduce" and (max_trees is None or max_trees >= topology.n)
    families = ("tree", "rsag") if rsag else ("tree",)
    results = {}
    for family in families:
        _, rate, trees, arc_price = _pack(graph, collective, family, root, max_trees, tolerance)
        results[family] = (rate, trees, arc_price)
    family = "tree"
    if "rsag" in results:
        tree_rate, rsag_rate = results["tree"][0], results["rsag"][0]
        tie = math.isclose(tree_rate, rsag_rate, rel_tol=_RATE_RTOL)
        rsag_depth = max(t.depth for t in results["rsag"][1])
        tree_depth = max(t.depth for t in results["tree"][1])
        if rsag_rate > tree_rate and not tie or tie and rsag_depth <= tree_depth:
            family = "rsag"
    rate, trees, _ = results[family]
    bound = _bound(topology, graph, collective, root, [r[2] for r in results.values()])
    rings = bounds.best_rings(topology)
    result = Plan(collective, root, family, rate, bound, rings.rate_gbps(collective), trees,
                  time.perf_counter() - start, topology, kinds)
    return result.check()
