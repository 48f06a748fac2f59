"""The simulator against closed forms, and its documented sharing and routing rules."""

import math
import sys
from types import SimpleNamespace as Tree

import pytest
from hypothesis import given, settings, strategies as st

from jax_blink.schedule import lower_trees
from jax_blink.sim import SimError, SimModel, simulate
from jax_blink.sim.baselines import ring_allreduce
from jax_blink.topo import Topology

IDEAL = dict(step_overhead_us=0.0, reduce_gbps=math.inf)


def ring_topology(n, gbps):
    return Topology.from_links(n, [(i, (i + 1) % n, gbps) for i in range(n)] if n > 2 else [(0, 1, gbps)])


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 8), st.sampled_from([10.0, 25.0, 50.0]), st.sampled_from([0.5, 2.0, 10.0]),
       st.integers(1, 4096))
def test_ring_allreduce_matches_the_closed_form(n, gbps, alpha_us, blocks):
    size = n * 64 * blocks  # n equal chunks
    topo = ring_topology(n, gbps)
    s = ring_allreduce(topo, size, rings=[(tuple(range(n)), gbps)], loops=1).validate()
    r = simulate(s, topo, model=SimModel(latency_us={"nvlink": alpha_us}, **IDEAL))
    expected = 2 * (n - 1) * alpha_us * 1e-6 + 2 * (n - 1) / n * size / (gbps * 1e9)
    assert r.time_s == pytest.approx(expected, rel=0.01)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 7), st.integers(1, 32), st.sampled_from([10.0, 25.0]),
       st.sampled_from([0.5, 5.0]), st.integers(1, 256))
def test_pipelined_chain_broadcast_matches_the_closed_form(links, k, gbps, alpha_us, blocks):
    # P = links: P alpha + (P - 1 + k) S / (k B) for a chain of P links, k chunks (latency pipelined)
    size = k * 64 * blocks
    topo = Topology.from_links(links + 1, [(i, i + 1, gbps) for i in range(links)])
    path = Tree(root=0, edges=[(i, i + 1) for i in range(links)], weight=1.0)
    s = lower_trees([path], nranks=links + 1, collective="broadcast", root=0, count=size // 4,
                    dtype="float32", chunks=k).validate()
    assert len(s.chunks) == k
    r = simulate(s, topo, model=SimModel(latency_us={"nvlink": alpha_us}, **IDEAL))
    expected = links * alpha_us * 1e-6 + (links - 1 + k) * size / (k * gbps * 1e9)
    assert r.time_s == pytest.approx(expected, rel=0.01)


def test_step_overhead_adds_to_every_hop_and_a_slow_reducer_limits_the_transfer():
    n, gbps, size = 4, 20.0, 4 * 2**20
    topo = ring_topology(n, gbps)
    s = ring_allreduce(topo, size, rings=[(tuple(range(n)), gbps)], loops=1)
    model = SimModel(latency_us={"nvlink": 1.0}, step_overhead_us=3.0, reduce_gbps=100.0)
    per_chunk = size / n
    hop = 3e-6 + 1e-6 + 3e-6  # SEND issued after its overhead, latency, RECV's overhead
    rs = (n - 1) * (hop + per_chunk / (gbps * 1e9))  # reduced as it arrives: 100 GB/s is not the bottleneck
    ag = (n - 1) * (hop + per_chunk / (gbps * 1e9))
    assert simulate(s, topo, model=model).time_s == pytest.approx(rs + ag, rel=1e-9)
    slow = SimModel(latency_us={"nvlink": 1.0}, step_overhead_us=3.0, reduce_gbps=5.0)
    # the reducer, 5 GB/s, paces the reduce-scatter: each of its n - 1 steps moves a chunk through it
    slow_time = simulate(s, topo, model=slow).time_s
    assert (n - 1) * per_chunk / 5e9 + ag < slow_time <= (n - 1) * (hop + per_chunk / 5e9) + ag


def test_transfers_sharing_a_link_split_its_bandwidth():
    # two single-chunk broadcast trees 0 -> 1 over one 10 GB/s link: processor sharing
    topo = Topology.from_links(2, [(0, 1, 10.0)])
    trees = [Tree(root=0, edges=[(0, 1)], weight=1.0)] * 2
    s = lower_trees(trees, nranks=2, collective="broadcast", root=0, count=2**20, dtype="float32")
    r = simulate(s, topo, model=SimModel(latency_us={"nvlink": 0.0}, **IDEAL))
    assert r.time_s == pytest.approx(4 * 2**20 / 10e9)
    assert r.link_utilisation[(0, 1)] == pytest.approx(1.0)
    assert r.link_utilisation[(1, 0)] == 0.0
    assert r.tree_finish_s == pytest.approx((r.time_s, r.time_s))


