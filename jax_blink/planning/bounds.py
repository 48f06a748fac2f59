"""Certified upper bounds on collective throughput, computed without the planner's LP.

The bounds are computed without the planner's LP, so they certify its rate:

* broadcast / reduce from a root: ``min over v of maxflow(root, v)``
  (Edmonds; :func:`broadcast_bound`, :func:`reduce_bound`);
* allreduce by reduce-up/broadcast-down trees: the Nash-Williams/Tutte
  strength ``min over partitions P of c(δP) / (|P| - 1)``, exact by
  enumerating partitions (:func:`tree_packing_bound`). The reduce-scatter +
  all-gather family, where every rank roots the trees of its 1/N slice and
  each tree is also reduced up and broadcast down, loads each link by the
  same amount whatever the roots, so the same bound applies to it;
* all-gather and reduce-scatter (ForestColl): every rank ``r`` roots trees
  of weight ``x`` carrying its own ``1/N`` slice, so for every node set
  ``S`` (switches included) holding some but not all ranks, the slices of
  the ranks in ``S`` must leave it (all-gather) or the contributions to them
  enter it (reduce-scatter): ``|S ∩ R| x <= c(δ⁺S)`` (or ``c(δ⁻S)``). The
  rate ``N x`` is at most ``N min_S c(δS) / |S ∩ R|``, exact for every size
  by a ratio search over max flows (:func:`shard_bound`, :func:`min_shard_cut`);
* allreduce by the ``"split"`` family (reduce trees into a root, other
  broadcast trees out of it; planned where some link's two directions
  differ, and reaching the families above where none does): every node set
  ``S`` holding some but not all ranks is left once by each reduce tree into
  a root outside ``S`` and by each broadcast tree out of a root inside it, so
  the rate is at most ``min_S c(δ⁺S)``, the smallest max flow between two
  ranks (:func:`split_cut_bound`). The strength above bounds only trees
  that load both directions of a link alike, so it is not used there;
* any collective, any topology (switches included): weak LP duality turns
  any non-negative arc prices into a bound (:func:`dual_bound`), which is
  how a plan certifies itself where no closed form is tight.

:func:`certified_bound` combines them into the bound a plan reports.

Pure Python: never imports jax.
"""

from __future__ import annotations

import collections
import functools

import numpy as np

from ..topo import LinkGraph
from .collectives import DIRECTIONS
from .errors import PlanError

__all__ = ["broadcast_bound", "reduce_bound", "tree_packing_bound", "shard_bound", "dual_bound",
           "certified_bound", "max_flow", "min_cut", "min_partition", "min_shard_cut", "split_cut_bound",
           "MAX_PARTITION_RANKS"]

#: Largest rank count for which :func:`tree_packing_bound` enumerates partitions.
MAX_PARTITION_RANKS = 10
#: Rounds of :func:`min_shard_cut`'s ratio search before it gives up (a handful are ever needed).
MAX_RATIO_ROUNDS = 100


