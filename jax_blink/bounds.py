"""Certified upper bounds on collective throughput, and the ring baseline.

The bounds are computed without the planner's LP, so they certify its rate:

* broadcast / reduce from a root: ``min over v of maxflow(root, v)``
  (Edmonds; :func:`broadcast_bound`, :func:`reduce_bound`);
* allreduce by reduce-up/broadcast-down trees: the Nash-Williams/Tutte
  strength ``min over partitions P of c(δP) / (|P| - 1)``, exact by
  enumerating partitions (:func:`tree_packing_bound`). The reduce-scatter +
  all-gather family, where every rank roots the trees of its 1/N slice and
  each tree is also reduced up and broadcast down, loads each link by the
  same amount whatever the roots, so the same bound applies to it;
* any collective, any topology (switches included): weak LP duality turns
  any non-negative arc prices into a bound (:func:`dual_bound`), which is
  how a plan certifies itself where no closed form is tight.

:func:`best_rings` is the NCCL-style baseline: the best fractional packing of
directed Hamiltonian rings on the fast (NVLink) links.

Pure Python: never imports jax.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from .topology import FAST_KINDS, LinkGraph, Topology

__all__ = ["broadcast_bound", "reduce_bound", "tree_packing_bound", "dual_bound", "best_rings",
           "min_cut", "min_partition",
           "RingSet", "MAX_PARTITION_RANKS", "MAX_EXACT_RING_RANKS"]

#: Largest rank count for which :func:`tree_packing_bound` enumerates partitions.
MAX_PARTITION_RANKS = 10
#: Largest rank count for which :func:`best_rings` prices rings exactly (Held-Karp).
MAX_EXACT_RING_RANKS = 16


def _digraph(graph: LinkGraph):
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(range(graph.num_nodes))
    for (u, v), cap in zip(graph.arcs, graph.capacity_gbps):
        g.add_edge(u, v, capacity=float(cap))
    return g


def min_cut(graph: LinkGraph, root: int, capacity=None, toward_root: bool = False):
    """The smallest cut between ``root`` and another rank.

    Parameters
    ----------
    graph : LinkGraph
    root : int
    capacity : array_like, optional
        Arc capacities to use instead of ``graph.capacity_gbps``.
    toward_root : bool
        Cut flows into ``root`` (reduce) instead of out of it (broadcast).

    Returns
    -------
    (float, numpy.ndarray)
        The cut's capacity (``min over v of maxflow``) and a boolean mask of
        the arcs crossing it.
    """
    import networkx as nx

    capacity = graph.capacity_gbps if capacity is None else np.asarray(capacity, dtype=float)
    g = nx.DiGraph()
    g.add_nodes_from(range(graph.num_nodes))
    for (u, v), cap in zip(graph.arcs, capacity):
        g.add_edge(v, u, capacity=float(cap)) if toward_root else g.add_edge(u, v, capacity=float(cap))
    best = None
    for v in range(graph.n):
        if v != root:
            value, (side, _) = nx.minimum_cut(g, root, v)
            if best is None or value < best[0]:
                best = (value, side)
    value, side = best
    if toward_root:  # arcs of the original graph entering the root's side
        mask = np.array([v in side and u not in side for u, v in graph.arcs])
    else:
        mask = np.array([u in side and v not in side for u, v in graph.arcs])
    return float(value), mask


def broadcast_bound(graph: LinkGraph, root: int) -> float:
    """Edmonds' bound for broadcast from ``root``: ``min over ranks v of maxflow(root, v)`` in GB/s.

    Examples
    --------
    >>> from jax_blink.topology import Topology
    >>> t = Topology.from_links(3, [(0, 1, 10), (1, 2, 10), (0, 2, 5)])
    >>> broadcast_bound(t.link_graph(), 0)
    15.0
    """
    return min_cut(graph, root)[0]


def reduce_bound(graph: LinkGraph, root: int) -> float:
    """The bound for reduce to ``root``: ``min over ranks v of maxflow(v, root)`` in GB/s."""
    return min_cut(graph, root, toward_root=True)[0]


@functools.lru_cache(maxsize=None)
def _partitions(n: int) -> np.ndarray:
    """All set partitions of ``range(n)`` as restricted-growth label rows (Bell(n) x n)."""
    rows = []

    def grow(prefix, top):
        if len(prefix) == n:
            rows.append(prefix)
            return
        for label in range(top + 2):
            grow(prefix + (label,), max(top, label))

    grow((0,), 0)
    return np.asarray(rows, dtype=np.int8)


def min_partition(graph: LinkGraph, capacity=None):
    """The partition of the ranks minimising ``c(δP) / (|P| - 1)``.

    Only for graphs without switches and with at most
    :data:`MAX_PARTITION_RANKS` ranks (see :func:`tree_packing_bound`).

    Returns
    -------
    (float, numpy.ndarray, int)
        The strength, a boolean mask of the arcs (both directions) between
        parts, and the number of parts.
    """
    capacity = graph.capacity_gbps if capacity is None else np.asarray(capacity, dtype=float)
    labels = _partitions(graph.n)
    parts = labels.max(axis=1).astype(float) + 1.0
    links = range(0, len(graph.arcs), 2)  # one arc per link
    crossing = np.stack([labels[:, graph.arcs[a][0]] != labels[:, graph.arcs[a][1]] for a in links], axis=1)
    cut = crossing @ capacity[0::2]
    ratio = np.where(parts > 1, cut / np.maximum(parts - 1.0, 1.0), np.inf)
    best = int(np.argmin(ratio))
    mask = np.repeat(crossing[best], 2)
    return float(ratio[best]), mask, int(parts[best])


def tree_packing_bound(graph: LinkGraph) -> float | None:
    """Nash-Williams/Tutte strength of the rank graph, in GB/s.

    ``min over partitions P of c(δP) / (|P| - 1)``, where ``c(δP)`` sums the
    per-direction bandwidth of links between parts: the maximum total weight
    of undirected spanning trees each link can carry in both directions.
    Exact, by enumerating all partitions.

    Returns
    -------
    float or None
        None where the formula does not apply: the graph has switch nodes
        (a tree edge through a switch uses two ports, so partitions of ranks
        over-estimate) or more than :data:`MAX_PARTITION_RANKS` ranks.

    Examples
    --------
    >>> from jax_blink.topology import Topology
    >>> ring = Topology.from_links(4, [(0, 1, 10), (1, 2, 10), (2, 3, 10), (3, 0, 10)])
    >>> round(tree_packing_bound(ring.link_graph()), 6)  # 4 links / 3 edges per tree
    13.333333
    """
    if graph.has_switches or graph.n > MAX_PARTITION_RANKS or graph.n < 2:
        return None
    return min_partition(graph)[0]


def dual_bound(graph: LinkGraph, arc_price, directions: str, root: int | None = None) -> float:
    """Weak-duality bound from arbitrary non-negative arc prices ``y``, in GB/s.

    Every tree ``T`` of a packing costs at least ``m = min_T y·use(T)``, and
    the packing's load respects capacities, so its total weight is at most
    ``y·c / m``. This holds for any ``y >= 0``; prices from an optimal LP dual
    make it tight.

    Parameters
    ----------
    graph : LinkGraph
    arc_price : array_like
        One price per arc (negative entries are treated as 0).
    directions : str
        ``"both"`` (allreduce trees), ``"down"`` (broadcast) or ``"up"`` (reduce).
    root : int, optional
        Root for ``"down"`` / ``"up"``.
    """
    price = np.maximum(np.asarray(arc_price, dtype=float), 0.0)
    found = graph.cheapest_tree(price, directions, root)
    if found is None or found[0] <= 0:
        return float("inf")
    return float(price @ graph.capacity_gbps / found[0])


# --------------------------------------------------------------------- rings
@dataclasses.dataclass(frozen=True)
class RingSet:
    """A set of directed rings with the bandwidth each carries.

    Attributes
    ----------
    rings : tuple of tuple of int
        Each ring as a rank order ``(r0, r1, ..., r_{n-1})``: data flows
        ``r0 -> r1 -> ... -> r_{n-1} -> r0``.
    weights_gbps : tuple of float
        Bandwidth of each ring (GB/s per link direction it uses).
    nranks : int
    """

    rings: tuple
    weights_gbps: tuple
    nranks: int

    @property
    def total_gbps(self) -> float:
        """Sum of ring bandwidths: the bus bandwidth of ring allreduce."""
        return float(sum(self.weights_gbps))

    def rate_gbps(self, collective: str) -> float:
        """Algorithm bandwidth of the rings for ``collective``.

        Ring allreduce moves ``2(n-1)/n`` of the data over every ring link, so
        its algbw is ``total * n / (2(n-1))``; a broadcast or reduce pipelines
        along each ring (a chain), at ``total``. Zero without rings.
        """
        if not self.rings:
            return 0.0
        if collective == "allreduce":
            return self.total_gbps * self.nranks / (2.0 * (self.nranks - 1))
        return self.total_gbps


def _min_cycle(cost: np.ndarray):
    """Cheapest directed Hamiltonian cycle through 0 (Held-Karp), or None."""
    n = len(cost)
    if n == 2:
        total = cost[0, 1] + cost[1, 0]
        return (total, (0, 1)) if np.isfinite(total) else None
    m = n - 1
    full = 1 << m
    dp = np.full((full, m), np.inf)
    parent = np.full((full, m), -1, dtype=np.int64)
    for j in range(m):
        dp[1 << j, j] = cost[0, j + 1]
    masks = np.arange(full)
    popcount = np.array([bin(x).count("1") for x in range(full)])
    inner = cost[1:, 1:]
    for k in range(2, m + 1):
        layer = masks[popcount == k]
        for j in range(m):
            sel = layer[(layer >> j) & 1 == 1]
            cand = dp[sel ^ (1 << j), :] + inner[:, j][None, :]
            best = np.argmin(cand, axis=1)
            dp[sel, j] = cand[np.arange(len(sel)), best]
            parent[sel, j] = best
    closing = dp[full - 1, :] + cost[1:, 0]
    j = int(np.argmin(closing))
    if not np.isfinite(closing[j]):
        return None
    order, mask = [], full - 1
    while j >= 0:
        order.append(j + 1)
        j, mask = int(parent[mask, j]), mask ^ (1 << j)
    return float(closing[order[0] - 1]), tuple([0] + order[::-1])


def _greedy_cycle(cost: np.ndarray):
    """Cheapest nearest-neighbour cycle over all start ranks (for many ranks), or None."""
    n = len(cost)
    best = None
    for start in range(n):
        order, left, total = [start], set(range(n)) - {start}, 0.0
        while left:
            nxt = min(left, key=lambda v: cost[order[-1], v])
            total += cost[order[-1], nxt]
            order.append(nxt)
            left.remove(nxt)
        total += cost[order[-1], start]
        if np.isfinite(total) and (best is None or total < best[0]):
            i = order.index(0)
            best = (total, tuple(order[i:] + order[:i]))
    return best


def best_rings(topology: Topology, tolerance: float = 1e-9) -> RingSet:
    """The best NCCL-style rings on the fast links (NVLink, NVSwitch).

    Packs directed Hamiltonian rings fractionally (an LP solved by column
    generation with HiGHS; a new ring is the cheapest Hamiltonian cycle under
    the dual prices, exact by Held-Karp up to :data:`MAX_EXACT_RING_RANKS`
    ranks, nearest-neighbour beyond). A ring hop through a switch uses both
    ports. No ring exists (empty set, rate 0) when the fast links do not join
    the ranks in one cycle or there is a single rank.

    Returns
    -------
    RingSet
        ``rings`` as rank orders and ``weights_gbps`` per ring; use
        :meth:`RingSet.rate_gbps` for the collective's algbw.

    Examples
    --------
    >>> rs = best_rings(Topology.preset("dgx1-v100"))
    >>> round(rs.total_gbps, 6), round(rs.rate_gbps("allreduce"), 4)
    (150.0, 85.7143)
    """
    from scipy.optimize import linprog

    n = topology.n
    empty = RingSet((), (), n)
    if n < 2:
        return empty
    graph = topology.link_graph(FAST_KINDS)
    if not graph.arcs or topology.unreachable(FAST_KINDS):
        return empty
    price_cycle = _min_cycle if n <= MAX_EXACT_RING_RANKS else _greedy_cycle
    cap = graph.capacity_gbps
    columns = {}  # ring -> usage vector
    price = np.ones(len(graph.arcs))
    for _ in range(200):
        routes = graph.routes(price)
        cost = np.full((n, n), np.inf)
        for (u, v), (c, _) in routes.items():
            cost[u, v] = c
        found = price_cycle(cost)
        if found is None:
            return empty
        cycle_cost, ring = found
        if columns and cycle_cost >= 1.0 - tolerance:
            break
        use = np.zeros(len(graph.arcs))
        for u, v in zip(ring, ring[1:] + ring[:1]):
            for a in routes[u, v][1]:
                use[a] += 1
        if ring in columns:
            break
        columns[ring] = use
        matrix = np.column_stack(list(columns.values()))
        res = linprog(-np.ones(len(columns)), A_ub=matrix, b_ub=cap, bounds=(0, None), method="highs")
        price = np.maximum(-res.ineqlin.marginals, 0.0)
    weights = res.x
    keep = [i for i, w in enumerate(weights) if w > tolerance * cap.max()]
    rings = list(columns)
    return RingSet(tuple(rings[i] for i in keep), tuple(float(weights[i]) for i in keep), n)