def test_link_channels_serialise_trees_on_a_hop():
    topo = Topology.from_links(2, [(0, 1, 10.0)])
    trees = [Tree(root=0, edges=[(0, 1)], weight=1.0)] * 2
    s = lower_trees(trees, nranks=2, collective="broadcast", root=0, count=2**20, dtype="float32")
    model = SimModel(latency_us={"nvlink": 5.0}, channels="link", **IDEAL)
    # one stream per link direction: the trees transmit in turn, at the full 10 GB/s each, and the
    # latency is pipelined (paid once, after the last transmission)
    r = simulate(s, topo, model=model)
    assert r.time_s == pytest.approx(5e-6 + 4 * 2**20 / 10e9)
    assert r.tree_finish_s[0] == pytest.approx(5e-6 + 2 * 2**20 / 10e9)  # tree 0 does not share the link


def test_full_duplex_directions_do_not_interfere():
    topo = Topology.from_links(2, [(0, 1, 10.0)])
    s = ring_allreduce(topo, 2**20, rings=[((0, 1), 10.0)], loops=1)
    r = simulate(s, topo, model=SimModel(latency_us={"nvlink": 0.0}, **IDEAL))
    # each rank sends half the vector to the other, both at once
    assert r.time_s == pytest.approx(2 * (2**20 / 2) / 10e9)


def test_a_hop_through_a_switch_uses_both_ports():
    # ranks 0, 1 send to rank 2 through a switch: rank 2's port is the bottleneck
    topo = Topology.from_links(3, [(r, 3, 10.0, "pcie") for r in range(3)], ["sw"])
    graph = topo.link_graph(topo.kinds())
    assert [graph.arcs[a] for a in graph.route(0, 2)] == [(0, 3), (3, 2)]
    star = Tree(root=2, edges=[(2, 0), (2, 1)], weight=1.0)
    s = lower_trees([star], nranks=3, collective="reduce", root=2, count=2**20, dtype="float32")
    r = simulate(s, topo, model=SimModel(latency_us={"pcie": 0.0}, **IDEAL))
    assert r.time_s == pytest.approx(2 * 4 * 2**20 / 10e9)
    assert r.link_utilisation[(3, 2)] == pytest.approx(1.0)
    assert r.link_utilisation[(0, 3)] == pytest.approx(0.5)


def test_size_override_scales_the_bandwidth_term():
    topo = ring_topology(4, 25.0)
    s = ring_allreduce(topo, 4 * 2**20, rings=[((0, 1, 2, 3), 25.0)], loops=1)
    model = SimModel(latency_us={"nvlink": 0.0}, **IDEAL)
    small, big = simulate(s, topo, model=model), simulate(s, topo, size_bytes=8 * 2**20, model=model)
    assert big.time_s == pytest.approx(2 * small.time_s)
    assert big.size_bytes == 8 * 2**20 and big.algbw_gbps == pytest.approx(small.algbw_gbps)


def test_bus_bandwidth_follows_nccl_tests():
    topo = ring_topology(4, 25.0)
    s = ring_allreduce(topo, 2**24, rings=[((0, 1, 2, 3), 25.0)], loops=1)
    r = simulate(s, topo)
    assert r.busbw_gbps == pytest.approx(r.algbw_gbps * 2 * 3 / 4)
    assert r.algbw_gbps == pytest.approx(2**24 / r.time_s / 1e9)