def max_flow(num_nodes: int, arcs, capacity, source: int, sink: int):
    """The maximum flow from ``source`` to ``sink`` and a minimum cut's source side.

    Edmonds-Karp (shortest augmenting paths) over the directed ``arcs``
    ``(u, v)`` of nodes ``0 .. num_nodes - 1`` with the given capacities
    (repeated arcs add up). A residual capacity below ``1e-12`` of the
    capacity between its two nodes (both ways) counts as none. On the
    planner's graphs (tens of nodes) it takes about an eighth of the time of
    networkx's ``minimum_cut`` (the 7 cuts of a DGX-1 V100 broadcast bound:
    0.21 against 1.8 ms), and the planner's carving calls it thousands of
    times per plan.

    Returns
    -------
    (float, set)
        The flow's value and the nodes the residual network still reaches
        from ``source`` (``sink`` is not among them).

    Examples
    --------
    >>> value, side = max_flow(3, [(0, 1), (1, 2), (0, 2)], [10.0, 4.0, 5.0], 0, 2)
    >>> value, sorted(side)
    (9.0, [0, 1])
    """
    residual = [{} for _ in range(num_nodes)]
    for (u, v), cap in zip(arcs, capacity):
        residual[u][v] = residual[u].get(v, 0.0) + float(cap)
        residual[v].setdefault(u, 0.0)
    # what counts as no residual capacity: below 1e-12 of the pair's own capacity (both ways),
    # so that the rounding of large flows is none and a tiny link still counts
    eps = [{y: 1e-12 * (r + residual[y][x]) for y, r in out.items()} for x, out in enumerate(residual)]
    value = 0.0
    while True:
        parent = {source: None}
        queue = collections.deque([source])
        while queue and sink not in parent:
            x = queue.popleft()
            for y, r in residual[x].items():
                if r > eps[x][y] and y not in parent:
                    parent[y] = x
                    queue.append(y)
        if sink not in parent:
            return value, set(parent)
        path, y = [], sink
        while parent[y] is not None:
            path.append((parent[y], y))
            y = parent[y]
        push = min(residual[x][y] for x, y in path)
        for x, y in path:
            residual[x][y] -= push
            residual[y][x] += push
        value += push


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
    capacity = graph.capacity_gbps if capacity is None else np.asarray(capacity, dtype=float)
    arcs = [(v, u) for u, v in graph.arcs] if toward_root else graph.arcs
    best = None
    for v in range(graph.n):
        if v != root:
            value, side = max_flow(graph.num_nodes, arcs, capacity, root, v)
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
    >>> from jax_blink.topo import Topology
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
    link_capacity = np.minimum(capacity[0::2], capacity[1::2])  # a tree edge loads both directions alike
    labels = _partitions(graph.n)
    parts = labels.max(axis=1).astype(float) + 1.0
    links = range(0, len(graph.arcs), 2)  # one arc per link
    crossing = np.stack([labels[:, graph.arcs[a][0]] != labels[:, graph.arcs[a][1]] for a in links], axis=1)
    cut = crossing @ link_capacity
    ratio = np.where(parts > 1, cut / np.maximum(parts - 1.0, 1.0), np.inf)
    best = int(np.argmin(ratio))
    mask = np.repeat(crossing[best], 2)
    return float(ratio[best]), mask, int(parts[best])


def tree_packing_bound(graph: LinkGraph) -> float | None:
    """Nash-Williams/Tutte strength of the rank graph, in GB/s.

    ``min over partitions P of c(δP) / (|P| - 1)``, where ``c(δP)`` sums the
    per-direction bandwidth of links between parts (the smaller direction of
    a link whose directions differ, since a tree edge loads both alike): the
    maximum total weight of undirected spanning trees each link can carry in
    both directions.
    Exact, by enumerating all partitions.

    Returns
    -------
    float or None
        None where the formula does not apply: the graph has switch nodes
        (a tree edge through a switch uses two ports, so partitions of ranks
        over-estimate) or more than :data:`MAX_PARTITION_RANKS` ranks.

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> ring = Topology.from_links(4, [(0, 1, 10), (1, 2, 10), (2, 3, 10), (3, 0, 10)])
    >>> round(tree_packing_bound(ring.link_graph()), 6)  # 4 links / 3 edges per tree
    13.333333
    """
    if graph.has_switches or graph.n > MAX_PARTITION_RANKS or graph.n < 2:
        return None
    return min_partition(graph)[0]


