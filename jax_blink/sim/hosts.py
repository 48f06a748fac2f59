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
    double binary tree over the network with the hosts as ranks, moving the
    whole vector (the ``k`` slices of ``S / k`` bytes that share each host's
    NICs move ``S`` bytes together). The times of the slowest host add up.
``nccl-ring``
    NCCL's ring over all GPUs: inside each host along its best NVLink ring
    cut open (rank order without one), hosts in order, one ring per NIC of a
    host, each leaving and entering its hosts through that NIC where the
    host's ring allows.
``nccl-tree``
    NCCL's hierarchical tree (NCCL >= 2.4 across nodes): a chain through
    each host's GPUs, the chain heads joined by NCCL's double binary tree
    over the hosts; two trees, each with half of the data, the second
    chaining each host the other way round.

Rows carry nccl-tests' columns over all ranks (busbw = algbw * 2(N-1)/N).

Pure Python: never imports jax.
"""

from __future__ import annotations

from types import SimpleNamespace

from ..planning.hosts import HostPlan, plan_hosts
from ..planning.rings import best_rings
from .baselines import _count, _dtree_edges, _lower, double_binary_tree, ring_allreduce
from .model import SimModel
from .simulator import bus_factor, simulate
from .tuning import tune

__all__ = ["HOST_ALGORITHMS", "compare_hosts", "host_paths", "flat_ring", "hierarchical_tree"]

#: Algorithm names of :func:`compare_hosts`, in the order it reports them.
HOST_ALGORITHMS = ("blink-3phase", "nccl-ring", "nccl-tree")


def host_paths(host_plan: HostPlan) -> list:
    """Each host's ranks along its heaviest NVLink ring cut open, else in rank order."""
    paths = []
    local = host_plan.reduce_scatter[0].topology
    rings = best_rings(local)
    order = max(zip(rings.weights_gbps, rings.rings))[1] if rings.rings else tuple(range(local.n))
    for ranks in host_plan.hosts:
        paths.append([ranks[j] for j in order])
    return paths


def _nic_of(topology, rank):
    """The NIC (first switch over a net link) of ``rank``, or None."""
    for l in topology.links:
        if l.kind == "net" and rank in (l.u, l.v):
            return l.v if l.u == rank else l.u
    return None


def flat_ring(topology, size_bytes: int, dtype="float32", *, host_plan: HostPlan | None = None,
              model: SimModel | None = None):
    """NCCL's ring over every GPU of every host (see the module docstring)."""
    host_plan = plan_hosts(topology) if host_plan is None else host_plan
    paths = host_paths(host_plan)
    nic = {r: _nic_of(topology, r) for path in paths for r in path}
    nics = sorted({nic[r] for r in paths[0]}, key=lambda x: (x is None, x))
    rings = []
    for card in nics:
        rotated = []
        for path in paths:
            k = len(path)
            # a rotation whose ends (the ranks that leave and enter the host) use this NIC
            score = [(nic[path[i - 1]] == card) + (nic[path[i]] == card) for i in range(k)]
            i = max(range(k), key=lambda j: (score[j], -j))
            rotated += path[i:] + path[:i]
        rings.append((tuple(rotated), 1.0))
    return ring_allreduce(topology, size_bytes, dtype, rings=rings, model=model)


def hierarchical_tree(topology, size_bytes: int, dtype="float32", *, host_plan: HostPlan | None = None,
                      model: SimModel | None = None):
    """NCCL's hierarchical double binary tree (see the module docstring)."""
    host_plan = plan_hosts(topology) if host_plan is None else host_plan
    count, dtype = _count(size_bytes, dtype)
    paths = host_paths(host_plan)
    trees = []
    for t, (root, edges) in enumerate(_dtree_edges(len(paths))):
        chains = [p if t == 0 else p[::-1] for p in paths]
        tree_edges = [(c[i], c[i + 1]) for c in chains for i in range(len(c) - 1)]
        tree_edges += [(chains[p][0], chains[c][0]) for p, c in edges]
        trees.append(SimpleNamespace(root=chains[root][0], edges=tree_edges, weight=1.0))
    return _lower(trees, topology, count, dtype, SimModel() if model is None else model, "allreduce", -1, 0.5)


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
    network = host_plan.network
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
