"""The NCCL-style ring baseline: the best fractional packing of directed Hamiltonian rings.

:func:`best_rings` packs rings on the fast (NVLink) links by column
generation (a new ring is the cheapest Hamiltonian cycle under the dual
prices: Held-Karp, or nearest-neighbour for many ranks). A plan reports the
rings' rate next to its own, and the ``nccl-ring`` baseline of
:mod:`jax_blink.sim.baselines` runs them.

Pure Python: never imports jax.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ..topo import FAST_KINDS, Topology
from .collectives import bus_factor

__all__ = ["best_rings", "RingSet", "MAX_EXACT_RING_RANKS"]

#: Largest rank count for which :func:`best_rings` prices rings exactly (Held-Karp).
MAX_EXACT_RING_RANKS = 16


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
        its algbw is ``total * n / (2(n-1))``; ring reduce-scatter and
        all-gather move ``(n-1)/n`` of it, at ``total * n / (n-1)``; a
        broadcast or reduce pipelines along each ring (a chain), at
        ``total``. Zero without rings. In nccl-tests' busbw
        (:func:`~jax_blink.planning.collectives.bus_factor`) all of them are ``total``.
        """
        if not self.rings:
            return 0.0
        return self.total_gbps / bus_factor(collective, self.nranks)


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


@functools.lru_cache(maxsize=64)
def best_rings(topology: Topology, tolerance: float = 1e-9) -> RingSet:
    """The best NCCL-style rings on the fast links (NVLink, NVSwitch).

    Cached per topology (a whole DGX-1's take 35 ms, and a GPU decision asks for
    them up to four times: NCCL's model, the ring, the tree and the chain).

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