def min_shard_cut(graph: LinkGraph, capacity=None, toward_root: bool = False):
    """The node set ``S`` minimising ``c(δ⁺S) / |S ∩ R|`` over the sets holding some but not all ranks.

    ``R`` are the ranks, ``S`` may hold switches too, and ``c(δ⁺S)`` sums
    the arcs leaving ``S`` (all-gather: the slices of the ranks in ``S`` must
    get out); with ``toward_root``, ``c(δ⁻S)``, the arcs entering it
    (reduce-scatter: the contributions to the slices of the ranks in ``S``
    must get in). The minimum is the largest per-root weight ``x`` of a
    packing in which every rank roots trees of weight ``x``.

    Exact, by a Dinkelbach ratio search: ``x`` is feasible iff, after adding
    a source ``s`` with an arc ``s -> r`` of capacity ``x`` to every rank,
    every rank ``v`` has ``maxflow(s, v) >= N x`` (a cut ``{s} ∪ S`` with
    ``v`` outside ``S`` has capacity ``x |R \\ S| + c(δ⁺S)``). Starting from
    the best single rank, each violated cut found lowers ``x`` to its ratio;
    the ratios strictly fall, so the search ends at the minimum.

    Parameters
    ----------
    graph : LinkGraph
    capacity : array_like, optional
        Arc capacities to use instead of ``graph.capacity_gbps``.
    toward_root : bool
        Cut the arcs entering ``S`` (reduce-scatter) instead of leaving it.

    Returns
    -------
    (float, numpy.ndarray, int)
        The minimum ratio ``x``, a boolean mask of the arcs crossing the
        tight set ``S`` (leaving it, or entering it with ``toward_root``),
        and ``|S ∩ R|``.

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> ring = Topology.from_links(4, [(0, 1, 10), (1, 2, 10), (2, 3, 10), (3, 0, 10)])
    >>> value, mask, ranks = min_shard_cut(ring.link_graph())
    >>> round(value, 9), int(mask.sum()), ranks  # 3 ranks send 2 arcs' worth out
    (6.666666667, 2, 3)
    """
    capacity = graph.capacity_gbps if capacity is None else np.asarray(capacity, dtype=float)
    n = graph.n
    source = graph.num_nodes
    # S's arcs in: reverse the graph, then cut out of S
    directed = [(v, u) for u, v in graph.arcs] if toward_root else list(graph.arcs)

    def ratio(side):
        arcs = np.array([(v in side and u not in side) if toward_root else (u in side and v not in side)
                         for u, v in graph.arcs], dtype=bool)
        ranks = sum(1 for r in range(n) if r in side)
        return float(capacity[arcs].sum()) / ranks, arcs, ranks

    best = min((ratio({r}) for r in range(n)), key=lambda b: b[0])
    for _ in range(MAX_RATIO_ROUNDS):  # each round lowers x strictly to another set's ratio
        x = best[0]
        with_source = directed + [(source, r) for r in range(n)]
        capacities = np.concatenate([capacity, np.full(n, x)])
        found = None
        for v in range(n):
            value, side = max_flow(graph.num_nodes + 1, with_source, capacities, source, v)
            if value < n * x * (1 - 1e-12):
                cand = ratio(set(side) - {source})
                if cand[0] < x and (found is None or cand[0] < found[0]):
                    found = cand
        if found is None:
            return best
        best = found
    raise PlanError(f"internal error: the shard cut search did not converge in {MAX_RATIO_ROUNDS} rounds")


def shard_bound(graph: LinkGraph, toward_root: bool = False) -> float:
    """ForestColl's bound for all-gather (or reduce-scatter, ``toward_root``), in GB/s of algbw.

    ``N min_S c(δ⁺S) / |S ∩ R|`` over node sets ``S`` holding some but not
    all ranks (:func:`min_shard_cut`; ``c(δ⁻S)`` for reduce-scatter). On
    ``N`` ranks of a switch with ports of ``B`` GB/s it is ``B N / (N - 1)``.

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> round(shard_bound(Topology.preset("shm:4").link_graph()), 6)  # 10 GB/s * 4 / 3
    13.333333
    """
    return graph.n * min_shard_cut(graph, toward_root=toward_root)[0]


def split_cut_bound(graph: LinkGraph) -> float:
    """The cut bound of a ``"split"`` allreduce: the smallest max flow from one rank to another, in GB/s.

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> t = Topology.from_links(3, [(0, 1, 10, "nvlink", 2), (1, 2, 10, "nvlink", 2), (2, 0, 10, "nvlink", 2)])
    >>> split_cut_bound(t.link_graph())  # any rank sends 10 + 2 out
    12.0
    """
    return min(min_cut(graph, root)[0] for root in range(graph.n))


