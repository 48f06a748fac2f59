"""plan(slow_ranks=...): slow ranks as leaves where the packing allows at the rate asked, else the plain plan."""

import json

import pytest

from jax_blink.planning import PlanError, plan
from jax_blink.planning.cache import cache_key
from jax_blink.planning.leaves import slow_are_leaves
from jax_blink.topo import Topology


def _all_leaves(p, slow):
    return all(slow_are_leaves(t.root, t.edges, set(slow)) for t in p.trees)


def test_shm8_slow_rank_costs_a_port_share_and_falls_back_at_zero_tolerance():
    t = Topology.preset("shm:8")  # 8 ports of 10 GB/s on one switch; a tree edge uses two ports
    plain = plan(t, cache=False)
    assert plain.rate_gbps == pytest.approx(8 * 10 / (2 * 7))
    p = plan(t, slow_ranks=[3], cache=False)
    assert p.rate_gbps == pytest.approx(plain.rate_gbps) and not _all_leaves(p, [3])
    assert "below the optimum" in p.note and "keeps its trees" in p.note
    # as a leaf, rank 3 uses its port once per tree: the other 7 ports carry 13 of 14 uses
    kept = plan(t, slow_ranks=[3], tolerance=0.1, cache=False)
    assert _all_leaves(kept, [3]) and "are leaves of every tree" in kept.note
    assert kept.rate_gbps == pytest.approx(7 * 10 / (2 * 7 - 1), rel=1e-6)
    kept.lower(1 << 20, "float32").validate()


def test_a_rank_at_the_end_of_a_chain_is_a_leaf_at_the_optimum():
    t = Topology.from_links(4, [(0, 1, 10.0), (1, 2, 10.0), (2, 3, 10.0)])
    p = plan(t, slow_ranks=[3], cache=False)
    assert _all_leaves(p, [3]) and p.rate_gbps == pytest.approx(10.0) == pytest.approx(p.bound_gbps)


def test_impossible_leaves_say_so_and_stay_optimal():
    t = Topology.from_links(4, [(0, 1, 10.0), (1, 2, 10.0), (2, 3, 10.0)])
    p = plan(t, slow_ranks=[1], cache=False)
    assert "no spanning tree has them all as leaves" in p.note
    assert p.rate_gbps == pytest.approx(p.bound_gbps) == pytest.approx(10.0)


def test_dgx1v_allocation_slow_ranks_are_leaves_within_tolerance():
    from jax_blink.planning.leaves import pack_leaves
    t = Topology.preset("dgx1-v100").subset([0, 1, 2, 3, 4, 5])
    plain = plan(t, links="fast", cache=False)
    lp_rate, _, _ = pack_leaves(t.link_graph(("nvlink",)), [2, 5])
    assert lp_rate < plain.rate_gbps * (1 - 1e-6)  # leaves cost rate here: exact only falls back
    exact = plan(t, links="fast", slow_ranks=[5, 2], cache=False)
    assert exact.rate_gbps == pytest.approx(plain.rate_gbps) and "keeps its trees" in exact.note
    loose = plan(t, links="fast", slow_ranks=[5, 2], tolerance=1 - lp_rate / plain.rate_gbps + 0.01, cache=False)
    assert _all_leaves(loose, [2, 5]) and "are leaves of every tree" in loose.note
    assert loose.rate_gbps == pytest.approx(lp_rate, rel=1e-6) and loose.bound_gbps == pytest.approx(plain.rate_gbps)
    loose.lower(1 << 20, "float32").validate()


def test_cache_key_and_cached_plans_carry_slow_ranks():
    t = Topology.preset("shm:4")
    base = ("allreduce", None, None, 0.1, "all")
    assert "slow_ranks" not in cache_key(t, base)
    assert cache_key(t, base + ((1,),))["slow_ranks"] == [1]
    assert json.dumps(cache_key(t, base + ((1,),))) != json.dumps(cache_key(t, base + ((2,),)))
    first = plan(t, slow_ranks=[1], tolerance=0.1)
    again = plan(t, slow_ranks=[1], tolerance=0.1)
    plain = plan(t, tolerance=0.1)
    assert first.note and again.note == first.note and not plain.note
    assert _all_leaves(again, [1])


@pytest.mark.parametrize("kwargs, match", [
    (dict(slow_ranks=[9]), "out of range"),
    (dict(slow_ranks=[1, 1]), "twice"),
    (dict(slow_ranks="1"), "sequence of rank numbers"),
    (dict(slow_ranks=[0, 1, 2, 3]), "all 4 ranks"),
    (dict(collective="broadcast", root=0, slow_ranks=[1]), "applies to allreduce"),
])
def test_bad_slow_ranks_are_named(kwargs, match):
    with pytest.raises(PlanError, match=match):
        plan(Topology.preset("shm:4"), cache=False, **kwargs)


def _reduce_order(schedule, rank):
    """Per chunk, the peers ``rank`` reduces from, in the order of its steps' dependency chain."""
    steps = schedule.steps[rank]
    order = {}
    for st in steps:
        if st.op == "RECV_REDUCE":
            order.setdefault(st.chunk, []).append(st.peer)
    return order


def test_lowering_reduces_slow_ranks_after_every_other_child():
    t = Topology.preset("shm:8")
    plain = plan(t, cache=False).lower(8 * 4096 * 4, "float32", chunks=2)
    slow = plan(t, slow_ranks=[3, 5], cache=False)
    assert slow.slow_ranks == (3, 5) and slow.trees == plan(t, cache=False).trees
    lowered = slow.lower(8 * 4096 * 4, "float32", chunks=2).validate()
    for rank in (0, 6):
        got, before = _reduce_order(lowered, rank), _reduce_order(plain, rank)
        assert got and all(peers[-2:] == [3, 5] for peers in got.values()), got
        assert any(peers[-2:] != [3, 5] for peers in before.values())  # ascending without slow ranks
        assert {c: sorted(p) for c, p in got.items()} == {c: sorted(p) for c, p in before.items()}
    # a slow root reduces its own children in the plain order (it has no slow child but itself)
    assert all(3 not in peers for peers in _reduce_order(lowered, 3).values())


def test_plans_keep_slow_ranks_through_json():
    from jax_blink.planning import Plan
    p = plan(Topology.preset("shm:4"), slow_ranks=[2], cache=False)
    again = Plan.from_json(p.to_json())
    assert again.slow_ranks == (2,) and again == p
    assert Plan.from_json(plan(Topology.preset("shm:4"), cache=False).to_json()).slow_ranks == ()


@pytest.mark.parametrize("bad", [[4], [2, 1], [1, 1], [-1]])
def test_plan_json_with_bad_slow_ranks_is_refused(bad):
    from jax_blink.planning import Plan
    d = json.loads(plan(Topology.preset("shm:4"), slow_ranks=[1], cache=False).to_json())
    d["slow_ranks"] = bad
    with pytest.raises(PlanError, match="slow_ranks must be distinct ranks 0..3"):
        Plan.from_json(d)
