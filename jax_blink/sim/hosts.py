"""Several hosts: Blink's three-phase allreduce against NCCL's flat ring and hierarchical tree.

:func:`compare_hosts` simulates, on one multi-host topology
(:meth:`Topology.multi_host <jax_blink.topo.Topology.multi_host>`):

``blink-3phase``
    :func:`~jax_blink.planning.hosts.plan_hosts`: the in-host reduce-scatter
    (the plan lowered by :func:`~jax_blink.sim.tune`, simulated on the
    host's links), then the allreduce across hosts, then the in-host
    all-gather, one after another, as ``jax_blink.psum`` runs them across
    processes (three operations). The cross-host phase is XLA's collective,
    so it is simulated as NCCL would run it: the faster of a ring and a
    double binary tree with the hosts as ranks, each host reaching the
    network at its NICs' combined bandwidth, moving the whole vector (the
    ``k`` slices of ``S / k`` bytes, each on its own GPUs' NICs, move ``S``
    bytes together). The times of the slowest host add up.
``nccl-ring``
    NCCL's rings over all GPUs: each of the host's NVLink rings
    (:func:`~jax_blink.planning.rings.best_rings`; rank order without one)
    cut open in every host and chained through the hosts in order, with the
    ring's share of the data, the rings spread over each host's NICs.
``nccl-tree``
    NCCL's hierarchical tree (NCCL >= 2.4 across nodes): a chain through
    each host's GPUs, the chain heads joined by NCCL's double binary tree
    over the hosts; a pair of trees per NIC of a host, chaining each host's
    GPUs both ways round from a GPU on that NIC, each tree with an equal
    share of the data.

Rows carry nccl-tests' columns over all ranks (busbw = algbw * 2(N-1)/N).

Pure Python: never imports jax.
"""

from __future__ import annotations

from types import SimpleNamespace

from ..planning.hosts import HostPlan, plan_hosts
from ..planning.rings import best_rings
from ..topo import Topology
from .baselines import _count, _dtree_edges, _lower, double_binary_tree, ring_allreduce
from .model import SimModel
from .simulator import bus_factor, simulate
from .tuning import tune

__all__ = ["HOST_ALGORITHMS", "compare_hosts", "host_rings", "host_paths", "flat_ring", "hierarchical_tree"]

#: Algorithm names of :func:`compare_hosts`, in the order it reports them.
HOST_ALGORITHMS = ("blink-3phase", "nccl-ring", "nccl-tree")


def host_rings(host_plan: HostPlan) -> list:
    """The hosts' NVLink rings as ``(local order, GB/s)``: :func:`~jax_blink.planning.rings.best_rings`
    of one host, else one ring in rank order."""
    local = host_plan.reduce_scatter[0].topology
    rings = best_rings(local)
    if rings.rings:
        return [(tuple(r), float(w)) for r, w in zip(rings.rings, rings.weights_gbps)]
    return [(tuple(range(local.n)), 1.0)]


def host_paths(host_plan: HostPlan) -> list:
    """Each host's ranks along its heaviest NVLink ring cut open, else in rank order."""
    order = max(host_rings(host_plan), key=lambda ring: ring[1])[0]
    return [[ranks[j] for j in order] for ranks in host_plan.hosts]


def _nics(topology) -> dict:
    """Rank -> its NIC (the switch at the other end of its net link); ranks without one are absent."""
    return {l.u if l.u < topology.n else l.v: l.v if l.u < topology.n else l.u
            for l in topology.links if l.kind == "net" and (l.u < topology.n) != (l.v < topology.n)}


def _cards(nic: dict, ranks) -> list:
    """The NICs of ``ranks``, in id order (None for ranks without one, last)."""
    return sorted({nic.get(r) for r in ranks}, key=lambda x: (x is None, x))


def flat_ring(topology, size_bytes: int, dtype="float32", *, host_plan: HostPlan | None = None,
              model: SimModel | None = None):
    """NCCL's rings over every GPU of every host (see the module docstring).

    There are as many rings as the host has NVLink rings (:func:`host_rings`)
    or NICs, whichever is more. Ring ``q`` follows the host's NVLink ring
    ``q mod R`` in every host, hosts in order, with its share of that ring's
    data; it is cut open where both GPUs at the cut use the host's NIC
    ``q mod nics`` (else where the GPU it leaves the host from does), so that
    the rings spread over the NICs.
    """
    host_plan = plan_hosts(topology) if host_plan is None else host_plan
    nic = _nics(topology)
    base = host_rings(host_plan)
    count = max(len(base), max(len(_cards(nic, ranks)) for ranks in host_plan.hosts))
    uses = [len(range(r, count, len(base))) for r in range(len(base))]  # rings made from host ring r
    rings = []
    for q in range(count):  # a host ring used by several NICs splits its share among them
        order, weight = base[q % len(base)]
        weight /= uses[q % len(base)]
        flat = []
        for ranks in host_plan.hosts:
            path = [ranks[j] for j in order]
            cards = _cards(nic, ranks)
            card = cards[q % len(cards)]
            # the ends of the cut-open ring leave and enter the host: both on this NIC if possible,
            # else the one leaving (so that rings on NICs of one GPU each leave from different GPUs)
            score = [2 * (nic.get(path[i - 1]) == card) + (nic.get(path[i]) == card) for i in range(len(path))]
            i = max(range(len(path)), key=lambda j: (score[j], -j))
            flat += path[i:] + path[:i]
        rings.append((tuple(flat), weight))
    return ring_allreduce(topology, size_bytes, dtype, rings=rings, model=model)