def dual_bound(graph: LinkGraph, arc_price, directions: str, root: int | None = None) -> float:
    """Weak-duality bound from arbitrary non-negative arc prices ``y``, in GB/s.

    Every tree ``T`` of a packing costs at least ``m = min_T y·use(T)``, and
    the packing's load respects capacities, so its total weight is at most
    ``y·c / m``. This holds for any ``y >= 0``; prices from an optimal LP dual
    make it tight.

    With ``root=None`` and directed trees (``"down"``, ``"up"``), every rank
    roots trees of the same total weight ``x`` (all-gather, reduce-scatter)
    and the rate is ``N x``: with ``m_r`` the cheapest arborescence rooted at
    ``r``, ``x Σ_r m_r <= y·c``, so the rate is at most ``N y·c / Σ_r m_r``.

    With ``directions="split"`` (allreduce by reduce trees and separate
    broadcast trees): a unit of rate rooted at ``r`` costs at least
    ``u_r + d_r``, its cheapest reduce and broadcast arborescences, so the
    rate is at most ``y·c / min_r (u_r + d_r)``; it bounds every allreduce
    tree packing, since a tree reduced up and broadcast down its own edges
    is one of each.

    Parameters
    ----------
    graph : LinkGraph
    arc_price : array_like
        One price per arc (negative entries are treated as 0).
    directions : str
        ``"both"`` (allreduce trees), ``"down"`` (broadcast, all-gather),
        ``"up"`` (reduce, reduce-scatter) or ``"split"``.
    root : int, optional
        Root for a broadcast or reduce; None for the per-rank roots of
        all-gather and reduce-scatter.
    """
    price = np.maximum(np.asarray(arc_price, dtype=float), 0.0)
    if directions == "split":
        up = graph.cheapest_trees(price, "up", range(graph.n))
        down = graph.cheapest_trees(price, "down", range(graph.n))
        if any(f is None for f in up + down):
            return float("inf")
        least = min(u[0] + d[0] for u, d in zip(up, down))
        return float(price @ graph.capacity_gbps / least) if least > 0 else float("inf")
    if directions != "both" and root is None:
        found = graph.cheapest_trees(price, directions, range(graph.n))
        if any(f is None for f in found) or sum(f[0] for f in found) <= 0:
            return float("inf")
        return float(graph.n * (price @ graph.capacity_gbps) / sum(f[0] for f in found))
    found = graph.cheapest_tree(price, directions, root)
    if found is None or found[0] <= 0:
        return float("inf")
    return float(price @ graph.capacity_gbps / found[0])


def certified_bound(graph: LinkGraph, collective: str, root: int | None, arc_prices) -> float:
    """The bound a plan reports: the smallest of the closed forms that apply and the dual bounds.

    An allreduce over links whose two directions differ somewhere
    (:attr:`LinkGraph.symmetric <jax_blink.topo.LinkGraph.symmetric>` false)
    is bounded as a ``"split"`` packing, which contains the other families.

    Parameters
    ----------
    graph : LinkGraph
        The links the plan may use.
    collective : str
        One of :data:`~jax_blink.planning.collectives.COLLECTIVES`.
    root : int or None
        The root of a broadcast or reduce; None otherwise.
    arc_prices : sequence of array_like
        Arc prices to turn into :func:`dual_bound` s (the packing LP's duals).

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> g = Topology.preset("dgx1-v100").link_graph()  # NVLink and PCIe
    >>> certified_bound(g, "broadcast", 0, [])
    166.0
    """
    split = collective == "allreduce" and not graph.symmetric
    directions = "split" if split else DIRECTIONS[collective]
    candidates = [dual_bound(graph, y, directions, root) for y in arc_prices]
    if split:
        candidates.append(split_cut_bound(graph))
    elif collective == "broadcast":
        candidates.append(broadcast_bound(graph, root))
    elif collective == "reduce":
        candidates.append(reduce_bound(graph, root))
    elif collective in ("allgather", "reduce_scatter"):
        candidates.append(shard_bound(graph, toward_root=collective == "reduce_scatter"))
    else:
        strength = tree_packing_bound(graph)
        if strength is not None:
            candidates.append(strength)
    return float(min(candidates))
