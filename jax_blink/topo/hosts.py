"""Several hosts joined by a network: building them, and finding the hosts of a topology.

A multi-host topology is one :class:`~jax_blink.topo.Topology` holding every
GPU of every host. Its ``"net"`` links are the network: the links from GPUs
to their host's NICs and from the NICs to the network switch. Everything
else (NVLink, PCIe, QPI, NVSwitch) is inside a host. So the hosts of any
topology, a preset, a JSON file or one built here, are the groups of ranks
that its non-``"net"`` links join (:func:`host_ranks`), and the network
between them is what remains when each host is contracted to one node
(:func:`network_spec`).

:func:`multi_host_spec` builds ``hosts`` copies of one host topology:

* host ``h`` holds ranks ``h * k .. h * k + k - 1`` (``k`` ranks per host, in
  the host's own order) and its switches, renamed ``host<h>/<name>``;
* each host has ``nics`` NICs (``host<h>/nic<i>``), each with ``nic_gbps``
  GB/s per direction to one ``network`` switch: a non-blocking fabric, so a
  host's NICs are its only bottleneck on the network;
* the host's GPUs are split among its NICs in contiguous runs, and each GPU
  reaches its NIC directly (GPUDirect RDMA) at ``nic_gbps``, so only the
  NIC's port limits the traffic.

Default routes use ``"net"`` links only between ranks that nothing else
joins (:meth:`~jax_blink.topo.LinkGraph.route`), as NCCL uses its network
transport only across hosts.

Pure Python: never imports jax.
"""

from __future__ import annotations

import numbers

from .errors import TopologyError
from .limits import MAX_BANDWIDTH_GBPS, MAX_NODES, MIN_BANDWIDTH_GBPS

__all__ = ["NET", "multi_host_spec", "host_ranks", "network_spec"]

#: The link kind of the network between hosts.
NET = "net"


def _positive_int(value, what) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise TopologyError(f"{what} must be a positive integer, got {value!r:.40}")
    return int(value)


