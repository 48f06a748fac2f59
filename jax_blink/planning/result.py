"""The result of planning: :class:`Plan`, its invariants, its JSON, and its lowering.

A :class:`Plan` holds the weighted spanning trees :func:`jax_blink.planning`
packed for one collective on one topology, with the rate they reach, the
certified bound and the ring baseline. It checks its own invariants
(:meth:`Plan.check`), dumps and loads as JSON, and lowers into a chunked,
pipelined :class:`~jax_blink.schedule.Schedule` with chunk counts from the
cost model (:mod:`jax_blink.planning.cost`).

Pure Python: never imports jax.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import defaultdict

import numpy as np

from .._jsonio import read_document
from ..schedule import DTYPES, dtype_name, lower_trees
from ..topo import LINK_KINDS, Topology, TopologyError
from . import cost
from .collectives import COLLECTIVES, DIRECTIONS, FAMILIES, FAMILY_TEXT, ROOTED, bus_factor
from .errors import PlanError
from .tree import Tree

__all__ = ["Plan", "FORMAT_VERSION", "RATE_RTOL"]

FORMAT_VERSION = 1
#: Relative tolerance of rate comparisons: ties, equal rsag roots, the certificate.
RATE_RTOL = 1e-6


@dataclasses.dataclass(frozen=True)
class Plan:
    """Weighted spanning trees for one collective on one topology.

    Attributes
    ----------
    collective : str
        One of :data:`~jax_blink.planning.collectives.COLLECTIVES`.
    root : int or None
        Root of a broadcast/reduce; None for the others.
    family : str
        ``"tree"``, ``"rsag"`` or ``"split"`` (allreduce; ``"split"`` trees
        reduce up their own ``up_edges``); ``"tree"`` for broadcast/reduce;
        ``"rsag"`` for reduce-scatter and all-gather (every rank roots trees of
        equal total weight for its own slice).
    rate_gbps : float
        Algorithm bandwidth (size / time, nccl-tests' algbw, see
        :mod:`~jax_blink.planning.collectives`) for large messages in the link model.
    bound_gbps : float
        Certified upper bound on any tree packing's rate for this collective
        over the same links.
    ring_rate_gbps : float
        Algorithm bandwidth of the best NCCL-style rings on the fast links
        (0 where they form no ring).  Rings never use slow links, whatever
        the plan's ``links``.
    trees : tuple of Tree
    plan_seconds : float
        Wall time the planning took (when it was computed, not looked up).
    topology : Topology
    link_kinds : tuple of str
        Link kinds the trees may use.
    note : str
        What the planner did with a request it could not take as asked
        (``plan(slow_ranks=...)``: whether the slow ranks are leaves); empty
        otherwise.
    slow_ranks : tuple of int
        The ranks ``plan(slow_ranks=...)`` was told arrive late, whether or
        not its trees could make them leaves: :meth:`lower` reduces them
        after every other child (``lower_trees``'s ``late``).
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
    note: str = ""
    slow_ranks: tuple = ()

    # ------------------------------------------------------------ invariants
    def check(self) -> "Plan":
        """Check the plan's invariants; return ``self``.

        The collective is known and planned with one of its families
        (:data:`~jax_blink.planning.collectives.FAMILIES`) and has a root
        exactly if it is a broadcast or reduce; every tree spans the ranks
        from its root along routes that exist (interior nodes are switches);
        no arc carries more than its capacity in the directions the
        collective loads (:data:`~jax_blink.planning.collectives.DIRECTIONS`);
        broadcast/reduce trees start at the root, ``"rsag"`` roots equal
        weight at every rank; and the rate follows from the weights and does
        not exceed the bound.

        Raises
        ------
        PlanError
            Naming the first violation.
        """
        n = self.topology.n
        if self.collective not in COLLECTIVES:
            raise PlanError(f"unknown collective {self.collective!r}; expected one of {', '.join(COLLECTIVES)}")
        if self.family not in FAMILIES[self.collective]:
            raise PlanError(f"a {self.collective} plan cannot have family {self.family!r}; expected "
                            f"{' or '.join(map(repr, FAMILIES[self.collective]))}")
        if (self.root is not None) != (self.collective in ROOTED):
            raise PlanError(f"a {self.collective} plan " + (f"needs a root, got {self.root!r}" if self.root is None
                                                             else f"has no root, got root {self.root!r}"))
        if not self.trees:
            raise PlanError("a plan needs at least one tree")
        if list(self.slow_ranks) != sorted(set(self.slow_ranks)) or any(
                not isinstance(r, int) or not 0 <= r < n for r in self.slow_ranks):
            raise PlanError(f"slow_ranks must be distinct ranks 0..{n - 1} in ascending order, "
                            f"got {list(self.slow_ranks)}")
        graph = self.topology.link_graph(self.link_kinds)
        load = np.zeros(len(graph.arcs))
        for i, tree in enumerate(self.trees):
            where = f"tree {i} (root {tree.root})"
            if not tree.weight > 0:
                raise PlanError(f"{where}: weight must be positive, got {tree.weight}")
            if self.root is not None and tree.root != self.root:
                raise PlanError(f"{where}: a {self.collective} tree must be rooted at {self.root}")
            if tree.up_edges and self.family != "split":
                raise PlanError(f"{where}: only a 'split' allreduce reduces up a tree of its own (up_edges); "
                                f"this is a {self.collective} plan of family {self.family!r}")
            _check_spanning(where, tree.root, tree.edges, tree.paths, n, graph)
            if tree.up_edges:
                _check_spanning(f"{where} reduce tree", tree.root, tree.up_edges, tree.up_paths, n, graph)
            if self.collective == "allreduce":  # reduced up one tree, broadcast down the same or another
                load += tree.weight * (graph.usage(tree.reduce_edges, tree.reduce_paths, "up")
                                       + graph.usage(tree.edges, tree.paths, "down"))
            else:
                load += tree.weight * graph.usage(tree.edges, tree.paths, DIRECTIONS[self.collective])
        over = load - graph.capacity_gbps * (1 + 1e-9)  # relative: capacities may be tiny
        if over.max(initial=0) > 0:
            a = int(np.argmax(over))
            u, v = graph.arcs[a]
            raise PlanError(f"link {u}->{v} carries {load[a]:.6g} GB/s, over its capacity "
                            f"{graph.capacity_gbps[a]:.6g} GB/s")
        if self.family == "rsag":
            per_root = np.zeros(n)
            for tree in self.trees:
                per_root[tree.root] += tree.weight
            if not np.allclose(per_root, per_root.mean(), rtol=RATE_RTOL, atol=0):
                raise PlanError(f"{self.collective} rsag plan: ranks root unequal weights {per_root.tolist()}")
            rate = n * per_root.min()
        else:
            rate = sum(t.weight for t in self.trees)
        if not math.isclose(rate, self.rate_gbps, rel_tol=1e-9):
            raise PlanError(f"rate_gbps {self.rate_gbps} does not match the tree weights ({rate})")
        if self.rate_gbps > self.bound_gbps * (1 + RATE_RTOL):
            raise PlanError(f"rate {self.rate_gbps} GB/s exceeds the certified bound {self.bound_gbps} GB/s")
        return self

    # --------------------------------------------------------------- output
    def to_dict(self) -> dict:
        return {"format": "jax_blink.plan", "version": FORMAT_VERSION,
                "collective": self.collective, "root": self.root, "family": self.family,
                "rate_gbps": self.rate_gbps, "bound_gbps": self.bound_gbps,
                "ring_rate_gbps": self.ring_rate_gbps, "plan_seconds": self.plan_seconds,
                "link_kinds": list(self.link_kinds), "topology": self.topology.to_dict(),
                "trees": [t.to_dict() for t in self.trees]} | ({"note": self.note} if self.note else {}) \
            | ({"slow_ranks": list(self.slow_ranks)} if self.slow_ranks else {})

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
                         topology, tuple(d["link_kinds"]), str(d.get("note", "")),
                         tuple(int(r) for r in d.get("slow_ranks", ())))
        except TopologyError as e:
            raise PlanError(f"malformed plan JSON: its topology: {e}") from None
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise PlanError(f"malformed plan JSON: {type(e).__name__}: {e}") from None
        return result.check()

    # -------------------------------------------------------------- lowering
    def chunks_for(self, size_bytes: int, launch_s: float = 0.0) -> list:
        """Pipeline chunks per tree from the cost model.

        Each tree gets :func:`jax_blink.planning.cost.pipeline_chunks` for its
        depth (both phases counted for allreduce), its share of
        ``size_bytes`` (``weight / sum of weights``: for reduce-scatter and
        all-gather, its part of its root's ``1/N`` slice) and its weight as
        bandwidth, with ``alpha`` the largest
        :data:`~jax_blink.planning.cost.LATENCY_US` of the link kinds the tree
        uses plus ``launch_s``, the executor's host cost per step
        (:data:`~jax_blink.planning.cost.CUDA_LAUNCH_SECONDS` on GPUs), clamped
        to ``[1, MAX_CHUNKS_PER_TREE]``.
        """
        total = sum(t.weight for t in self.trees)
        graph = self.topology.link_graph(self.link_kinds)
        out = []
        for tree in self.trees:
            depth = tree.round_trip if self.collective == "allreduce" else tree.depth
            kinds = {graph.arc_kind[graph.index[x, y]]
                     for path in tree.paths + tree.up_paths for x, y in zip(path, path[1:])}
            alpha = launch_s + (max(cost.latency_s(k) for k in kinds) if kinds
                                else min(cost.latency_s(k) for k in cost.LATENCY_US))
            out.append(cost.pipeline_chunks(depth, size_bytes * tree.weight / total, tree.weight, alpha,
                                            cost.MAX_CHUNKS_PER_TREE))
        return out

    def lower(self, size_bytes: int, dtype, chunks=None, launch_s: float = 0.0, op: str = "sum"):
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
        op : str
            ``"sum"``, ``"max"`` or ``"min"``: what the schedule's reductions
            compute (``size_bytes`` is the full vector: count * itemsize).
        """
        itemsize = DTYPES[dtype_name(dtype)][1]
        if isinstance(size_bytes, bool) or not isinstance(size_bytes, (int, np.integer)) \
                or size_bytes < itemsize or size_bytes % itemsize:
            raise PlanError(f"size_bytes must be a positive multiple of the {itemsize}-byte item size, "
                            f"got {size_bytes!r}")
        if chunks is None:
            chunks = self.chunks_for(int(size_bytes), launch_s)
        return lower_trees(self.trees, nranks=self.topology.n, collective=self.collective,
                           root=-1 if self.root is None else self.root, count=int(size_bytes) // itemsize,
                           dtype=dtype, chunks=chunks, routes=[t.paths for t in self.trees], op=op,
                           late=self.slow_ranks)

    @property
    def busbw_gbps(self) -> float:
        """nccl-tests' bus bandwidth of :attr:`rate_gbps`
        (:func:`~jax_blink.planning.collectives.bus_factor`)."""
        return self.rate_gbps * bus_factor(self.collective, self.topology.n)

    def rate_by_kind(self) -> dict:
        """How much of :attr:`rate_gbps` each link kind carries, in GB/s.

        Every tree of weight ``w`` moves ``w`` GB/s over each of its
        rank-to-rank edges (a ``"split"`` tree over those of its reduce tree
        and of its broadcast tree); an edge counts for the kind of its route (a
        route mixing kinds, e.g. PCIe then a NIC, counts for its slowest
        class in :data:`~jax_blink.topo.LINK_KINDS` order). The values are
        ``sum over trees of w * (edges of the kind) / (edges)``, so they add
        up to the rate. Kinds the plan does not use are left out.

        Examples
        --------
        >>> from jax_blink.planning import plan
        >>> p = plan(Topology.preset("dgx1-v100"))
        >>> {k: round(v, 2) for k, v in p.rate_by_kind().items()}  # doctest: +SKIP
        {'nvlink': 85.71, 'pcie': 9.14}
        """
        graph = self.topology.link_graph(self.link_kinds)
        out = {}
        for tree in self.trees:
            paths = tree.paths + tree.up_paths
            for path in paths:
                kinds = {graph.arc_kind[graph.index[x, y]] for x, y in zip(path, path[1:])}
                kind = max(kinds, key=LINK_KINDS.index)
                out[kind] = out.get(kind, 0.0) + tree.weight / len(paths)
        return {k: out[k] for k in LINK_KINDS if k in out}

    def links_text(self) -> str:
        """``"nvlink 85.71 GB/s (90%), pcie 9.143 GB/s (10%)"``: :meth:`rate_by_kind` as text."""
        total = sum(self.rate_by_kind().values()) or 1.0
        return ", ".join(f"{k} {v:.4g} GB/s ({100 * v / total:.0f}%)" for k, v in self.rate_by_kind().items())

    def ring_text(self) -> str:
        """``"ring 85.7 GB/s"``, or ``"no NVLink/NVSwitch ring"`` where the fast
        links join the ranks in no ring (the rings' rate is 0)."""
        if self.ring_rate_gbps > 0:
            return f"ring {self.ring_rate_gbps:.4g} GB/s"
        return "no NVLink/NVSwitch ring"

    def family_text(self) -> str:
        """The family with what it means for the collective
        (:data:`~jax_blink.planning.collectives.FAMILY_TEXT`), e.g.
        ``"rsag (every rank roots out-trees sending its own 1/N slice)"``."""
        return f"{self.family} ({FAMILY_TEXT.get((self.collective, self.family), self.family)})"

    def summary(self) -> str:
        """Human-readable description: rate against bound and ring, then the trees."""
        lines = [f"{self.collective} on {self.topology.name} ({self.topology.n} ranks)"
                 + (f", root {self.root}" if self.root is not None else "")
                 + f": family {self.family_text()}, {len(self.trees)} tree(s) over "
                 + f"{'/'.join(self.link_kinds)} links",
                 f"  rate {self.rate_gbps:.4g} GB/s (busbw {self.busbw_gbps:.4g})   bound {self.bound_gbps:.4g} GB/s   "
                 f"{self.ring_text()}   planned in {self.plan_seconds * 1e3:.0f} ms",
                 f"  rate by link kind: {self.links_text()}"] + ([f"  {self.note}"] if self.note else [])
        for i, t in enumerate(self.trees):
            edges = " ".join(f"{p}->{c}" for p, c in t.edges)
            lines.append(f"  tree {i}: weight {t.weight:.4g} GB/s, root {t.root}, depth {t.depth}: {edges}")
            if t.up_edges:
                up = " ".join(f"{c}->{p}" for p, c in t.up_edges)
                lines.append(f"          reduced up another tree first: {up}")
        return "\n".join(lines)


def _check_spanning(where, root, edges, paths, n, graph):
    """``edges`` form a tree spanning ranks ``0..n-1`` from ``root``, joined by ``paths`` through switches."""
    reached, parent = {root}, {}
    for (p, c) in edges:
        if c in parent or c == root or not 0 <= c < n or not 0 <= p < n:
            raise PlanError(f"{where}: edge {p}->{c} is not a tree edge over ranks 0..{n - 1}")
        parent[c] = p
    children = defaultdict(list)
    for p, c in edges:
        children[p].append(c)
    stack = [root]
    while stack:
        for c in children[stack.pop()]:
            reached.add(c)
            stack.append(c)
    if len(reached) != n or not 0 <= root < n:
        raise PlanError(f"{where}: does not span the ranks; unreached {sorted(set(range(n)) - reached)}")
    if len(paths) != len(edges):
        raise PlanError(f"{where}: {len(paths)} paths for {len(edges)} edges")
    for (p, c), path in zip(edges, paths):
        if path[0] != p or path[-1] != c or any(x < n for x in path[1:-1]):
            raise PlanError(f"{where}: path {list(path)} does not join {p} to {c} through switches")
        try:
            graph.arcs_of_path(path)
        except TopologyError as e:
            raise PlanError(f"{where}: {e}") from None
