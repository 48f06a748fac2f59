"""Packing spanning trees: the tree-packing LP solved exactly by column generation.

A :class:`Packer` holds the candidate trees (columns) of one family of one
collective on a :class:`~jax_blink.topo.LinkGraph`. The restricted master LP
(cvxpy + HiGHS) maximises the rate over the columns under arc capacities;
its duals price a new column, the cheapest spanning tree or arborescence
under them (:meth:`~jax_blink.topo.LinkGraph.cheapest_tree`); when no tree
has negative reduced cost the LP is optimal.

Families: ``"tree"`` packs trees of one root (broadcast, reduce) or
undirected trees (allreduce), and maximises their total weight. ``"rsag"``
packs trees rooted at every rank and maximises the rate ``N x`` such that
every rank roots a total weight of at least ``x``: for allreduce the trees
are undirected (one cheapest tree prices every root), for reduce-scatter and
all-gather they are arborescences into or out of their root (each root is
priced with its own cheapest arborescence), ForestColl's packing.
``"split"`` (allreduce on links whose directions differ) packs
arborescences into each rank (reduce) and out of it (broadcast) as separate
columns and maximises the reduced weight, every rank broadcasting at least
what it reduces: with arc prices ``y`` and root prices ``π >= 0``, a reduce
tree into ``r`` prices at ``1 - π_r``, a broadcast tree out of ``r`` at
``π_r``. :func:`pair_split` pairs the two kinds into allreduce trees.
:meth:`Packer.carve` and :meth:`Packer.widest` add heavy trees, so that few
columns reach the optimum.

Pure Python: never imports jax.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np

from ..topo import LinkGraph
from . import bounds
from .collectives import DIRECTIONS
from .errors import PlanError
from .solver import solve
from .tree import Tree, tree_depth

__all__ = ["Packer", "Column", "orient", "pair_split", "PRICE_TOL"]

#: Column generation stops when no tree is this much cheaper than 1.
PRICE_TOL = 1e-7
#: The price of an arc no tree may use (far above any tree's reduced-cost limit).
EXCLUDED_PRICE = 1e6
#: Columns the ``"tree"`` family prices per round of column generation. One a round,
#: planning a whole DGX-1's broadcast took 0.56-0.76 s (about 200 LPs); three: 0.32-0.37 s
#: and no more trees (broadcasts from ranks 0 and 3 and the allreduce of the whole DGX-1s
#: and of every fourth 6-GPU DGX-1 V100 allocation: 205 trees instead of 221; ad hoc, 2-core
#: AMD EPYC).
TREE_COLUMNS_PER_ROUND = 3


@dataclasses.dataclass
class Column:
    """A candidate tree: its root, edges and routes, how often it crosses each arc, its depth,
    and (``"split"`` family) whether it reduces (``"up"``) or broadcasts (``"down"``)."""

    root: int
    edges: tuple
    paths: tuple
    use: np.ndarray
    depth: int
    direction: str = ""


def orient(edges, paths, root):
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


class Packer:
    """The candidate trees (columns) of one family of one collective, and the LP over them.

    :meth:`generate` solves the packing LP to optimality by column
    generation; :meth:`carve` and :meth:`widest` add heavy trees, which let
    :mod:`jax_blink.planning.fewest` reach the optimum with few trees.

    Attributes
    ----------
    graph : LinkGraph
    collective, family : str
    root : int or None
    directions : str
        Arc directions a tree loads (:data:`~jax_blink.planning.collectives.DIRECTIONS`);
        ``"split"`` for the ``"split"`` family, whose columns each load one direction.
    columns : list of Column
    """

    def __init__(self, graph: LinkGraph, collective: str, family: str, root: int | None):
        self.graph = graph
        self.n = graph.n
        self.collective = collective
        self.family = family
        self.root = root
        self.directions = "split" if family == "split" else DIRECTIONS[collective]
        self.columns: list = []
        self.keys: set = set()

    # -- columns
    def add(self, root, edges, paths, direction=None) -> bool:
        """Add a tree as a column unless an equivalent one is there; return whether it was added.

        ``direction`` (``"up"`` or ``"down"``) is the kind of a ``"split"`` column.
        """
        if self.family == "split":
            key = (root, direction, frozenset(zip(edges, paths)))
            if key in self.keys:
                return False
            self.keys.add(key)
            self.columns.append(Column(root, tuple(edges), tuple(paths), self.graph.usage(edges, paths, direction),
                                       tree_depth(root, edges), direction))
            return True
        if self.family == "tree" and self.collective == "allreduce":
            # the reduction may end anywhere: root the tree at its centre
            root = min(range(self.n), key=lambda r: (tree_depth(r, orient(edges, paths, r)[0]), r))
        edges, paths = orient(edges, paths, root)
        key = (root if self.family == "rsag" or self.collective != "allreduce" else None,
               frozenset(zip(edges, paths)) if self.directions != "both"
               else frozenset(min(path, path[::-1]) for path in paths))  # routes matter, not direction
        return self._keep(key, root, edges, paths)

    def _keep(self, key, root, edges, paths) -> bool:
        """Adds the oriented tree as a column unless one with ``key`` is there already."""
        if key in self.keys:
            return False
        self.keys.add(key)
        use = self.graph.usage(edges, paths, self.directions)
        self.columns.append(Column(root, edges, paths, use, tree_depth(root, edges)))
        return True

    def seed(self):
        """Shallow starting columns: a breadth-first tree from each root."""
        routes = self.graph.routes(np.ones(len(self.graph.arcs)))
        roots = range(self.n) if self.root is None else [self.root]
        kinds = ("up", "down") if self.family == "split" else (self.directions,)
        for r in roots:
            for direction in kinds:
                edges, paths, seen, frontier = [], [], {r}, [r]
                while frontier:
                    nxt = []
                    for v in frontier:
                        for w in range(self.n):
                            pair = (v, w) if direction != "up" else (w, v)
                            if w not in seen and pair in routes:
                                arcs = routes[pair][1]
                                path = self.graph.path_of(arcs)
                                seen.add(w)
                                edges.append((v, w))
                                paths.append(path if path[0] == v else path[::-1])
                                nxt.append(w)
                    frontier = nxt
                self.add(r, tuple(edges), tuple(paths), direction)

    def price(self, arc_price, root_price=None, tol=PRICE_TOL) -> int:
        """Add the cheapest trees if their reduced cost is negative (for ``"rsag"``, the cheapest
        tree of each root whose price it undercuts; for ``"split"``, the cheapest reduce and
        broadcast trees of each root that undercut ``1 - π_r`` and ``π_r``); return how many
        columns were added."""
        if self.family == "split":
            added = 0
            for direction, limit in (("up", 1.0 - root_price), ("down", root_price)):
                found = self.graph.cheapest_trees(arc_price, direction, range(self.n))
                added += sum(self.add(r, tuple(edges), tuple(paths), direction)
                             for r, (cost, edges, paths) in enumerate(found) if cost < limit[r] - tol)
            return added
        if self.family == "rsag":  # a column for every root whose price its cheapest tree undercuts
            if self.directions == "both":  # one undirected tree, rooted anywhere
                found = self.graph.cheapest_trees(arc_price, "both", [0]) * self.n
            else:
                found = self.graph.cheapest_trees(arc_price, self.directions, range(self.n))
            return sum(self.add(r, tuple(edges), tuple(paths))
                       for r, (cost, edges, paths) in enumerate(found) if cost < root_price[r] - tol)
        # up to TREE_COLUMNS_PER_ROUND trees that undercut 1 at the duals: the cheapest, then
        # the cheapest with the arcs of those found priced up by the duals' mean (other trees)
        root = self.root if self.root is not None else 0
        y = np.asarray(arc_price, dtype=float)
        priced, added = y, 0
        open_arcs = y < EXCLUDED_PRICE
        bump = max(float(y[open_arcs].mean()) if open_arcs.any() else 0.0, 1e-3)
        for _ in range(TREE_COLUMNS_PER_ROUND):
            _, edges, paths = self.graph.cheapest_tree(priced, self.directions, root)
            use = self.graph.usage(edges, paths, self.directions)
            if float(y @ use) >= 1.0 - tol:
                break
            added += self.add(root, tuple(edges), tuple(paths))
            priced = priced + bump * (use > 0)
        return added

    # -- LPs
    def matrix(self, columns):
        """Arc-by-column usage matrix."""
        return np.column_stack([c.use for c in columns])

    def root_matrix(self, columns):
        """Rank-by-column indicator of the columns' roots."""
        g = np.zeros((self.n, len(columns)))
        for j, c in enumerate(columns):
            g[c.root, j] = 1.0
        return g

    def balance_matrix(self, columns):
        """``"split"``: rank-by-column, +1 for a reduce tree into the rank, -1 for a broadcast tree
        out of it (a rank broadcasts at least what it reduces: ``balance @ w <= 0``)."""
        g = np.zeros((self.n, len(columns)))
        for j, c in enumerate(columns):
            g[c.root, j] = 1.0 if c.direction == "up" else -1.0
        return g

    def rate_vector(self, columns):
        """What each column's weight adds to the rate: 1, or for ``"split"`` 1 for reduce trees only."""
        return np.array([0.0 if c.direction == "down" else 1.0 for c in columns])

    def solve_lp(self, columns, capacity_gbps=None):
        """Max rate over ``columns``: returns (rate, weights, arc duals, root duals).

        The LP is solved on capacities divided by a scale, so that the
        solver's absolute tolerances are relative to the rate: first the
        largest capacity, and again by the rate found where that rate is
        much smaller (a slow link is the bottleneck). The duals do not
        depend on the scale.
        """
        cap = self.graph.capacity_gbps if capacity_gbps is None else np.asarray(capacity_gbps, dtype=float)
        scale = float(cap.max(initial=0.0)) or 1.0
        rate, weights, arc_price, root_price = self._solve_scaled(columns, cap, scale)
        if 0 < rate < 1e-3 * scale:
            rate, weights, arc_price, root_price = self._solve_scaled(columns, cap, rate)
        return rate, weights, arc_price, root_price

    def _solve_scaled(self, columns, cap, scale):
        import cvxpy as cp

        w = cp.Variable(len(columns), nonneg=True)
        capacity = self.matrix(columns) @ w <= cap / scale
        if self.family == "rsag":
            t = cp.Variable()
            per_root = self.root_matrix(columns) @ w >= t / self.n
            problem = cp.Problem(cp.Maximize(t), [capacity, per_root])
        elif self.family == "split":
            per_root = self.balance_matrix(columns) @ w <= 0
            problem = cp.Problem(cp.Maximize(self.rate_vector(columns) @ w), [capacity, per_root])
        else:
            problem = cp.Problem(cp.Maximize(cp.sum(w)), [capacity])
        solve(problem)
        if problem.status != cp.OPTIMAL:
            raise PlanError(f"internal error: the tree-packing LP ended {problem.status}")
        root_price = np.asarray(per_root.dual_value) if self.family in ("rsag", "split") else None
        return (float(problem.value) * scale, np.maximum(np.asarray(w.value), 0.0) * scale,
                np.asarray(capacity.dual_value), root_price)

    def generate(self, capacity_gbps=None, max_rounds=500):
        """Column generation to LP optimality; returns (rate, weights of the columns, arc duals)."""
        if not self.columns:
            self.seed()
        # an arc left with no capacity (carved to below 1e-9 of its own) carries no tree: its
        # dual may be raised at will (the LP stays optimal, the duals feasible), so priced high
        # it keeps pricing from proposing trees that can only get weight 0 (on a carved
        # residual most rounds did: about 60 a step, 2-5 s per broadcast plan of a DGX-1)
        closed = (np.zeros(len(self.graph.arcs), dtype=bool) if capacity_gbps is None
                  else np.asarray(capacity_gbps, dtype=float) <= 1e-9 * self.graph.capacity_gbps)
        for _ in range(max_rounds):
            rate, weights, arc_price, root_price = self.solve_lp(self.columns, capacity_gbps)
            if not self.price(np.where(closed, EXCLUDED_PRICE, arc_price), root_price):
                return rate, weights, arc_price
        raise PlanError(f"internal error: column generation did not converge in {max_rounds} rounds")

    def _propose(self, residual, rng, root):
        """A spanning tree from ``root`` over the widest residual arcs (ties broken at random), or None."""
        cap = self.graph.capacity_gbps
        excluded = EXCLUDED_PRICE
        for level in np.unique(residual[residual > 1e-9 * cap.max()])[::-1]:
            price = np.where(residual >= level * (1 - 1e-9), rng.uniform(1.0, 2.0, len(cap)), excluded)
            cost, edges, paths = self.graph.cheapest_tree(price, self.directions, root)
            if cost < excluded:
                return tuple(edges), tuple(paths)
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
        basic LP solution's.

        Returns
        -------
        list of int or None
            The indices of the carved columns where they carry all of
            ``rate`` (a packing for :func:`~jax_blink.planning.fewest.exact_weights`,
            which the time-limited tree-count MILP may not find among
            hundreds of columns), else None; None also where no closed form
            applies (nothing is carved).
        """
        residual = self.graph.capacity_gbps.copy()
        remaining = rate
        tol = 1e-9 * rate
        if self._oracle(residual) is None:
            return None
        step = slice(0, None, 2) if self.collective == "allreduce" else slice(None)

        def per_link(capacity):  # allreduce trees load both directions: a link holds its smaller one
            return np.minimum(capacity[0::2], capacity[1::2]) if self.collective == "allreduce" else capacity
        carved = []
        while remaining > tol * 10:
            try:
                _, weights, _ = self.generate(residual)
            except PlanError:
                # on a nearly exhausted residual the duals can be noisy enough that pricing
                # keeps finding "new" trees of equal cost; carving only adds columns, so stop
                # here: the trees found so far stay candidates for the tree-count MILP
                return None
            order = [j for j in np.argsort(-weights)[:tries] if weights[j] > tol]
            best = None
            for j in order:
                use = self.columns[j].use
                weight = min(float(np.min(residual[use > 0] / use[use > 0])), remaining)
                for _ in range(30):
                    value, mask, divisor = self._oracle(np.maximum(residual - weight * use, 0.0))
                    if value >= remaining - weight - tol:
                        break
                    # the tight cut is linear in the weight: (C - weight * U) / divisor
                    slope = float(use[step][mask].sum()) / divisor
                    cut_value = float(per_link(residual)[mask].sum()) / divisor
                    weight = max(float(weights[j]), (cut_value - remaining) / (slope - 1.0)) \
                        if slope > 1.0 else float(weights[j])
                else:
                    weight = float(weights[j])
                if best is None or weight > best[0]:
                    best = (weight, int(j))
            if best is None:
                return None
            weight, j = best
            residual = np.maximum(residual - weight * self.columns[j].use, 0.0)
            remaining -= weight
            carved.append(j)
        return sorted(set(carved))

    def widest(self, runs, seed=0):
        """Add trees of large weight: greedy packings of widest trees.

        Each run repeatedly takes a widest spanning tree of the residual
        capacities and subtracts it at its full width, until the residual
        graph no longer spans; with directed trees rooted at every rank
        (reduce-scatter, all-gather) the roots take turns. Used where
        :meth:`carve` has no closed form.
        """
        rng = np.random.default_rng(seed)
        each_root = self.family == "rsag" and self.directions != "both"
        roots = list(range(self.n)) if each_root else [self.root if self.root is not None else 0]
        for _ in range(runs):
            residual = self.graph.capacity_gbps.copy()
            turn = 0
            while (proposal := self._propose(residual, rng, roots[turn % len(roots)])) is not None:
                root = roots[turn % len(roots)]
                turn += 1
                edges, paths = proposal
                use = self.graph.usage(edges, paths, self.directions)
                weight = float(np.min(residual[use > 0] / use[use > 0]))
                residual = np.maximum(residual - weight * use, 0.0)
                for r in (range(self.n) if self.family == "rsag" and not each_root else [root]):
                    self.add(r, edges, paths)


def pair_split(columns, weights, tol: float = 1e-9) -> tuple:
    """Pair a ``"split"`` packing's reduce and broadcast trees into allreduce trees.

    For each root, its reduce trees and its broadcast trees each cover the
    root's reduced weight ``x_r`` (the broadcast side is trimmed to it) laid
    end to end; cutting ``[0, x_r)`` at both sides' boundaries gives pieces,
    each reduced up one reduce tree and broadcast down one broadcast tree.
    Every tree keeps its total weight, so the load on each arc is the
    packing's; a root with ``a`` reduce and ``b`` broadcast trees gets at most
    ``a + b - 1`` pieces.

    Returns
    -------
    tuple of Tree
        ``up_edges``/``up_paths`` set where the two trees of a piece differ.
    """
    by_root = defaultdict(lambda: {"up": [], "down": []})
    for column, weight in zip(columns, weights):
        if weight > 0:
            by_root[column.root][column.direction].append([float(weight), column])
    out = []
    for root in sorted(by_root):
        ups, downs = by_root[root]["up"], by_root[root]["down"]
        total = min(sum(w for w, _ in ups), sum(w for w, _ in downs))
        for side in (ups, downs):  # trim both sides to the root's reduced weight
            scale = total / sum(w for w, _ in side)
            for item in side:
                item[0] *= scale
        i = j = 0
        while i < len(ups) and j < len(downs):
            piece = min(ups[i][0], downs[j][0])
            up, down = ups[i][1], downs[j][1]
            if piece > tol * total:
                same = set(zip(up.edges, up.paths)) == set(zip(down.edges, down.paths))
                out.append(Tree(piece, root, down.edges, down.paths,
                                () if same else up.edges, () if same else up.paths))
            ups[i][0] -= piece
            downs[j][0] -= piece
            if ups[i][0] <= tol * total:
                i += 1
            if downs[j][0] <= tol * total:
                j += 1
    return tuple(out)