def multi_host_spec(host, hosts: int, nic_gbps: float, nics: int = 1, name: str = ""):
    """``hosts`` copies of ``host`` joined by NICs, as Topology arguments.

    Parameters
    ----------
    host : Topology
        One host (a preset or a JSON topology); it must have no ``"net"``
        links of its own.
    hosts : int
        How many hosts (at least 1).
    nic_gbps : float
        Bandwidth of each NIC in GB/s per direction (100 Gb/s is 12.5 GB/s).
    nics : int
        NICs per host (at most the host's rank count).
    name : str
        Display name; by default ``"<hosts>x<host name>"``.

    Returns
    -------
    tuple
        ``(n, links, switches, name)``.

    Raises
    ------
    TopologyError
        Naming the value that is not allowed.
    """
    hosts = _positive_int(hosts, "the number of hosts")
    nics = _positive_int(nics, "the number of NICs per host")
    if any(l.kind == NET for l in host.links):
        raise TopologyError(f"host topology {host.name} already has network links; give one host "
                            f"(no 'net' links) to build several")
    if nics > host.n:
        raise TopologyError(f"{nics} NICs per host is more than the host's {host.n} ranks")
    if isinstance(nic_gbps, bool) or not isinstance(nic_gbps, numbers.Real) \
            or not MIN_BANDWIDTH_GBPS <= float(nic_gbps) <= MAX_BANDWIDTH_GBPS:
        raise TopologyError(f"the NIC bandwidth must be a number of GB/s per direction between "
                            f"{MIN_BANDWIDTH_GBPS:g} and {MAX_BANDWIDTH_GBPS:g} (100 Gb/s is 12.5), "
                            f"got {nic_gbps!r:.40}")
    k, s = host.n, len(host.switches)
    n = hosts * k
    total = n + hosts * (s + nics) + 1
    if total > MAX_NODES:
        raise TopologyError(f"{hosts} hosts of {k} ranks and {s + nics} switches and NICs are {total} nodes, "
                            f"more than the {MAX_NODES} a topology may have")
    first_nic = n + hosts * s
    network = total - 1

    def node(h, x):  # a host's node id in the whole topology
        return h * k + x if x < k else n + h * s + (x - k)

    links, switches = [], []
    for h in range(hosts):
        switches += [f"host{h}/{name_}" for name_ in host.switches]
        links += [(node(h, l.u), node(h, l.v), l.bandwidth_gbps, l.kind, l.reverse_gbps) for l in host.links]
    for h in range(hosts):
        for i in range(nics):
            nic = first_nic + h * nics + i
            switches.append(f"host{h}/nic{i}")
            links.append((nic, network, float(nic_gbps), NET))
            links += [(h * k + g, nic, float(nic_gbps), NET) for g in range(k) if g * nics // k == i]
    switches.append("network")
    return n, links, switches, name or f"{hosts}x{host.name}", host.reduce_gbps


def _host_of_nodes(topology) -> dict:
    """Node -> host index, for every rank and every switch tied to a host by non-``"net"`` links.

    Hosts are numbered by their lowest rank; switches reached only over
    ``"net"`` links (NICs, network switches) are absent. A topology without
    ``"net"`` links is one host, connected or not (a disconnected one is the
    planner's error to report).
    """
    if not any(l.kind == NET for l in topology.links):
        return {x: 0 for x in range(topology.num_nodes)}
    parent = list(range(topology.num_nodes))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for l in topology.links:
        if l.kind != NET:
            a, b = find(l.u), find(l.v)
            if a != b:
                parent[max(a, b)] = min(a, b)
    index = {}
    for r in range(topology.n):  # roots are the lowest node of each group, so a rank for hosts
        index.setdefault(find(r), len(index))
    return {x: index[find(x)] for x in range(topology.num_nodes) if find(x) in index}


def host_ranks(topology) -> tuple:
    """The hosts of ``topology``: the groups of ranks its non-``"net"`` links join.

    Switch nodes belong to the host whose ranks they link (a PCIe switch or
    an NVSwitch is inside a host). A topology without ``"net"`` links is one
    host.

    Returns
    -------
    tuple of tuple of int
        Each host's ranks in ascending order, hosts ordered by their lowest rank.

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> Topology.multi_host("shm:2", 3, nic_gbps=12.5).host_ranks()
    ((0, 1), (2, 3), (4, 5))
    """
    of = _host_of_nodes(topology)
    groups = [[] for _ in range(max(of.values()) + 1)]
    for r in range(topology.n):
        groups[of[r]].append(r)
    return tuple(tuple(g) for g in groups)


def network_spec(topology):
    """The network between the hosts, each host contracted to one rank, as Topology arguments.

    Rank ``h`` is host ``h`` of :func:`host_ranks`; the switches are the
    network's own (NICs and switches reached only over ``"net"`` links); the
    links are the ``"net"`` links, those from a GPU to a NIC becoming links
    from its host to the NIC (parallel ones summed). Links inside a host
    are dropped.

    Returns
    -------
    tuple
        ``(n, links, switches, name)``.

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> net = Topology.multi_host("shm:2", 3, nic_gbps=12.5).network()
    >>> net.n, net.switches[-1], net.links[-1]
    (3, 'network', Link(u=5, v=6, bandwidth_gbps=12.5, kind='net', reverse_gbps=None))
    """
    of = _host_of_nodes(topology)
    hosts = max(of.values()) + 1
    outside = [x for x in range(topology.n, topology.num_nodes) if x not in of]
    new_id = {x: hosts + j for j, x in enumerate(outside)}
    new_id.update(of)
    links = [(new_id[l.u], new_id[l.v], l.forward_gbps, NET, l.reverse_gbps)
             for l in topology.links if l.kind == NET and new_id[l.u] != new_id[l.v]]
    switches = [topology.switches[x - topology.n] for x in outside]
    return hosts, links, switches, f"{topology.name} network"
