"""Blink's three-phase allreduce over several hosts: :func:`plan_hosts` and :class:`HostPlan`.

Blink's multi-server protocol (Wang et al., MLSys 2020, section 4.3), which
``jax_blink.psum`` runs across processes (:mod:`jax_blink.ops.hierarchical`):

1. reduce-scatter inside each host along Blink trees packed into that
   host's links (:func:`~jax_blink.planning.plan` with ``"reduce_scatter"``
   on the host's topology): the rank at local position ``j`` ends with the
   host's sum of slice ``j``, ``S / k`` bytes of an ``S``-byte vector on
   ``k`` ranks per host;
2. across hosts, an allreduce of each slice ``j`` among the ranks at
   position ``j`` (XLA's own collective: NCCL, or gloo on CPUs). The ``k``
   allreduces share each host's NICs, which together carry
   ``2 (H - 1) / H * S`` bytes each way in a ring over ``H`` hosts;
3. all-gather inside each host along Blink trees (``"allgather"``).

The hosts are those of :meth:`Topology.host_ranks
<jax_blink.topo.Topology.host_ranks>` (groups joined by non-network links),
all with the same number of ranks; hosts with the same links share one
plan. Planning therefore costs two plans of one host however many hosts
there are: 128 DGX-1s (1,024 GPUs) plan in the time of one.

:meth:`HostPlan.bandwidth_time_s` is the phases' bandwidth terms (no
latency), a lower bound of the three-phase time;
:func:`jax_blink.sim.compare_hosts` simulates the phases.

Pure Python: never imports jax.
"""

from __future__ import annotations

import dataclasses
import time

from ..topo import Topology
from ..topo.hosts import NET
from .errors import PlanError
from .planner import plan

__all__ = ["HostPlan", "plan_hosts"]


@dataclasses.dataclass(frozen=True)
class HostPlan:
    """The three-phase allreduce of a multi-host topology.

    Attributes
    ----------
    topology : Topology
        All ranks of all hosts.
    hosts : tuple of tuple of int
        Each host's ranks; local position ``j`` of host ``h`` is ``hosts[h][j]``.
    reduce_scatter, allgather : tuple of Plan
        Each host's in-host plans, on its own topology (``topology.subset(hosts[h])``);
        hosts with the same links share the same Plan objects.
    network_gbps : float
        The slowest host's bandwidth to the network, per direction (its NICs' ports
        together): the max flow out of and into it over :meth:`Topology.network`.
    plan_seconds : float
        Wall time of :func:`plan_hosts` (the in-host plans may come from the cache).
    """

    topology: Topology
    hosts: tuple
    reduce_scatter: tuple
    allgather: tuple
    network_gbps: float
    plan_seconds: float

    @property
    def ranks_per_host(self) -> int:
        return len(self.hosts[0])

    def bandwidth_time_s(self, size_bytes: int) -> float:
        """The three phases' bandwidth terms for an ``size_bytes`` vector, in seconds.

        ``S / rs + 2 (H - 1) / H * S / B + S / ag``, with ``rs`` and ``ag`` the
        slowest host's in-host rates and ``B`` = :attr:`network_gbps`: what
        the phases take without latency, run one after another.
        """
        h = len(self.hosts)
        size = float(size_bytes)
        return (size / (min(p.rate_gbps for p in self.reduce_scatter) * 1e9)
                + 2.0 * (h - 1) / h * size / (self.network_gbps * 1e9)
                + size / (min(p.rate_gbps for p in self.allgather) * 1e9))

    @property
    def rate_gbps(self) -> float:
        """Algorithm bandwidth of :meth:`bandwidth_time_s` (size / time), GB/s."""
        return 1.0 / (self.bandwidth_time_s(1) * 1e9)

    def summary(self) -> str:
        """Human-readable description of the three phases."""
        h, k = len(self.hosts), self.ranks_per_host
        rs, ag = self.reduce_scatter[0], self.allgather[0]
        distinct = len({id(p) for p in self.reduce_scatter})
        return "\n".join([
            f"allreduce on {self.topology.name} ({self.topology.n} ranks: {h} hosts x {k}), three phases, "
            f"{distinct} distinct host plan(s), planned in {self.plan_seconds:.2f} s",
            f"  1. reduce-scatter in each host: {rs.rate_gbps:.4g} GB/s, {len(rs.trees)} tree(s) over "
            f"{'/'.join(rs.link_kinds)} ({rs.links_text()})",
            f"  2. allreduce of each 1/{k} slice across the {h} hosts: {self.network_gbps:.4g} GB/s per host "
            f"to the network; a ring moves 2(H-1)/H = {2 * (h - 1) / h:.3g} x the vector through each host's NICs",
            f"  3. all-gather in each host: {ag.rate_gbps:.4g} GB/s, {len(ag.trees)} tree(s)",
            f"  bandwidth terms: {self.rate_gbps:.4g} GB/s algbw for large messages "
            f"(1/rate = 1/{rs.rate_gbps:.4g} + {2 * (h - 1) / h:.3g}/{self.network_gbps:.4g} + 1/{ag.rate_gbps:.4g})",
        ])