def test_the_simulator_follows_the_routes_a_schedule_carries():
    # ranks 0 and 1: a direct 10 GB/s link, and 100 GB/s ports on a switch (node 2)
    topo = Topology.from_links(2, [(0, 1, 10.0), (0, 2, 100.0), (1, 2, 100.0)], ["sw"])
    edge = Tree(root=0, edges=[(0, 1)], weight=1.0)
    size = 4 * 2**20
    model = SimModel(latency_us={"nvlink": 0.0}, **IDEAL)
    plain = lower_trees([edge], nranks=2, collective="broadcast", root=0, count=size // 4, dtype="float32")
    routed = lower_trees([edge], nranks=2, collective="broadcast", root=0, count=size // 4, dtype="float32",
                         routes=[[(0, 2, 1)]]).validate()
    assert simulate(plain, topo, model=model).time_s == pytest.approx(size / 10e9)  # default: the direct link
    r = simulate(routed, topo, model=model)
    assert r.time_s == pytest.approx(size / 100e9)  # the carried route through the switch
    assert r.link_bytes[(0, 2)] == r.link_bytes[(2, 1)] == size and r.link_bytes[(0, 1)] == 0
    reduce = lower_trees([edge], nranks=2, collective="reduce", root=0, count=size // 4, dtype="float32",
                         routes=[[(0, 2, 1)]])
    assert simulate(reduce, topo, model=model).link_bytes[(1, 2)] == size  # child to parent: reversed


def test_a_plans_schedule_is_simulated_on_the_plans_routes():
    from jax_blink.planning import plan

    topo = Topology.preset("dgx1-v100").subset([0, 5])  # no NVLink: the plan routes over PCIe and QPI
    p = plan(topo)
    schedule = p.lower(2**20, "float32")
    assert schedule.routes and all(len(path) > 2 for paths in schedule.routes for path in paths)
    used = {arc for arc, nbytes in simulate(schedule, topo).link_bytes.items() if nbytes}
    planned = {(x, y) for t in p.trees for path in t.paths for x, y in zip(path, path[1:])}
    assert used == planned | {(y, x) for x, y in planned}


def test_bad_inputs_raise_clear_errors():
    topo = ring_topology(4, 25.0)
    s = ring_allreduce(topo, 4096, rings=[((0, 1, 2, 3), 25.0)], loops=1)
    with pytest.raises(SimError, match="4 ranks but the topology has 3"):
        simulate(s, ring_topology(3, 25.0))
    with pytest.raises(SimError, match="size_bytes must be > 0"):
        simulate(s, topo, size_bytes=0)
    with pytest.raises(SimError, match="joined by no link"):
        simulate(s, Topology.from_links(4, [(0, 1, 1.0), (2, 3, 1.0)]))
    with pytest.raises(SimError, match="reduce_gbps"):
        SimModel(reduce_gbps=0)
    with pytest.raises(SimError, match="no latency for link kind"):
        SimModel(latency_us={}).latency_s("carrier-pigeon")
    chain = Tree(root=0, edges=[(0, 1), (1, 2), (2, 3)], weight=1.0)
    elsewhere = lower_trees([chain], nranks=4, collective="broadcast", root=0, count=1024, dtype="float32",
                            routes=[[(0, 1), (1, 2), (2, 3)]])
    with pytest.raises(SimError, match="uses 1-2, which has no nvlink link"):  # a route the topology lacks
        simulate(elsewhere, Topology.from_links(4, [(0, 1, 1.0), (1, 3, 1.0), (3, 2, 1.0)]))


def test_simulation_never_imports_jax(monkeypatch):
    for name in [m for m in sys.modules if m == "jax" or m.startswith(("jax.", "jax_blink"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "jax", None)
    import jax_blink.sim.baselines
    import jax_blink.sim.comparison  # noqa: F401


def test_every_dgx1_allocation_of_five_simulates_every_baseline():
    import itertools

    from jax_blink.sim.baselines import all_baselines

    topo = Topology.preset("dgx1-v100")
    for sub in itertools.combinations(range(8), 5):
        t = topo.subset(sub)
        for s in all_baselines(t, 2**20).values():
            assert simulate(s, t).time_s > 0


def test_tune_is_never_slower_than_the_plain_lowering():
    from jax_blink.planning import plan
    from jax_blink.sim import tune

    topo = Topology.preset("dgx1-v100").subset([0, 1, 2, 3])
    p = plan(topo)
    for size in (2**12, 2**20, 2**24):
        tuned = tune(p, size)
        tuned.schedule.validate()
        assert tuned.result.time_s <= simulate(p.lower(size, "float32"), topo).time_s * (1 + 1e-12)
        assert tuned.candidates >= 2
    # at 4 KB latency dominates: the star packing (two hops) wins
    assert tune(p, 2**12).num_trees == topo.n
    assert tune(p, 2**12, stars=False).result.time_s >= tune(p, 2**12).result.time_s


def test_tune_keeps_its_choice_on_disk_and_ignores_an_entry_that_does_not_fit(tmp_path, monkeypatch, caplog):
    import json

    from jax_blink.planning import plan
    from jax_blink.sim import tune

    monkeypatch.setenv("JAX_BLINK_CACHE_DIR", str(tmp_path))
    topo = Topology.preset("dgx1-v100").subset([0, 1, 2, 3, 5])
    p = plan(topo, cache=False)
    first = tune(p, 2**20, cache=True)
    assert first.candidates > 1
    [entry] = tmp_path.glob("tune-*.json")
    again = tune(p, 2**20, cache=True)  # the cached candidate is lowered; its simulation is on disk
    assert again.candidates == 0 and again.result == first.result and again.seconds == first.seconds
    assert again.schedule.encode().tobytes() == first.schedule.encode().tobytes()
    data = json.loads(entry.read_text())
    value = data["value"]
    wrong_ranks = {**value["result"], "nranks": 3}
    for bad, why in (({**data, "value": {**value, "candidate": 999}}, "does not fit the plan"),
                     ({**data, "value": {**value, "chunks": [0] * len(value["chunks"])}}, "does not fit the plan"),
                     ({**data, "value": {**value, "result": wrong_ranks}}, "not one of this plan's"),
                     ({**data, "value": {**value, "result": {}}}, "ignoring"),
                     ({**data, "key": {**data["key"], "size_bytes": 1}}, "another request or version"),
                     ({**data, "key": {**data["key"], "sources": "an older jax_blink"}}, "another request or version")):
        entry.write_text(json.dumps(bad))
        caplog.clear()
        redo = tune(p, 2**20, cache=True)
        assert redo.candidates > 1 and why in caplog.text
        assert redo.schedule.encode().tobytes() == first.schedule.encode().tobytes()
    entry.write_text("{not json")
    assert tune(p, 2**20, cache=True).candidates > 1 and "ignoring" in caplog.text
    assert tune(p, 2**21, cache=True).candidates > 1  # another size: another entry
    assert len(list(tmp_path.glob("tune-*.json"))) == 2


def test_the_reducer_is_the_topology_s_unless_the_model_gives_one():
    from jax_blink.sim import DEFAULT_REDUCE_GBPS
    from jax_blink.topo import TopologyError

    v100, h100 = Topology.preset("dgx1-v100"), Topology.preset("hgx-h100")
    assert v100.reduce_gbps == pytest.approx(300.0) and h100.reduce_gbps == pytest.approx(3350 / 3)
    assert v100.subset([0, 1]).reduce_gbps == v100.reduce_gbps
    assert Topology.multi_host("hgx-h100", 2, nic_gbps=50.0).reduce_gbps == h100.reduce_gbps
    assert Topology.preset("pcie").reduce_gbps is None
    assert SimModel().reducer_gbps(Topology.preset("pcie")) == DEFAULT_REDUCE_GBPS
    assert SimModel(reduce_gbps=7.0).reducer_gbps(h100) == 7.0
    # JSON keeps it; the fingerprint (what plans are cached by) does not change with it
    back = Topology.from_json(h100.to_json())
    assert back.reduce_gbps == h100.reduce_gbps and back == h100
    plain = Topology.from_links(8, [(g, 8, 450.0) for g in range(8)], ["nvswitch"])
    assert plain.fingerprint() == h100.fingerprint() and plain != h100
    with pytest.raises(TopologyError, match="reduce_gbps -1 is not a number of GB/s"):
        Topology.from_links(2, [(0, 1, 10.0)], reduce_gbps=-1)
    # two ranks reducing into each other over a 100 GB/s link: the reducer bounds the time
    t = Topology.from_links(2, [(0, 1, 100.0)], reduce_gbps=10.0)
    s = lower_trees([Tree(root=0, edges=[(0, 1)], weight=1.0)], nranks=2, collective="reduce", root=0,
                    count=2**20, dtype="float32")
    quiet = dict(step_overhead_us=0.0, latency_us={"nvlink": 0.0})
    slow = simulate(s, t, model=SimModel(**quiet)).time_s
    fast = simulate(s, t, model=SimModel(reduce_gbps=math.inf, **quiet)).time_s
    assert slow == pytest.approx(4 * 2**20 / 10e9, rel=1e-6) and fast == pytest.approx(4 * 2**20 / 100e9, rel=1e-6)


def test_simulating_leaves_the_garbage_collector_as_it_found_it():
    """simulate() pauses Python's cyclic collector while it runs (jax_blink._gcpause) and
    restores it after, on success and on error, and never turns on one that was off."""
    import gc

    topology = Topology.preset("shm:4")
    schedule = ring_allreduce(topology, 1 << 12)
    seen = []
    model = SimModel()
    original = model.reducer_gbps
    object.__setattr__(model, "reducer_gbps", lambda t: seen.append(gc.isenabled()) or original(t))
    was = gc.isenabled()
    try:
        gc.enable()
        simulate(schedule, topology, model=model)
        assert seen == [False] and gc.isenabled()  # paused inside, restored after
        with pytest.raises(SimError):
            simulate(schedule, topology, size_bytes=0)
        assert gc.isenabled()
        gc.disable()
        simulate(schedule, topology)
        assert not gc.isenabled()  # off before: left off
    finally:
        (gc.enable if was else gc.disable)()