def hierarchical_tree(topology, size_bytes: int, dtype="float32", *, host_plan: HostPlan | None = None,
                      model: SimModel | None = None):
    """NCCL's hierarchical double binary tree (see the module docstring).

    For each NIC ``c`` of a host, a pair of trees: each host's heaviest
    NVLink ring (:func:`host_paths`, a cycle) is walked forward for one tree
    and backward for the other, from the first GPU on NIC ``c``; the chain
    heads are joined across hosts by NCCL's two complementary binary trees.
    Every tree carries an equal share of the data.
    """
    host_plan = plan_hosts(topology) if host_plan is None else host_plan
    count, dtype = _count(size_bytes, dtype)
    paths = host_paths(host_plan)
    nic = _nics(topology)
    trees = []
    for c in range(len(_cards(nic, paths[0]))):
        for t, (root, edges) in enumerate(_dtree_edges(len(paths))):
            chains = []
            for p in paths:
                cards = _cards(nic, p)
                card = cards[c % len(cards)]
                i = next(j for j, r in enumerate(p) if nic.get(r) == card)
                chains.append(p[i:] + p[:i] if t == 0 else [p[i]] + (p[:i] + p[i + 1:])[::-1])
            tree_edges = [(ch[i], ch[i + 1]) for ch in chains for i in range(len(ch) - 1)]
            tree_edges += [(chains[a][0], chains[b][0]) for a, b in edges]
            trees.append(SimpleNamespace(root=chains[root][0], edges=tree_edges, weight=1.0))
    return _lower(trees, topology, count, dtype, SimModel() if model is None else model, "allreduce", -1,
                  1.0 / len(trees))


def _star(host_plan: HostPlan):
    """The network as the cross-host phase sees it: each host a rank behind one "NIC" switch
    whose links carry the slowest host's bandwidth to the network
    (:attr:`HostPlan.network_gbps`, all its NICs together), all NICs on one switch.

    The ``k`` allreduces of that phase (one per local position) each use their
    own GPUs' NICs, so together they have all of a host's NICs; the star gives
    one allreduce of the whole vector that bandwidth, and the four network
    arcs of a GPU-NIC-switch-NIC-GPU route their latency.
    """
    h, gbps = len(host_plan.hosts), host_plan.network_gbps
    links = [(r, h + r, gbps, "net") for r in range(h)] + [(h + r, 2 * h, gbps, "net") for r in range(h)]
    return Topology(h, links, [f"host{r}/nics" for r in range(h)] + ["network"], f"{host_plan.topology.name} network")


def _row(time_s, size_bytes, n):
    algbw = size_bytes / time_s / 1e9
    return {"time_us": time_s * 1e6, "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor("allreduce", n)}


def compare_hosts(topology, size_bytes: int, dtype="float32", model: SimModel | None = None,
                  host_plan: HostPlan | None = None) -> dict:
    """Simulate the three-phase allreduce, NCCL's flat ring and its hierarchical tree.

    Parameters
    ----------
    topology : Topology
        Two or more hosts with equal rank counts (see :func:`~jax_blink.planning.hosts.plan_hosts`).
    size_bytes : int
        Bytes of the vector on every rank.
    dtype : str
    model : SimModel, optional
    host_plan : HostPlan, optional
        ``plan_hosts(topology)`` if not given.

    Returns
    -------
    dict
        ``{algorithm: row}`` in :data:`HOST_ALGORITHMS` order; each row holds
        ``time_us``, ``algbw_gbps``, ``busbw_gbps``; ``blink-3phase`` also
        ``phases_us`` (reduce-scatter, across hosts, all-gather), ``network``
        (which NCCL algorithm the cross-host phase used), ``speedup`` (the
        faster baseline's time / its own) and ``vs_ring``.
    """
    model = SimModel() if model is None else model
    host_plan = plan_hosts(topology) if host_plan is None else host_plan
    phases = []
    for plans in (host_plan.reduce_scatter, host_plan.allgather):
        phases.append(max(tune(p, size_bytes, dtype, model=model, stars=False).result.time_s
                          for p in {id(p): p for p in plans}.values()))
    network = _star(host_plan)
    across = {name: simulate(build(network, size_bytes, dtype, model=model), network, model=model).time_s
              for name, build in (("ring", ring_allreduce), ("tree", double_binary_tree))}
    network_algo = min(across, key=across.get)
    phases.insert(1, across[network_algo])
    rows = {"blink-3phase": {**_row(sum(phases), size_bytes, topology.n),
                             "phases_us": [t * 1e6 for t in phases], "network": network_algo}}
    for name, build in (("nccl-ring", flat_ring), ("nccl-tree", hierarchical_tree)):
        schedule = build(topology, size_bytes, dtype, host_plan=host_plan, model=model)
        rows[name] = _row(simulate(schedule, topology, model=model).time_s, size_bytes, topology.n)
    blink = rows["blink-3phase"]
    blink["speedup"] = min(rows["nccl-ring"]["time_us"], rows["nccl-tree"]["time_us"]) / blink["time_us"]
    blink["vs_ring"] = rows["nccl-ring"]["time_us"] / blink["time_us"]
    return rows