def _host_bandwidth_gbps(network: Topology) -> float:
    """The slowest host's bandwidth to the other hosts, per direction: the max flow
    from each host to all others and back, over the network's links."""
    import networkx as nx

    graph = network.link_graph()
    out = nx.DiGraph()
    for (u, v), cap in zip(graph.arcs, graph.capacity_gbps):
        out.add_edge(u, v, capacity=float(cap))
    back = out.reverse(copy=True)
    best = float("inf")
    for g in (out, back):  # every host drains into "others", except the one measured
        g.add_edges_from(((x, "others") for x in range(network.n)), capacity=float("inf"))
        for h in range(network.n):
            g.remove_edge(h, "others")
            best = min(best, nx.maximum_flow_value(g, h, "others"))
            g.add_edge(h, "others", capacity=float("inf"))
    return best


def plan_hosts(topology: Topology, links: str = "all", cache: bool = True) -> HostPlan:
    """Plan Blink's three-phase allreduce over the hosts of ``topology``.

    Parameters
    ----------
    topology : Topology
        Two or more hosts with the same number of ranks, joined by ``"net"``
        links (e.g. :meth:`Topology.multi_host <jax_blink.topo.Topology.multi_host>`).
    links : {"all", "fast"}
        Passed to :func:`~jax_blink.planning.plan` for the in-host plans.
    cache : bool
        Whether the in-host plans may come from (and go to) the plan cache.

    Returns
    -------
    HostPlan

    Raises
    ------
    PlanError
        If the topology is one host, or its hosts differ in rank count, or
        an in-host plan fails (e.g. a host of more than
        :data:`~jax_blink.planning.MAX_RANKS` ranks).

    Examples
    --------
    >>> hp = plan_hosts(Topology.multi_host("shm:4", 2, nic_gbps=12.5))
    >>> hp.hosts, round(hp.network_gbps, 2)
    (((0, 1, 2, 3), (4, 5, 6, 7)), 12.5)
    """
    if not isinstance(topology, Topology):
        raise PlanError(f"plan_hosts takes a Topology, got {type(topology).__name__}")
    start = time.perf_counter()
    hosts = topology.host_ranks()
    if len(hosts) < 2:
        raise PlanError(f"{topology.name} is one host (no 'net' links join groups of its ranks); "
                        f"plan it with plan(), or build hosts with Topology.multi_host")
    sizes = sorted({len(h) for h in hosts})
    if len(sizes) > 1:
        raise PlanError(f"the hosts of {topology.name} have different rank counts {sizes}; the three-phase "
                        f"allreduce needs the same number of ranks on every host")
    if sizes[0] < 2:
        raise PlanError(f"the hosts of {topology.name} have one rank each: there is nothing to plan inside "
                        f"a host; the allreduce is the network's alone")
    inside = Topology(topology.n, [l for l in topology.links if l.kind != NET], topology.switches, topology.name)
    plans = {}
    rs, ag = [], []
    for h, ranks in enumerate(hosts):
        local = inside.subset(ranks, name=f"{topology.name} host {h}")  # the NICs drop out as dead ends
        key = Topology(local.n, local.links, ["switch"] * len(local.switches)).fingerprint()  # names aside
        if key not in plans:
            plans[key] = tuple(plan(local, c, cache=cache, links=links) for c in ("reduce_scatter", "allgather"))
        rs.append(plans[key][0])
        ag.append(plans[key][1])
    return HostPlan(topology, hosts, tuple(rs), tuple(ag), _host_bandwidth_gbps(topology.network()),
                    time.perf_counter() - start)
