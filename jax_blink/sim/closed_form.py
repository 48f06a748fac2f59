"""The closed form a schedule's bandwidth term is checked against: its busiest arc.

:func:`busiest_arc_s` counts, from the schedule's own steps and routes (not
from a simulation), the bytes every SEND puts on each directed arc of the
topology and returns the time the most loaded arc needs for them. A schedule
whose pipeline keeps that arc busy reaches it; ``tests/sim/test_fidelity.py``
and ``benchmarks/bench_simulator.py fidelity`` compare :func:`~jax_blink.sim.simulate`
with it.

Pure Python: never imports jax.
"""

from __future__ import annotations

import collections

__all__ = ["busiest_arc_s", "slowest_tree_s"]


def busiest_arc_s(schedule, topology) -> float:
    """Seconds the busiest directed arc needs for the bytes the schedule's SENDs put on it.

    A SEND follows its tree's route in ``schedule.routes`` where the schedule
    carries one, else the link graph's default route.
    """
    graph = topology.link_graph()
    carried = {}
    for tree, paths in enumerate(schedule.routes):
        for path in paths:
            carried[tree, path[0], path[-1]] = path
            carried[tree, path[-1], path[0]] = path[::-1]
    load = collections.Counter()
    for rank, steps in enumerate(schedule.steps):
        for step in steps:
            if step.op == "SEND":
                path = carried.get((step.tree, rank, step.peer)) or graph.path(rank, step.peer)
                for x, y in zip(path, path[1:]):
                    load[x, y] += schedule.chunks[step.chunk][1] * schedule.itemsize
    capacity = {}
    for l in topology.links:
        capacity[l.u, l.v] = capacity.get((l.u, l.v), 0.0) + l.bandwidth_gbps * 1e9
        back = l.bandwidth_gbps if l.reverse_gbps is None else l.reverse_gbps
        capacity[l.v, l.u] = capacity.get((l.v, l.u), 0.0) + back * 1e9
    return max(b / capacity[a] for a, b in load.items())


def slowest_tree_s(plan, chunks, size_bytes: int) -> float:
    """The pipeline form of a plan's slowest tree, in seconds: ``max (H + k - 1) / k`` over
    its trees (``H`` hops up and down, :attr:`Tree.round_trip <jax_blink.planning.Tree.round_trip>`,
    for an allreduce, the depth for a one-way collective; ``k`` chunks) times
    ``size_bytes`` over the trees' total weight.

    Every tree gets its planned bandwidth on every arc it crosses, so no tree
    is slower than this; trees that finish early free arcs for the others, so
    a packing of trees of several depths runs between its busiest arc and this.
    """
    fill = max(((tree.round_trip if plan.collective == "allreduce" else tree.depth) + k - 1) / k
               for tree, k in zip(plan.trees, chunks))
    return fill * size_bytes / (sum(tree.weight for tree in plan.trees) * 1e9)
