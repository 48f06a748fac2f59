"""Plans on damaged machines (issue 46): links down or degraded are respected and the rate stays optimal.

Optimality is checked against the closed-form Nash-Williams/Tutte partition
bound (:func:`jax_blink.planning.bounds.tree_packing_bound`) of the damaged
NVLink graph, computed without the LP; capacities are re-added here from the
topology's links, independently of the planner's link graph.
"""

from collections import defaultdict

import pytest

from jax_blink.planning import plan
from jax_blink.planning.bounds import tree_packing_bound
from jax_blink.topo import Topology

DGX1V = Topology.preset("dgx1-v100")


def _arc_loads(p):
    """GB/s each arc carries: broadcast paths parent to child, reductions child to parent."""
    load = defaultdict(float)
    for tree in p.trees:
        for path in tree.paths:
            for a, b in zip(path, path[1:]):
                load[a, b] += tree.weight
        if p.collective == "allreduce":
            for path in tree.reduce_paths:
                for a, b in zip(path, path[1:]):
                    load[b, a] += tree.weight
    return load


def _capacities(topology, kinds):
    cap = defaultdict(float)
    for link in topology.links:
        if link.kind in kinds:
            cap[link.u, link.v] += link.forward_gbps
            cap[link.v, link.u] += link.backward_gbps
    return cap


def _check_respects(p, topology, removed=()):
    load, cap = _arc_loads(p), _capacities(topology, p.link_kinds)
    for (a, b), gbps in load.items():
        assert (min(a, b), max(a, b)) not in removed, f"arc {a}->{b} of a removed link carries {gbps} GB/s"
        assert gbps <= cap[a, b] * (1 + 1e-6), f"arc {a}->{b} carries {gbps} GB/s over its {cap[a, b]} GB/s"
    p.lower(1 << 20, "float32").validate()


@pytest.mark.parametrize("removed", [[(0, 1)], [(0, 2)], [(3, 7)], [(0, 1), (2, 6)], [(0, 4), (5, 6)]])
def test_nvlink_plan_on_damaged_dgx1v_is_optimal_and_avoids_removed_links(removed):
    damaged = DGX1V.without(removed)
    p = plan(damaged, links="fast", cache=False)
    assert p.link_kinds == ("nvlink",)
    bound = tree_packing_bound(damaged.link_graph(p.link_kinds))
    assert bound is not None and p.rate_gbps == pytest.approx(bound, rel=1e-6)
    assert p.rate_gbps == pytest.approx(p.bound_gbps, rel=1e-6)
    healthy = tree_packing_bound(DGX1V.link_graph(("nvlink",)))
    assert bound < healthy  # every NVLink of a DGX-1V matters: the test would notice a link still in use
    _check_respects(p, damaged, {(min(u, v), max(u, v)) for u, v in removed})


def test_hybrid_plan_on_damaged_dgx1v_is_certified():
    damaged = DGX1V.without([(0, 1)])
    p = plan(damaged, cache=False)
    assert "pcie" in p.link_kinds and p.rate_gbps == pytest.approx(p.bound_gbps, rel=1e-6)
    _check_respects(p, damaged, {(0, 1)})


def test_degraded_link_capacity_is_respected():
    damaged = DGX1V.degraded({(0, 1): 0.25, (2, 6): 0.5})
    p = plan(damaged, links="fast", cache=False)
    bound = tree_packing_bound(damaged.link_graph(("nvlink",)))
    assert p.rate_gbps == pytest.approx(bound, rel=1e-6)
    assert bound < tree_packing_bound(DGX1V.link_graph(("nvlink",)))
    _check_respects(p, damaged)


def test_broadcast_on_damaged_machine_meets_the_min_cut():
    from jax_blink.planning.bounds import broadcast_bound
    damaged = DGX1V.without([(0, 1), (0, 4)])
    p = plan(damaged, "broadcast", root=0, links="fast", cache=False)
    assert p.rate_gbps == pytest.approx(broadcast_bound(damaged.link_graph(("nvlink",)), 0), rel=1e-6)
    _check_respects(p, damaged, {(0, 1), (0, 4)})


def test_cached_plans_follow_link_state():
    healthy = plan(DGX1V, links="fast")
    damaged = DGX1V.without([(0, 2)])
    again = plan(damaged, links="fast")
    assert again.topology == damaged and again.rate_gbps < healthy.rate_gbps
    _check_respects(again, damaged, {(0, 2)})
