"""Planner: reference values, certificates, lowering, caching, CLI and bad input."""

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jax_blink.planning import MAX_CHUNKS_PER_TREE, Plan, PlanError, bounds, cache_dir, clear_memory_cache, plan
from jax_blink.planning.rings import best_rings
from jax_blink.schedule import Schedule
from jax_blink.topo import Topology
from strategies import connected_topologies


# ------------------------------------------------------------ reference values
def test_full_dgx1v_allreduce_is_600_over_7_gbps():
    p = plan(Topology.preset("dgx1-v100"), links="fast")  # DESIGN's NVLink-only reference values
    assert p.family == "tree"
    assert p.rate_gbps == pytest.approx(600 / 7, rel=1e-9)  # 85.7 GB/s
    assert p.bound_gbps == pytest.approx(600 / 7, rel=1e-9)
    assert p.ring_rate_gbps == pytest.approx(600 / 7, rel=1e-9)  # rings are optimal here


def test_full_dgx1v_broadcast_is_150_gbps_with_at_most_6_trees():
    p = plan(Topology.preset("dgx1-v100"), "broadcast", root=0, links="fast")
    assert p.rate_gbps == pytest.approx(150.0, rel=1e-9)
    assert p.bound_gbps == pytest.approx(150.0, rel=1e-9)
    assert len(p.trees) <= 6  # Blink's packing uses 6


def test_full_dgx1p_reference_values():
    t = Topology.preset("dgx1-p100")
    assert plan(t, links="fast").rate_gbps == pytest.approx(320 / 7, rel=1e-9)
    assert plan(t, "broadcast", root=3, links="fast").rate_gbps == pytest.approx(80.0, rel=1e-9)


def test_partial_dgx1_without_nvlink_ring_beats_rings():
    # GPUs 0, 1, 2 and 5: 5 hangs off 1 only, so NVLink forms no ring
    p = plan(Topology.preset("dgx1-v100").subset([0, 1, 2, 5]))
    assert p.ring_rate_gbps == 0.0
    assert p.rate_gbps == pytest.approx(p.bound_gbps, rel=1e-6) and p.rate_gbps > 0


def test_nvlink_islands_bridged_by_pcie_reach_the_bound():
    # 0-3 and 5-6 are NVLink pairs with no NVLink between them: PCIe switches bridge them,
    # and trees with the same rank edges but different switch routes are distinct columns
    p = plan(Topology.preset("dgx1-v100").subset([0, 3, 5, 6]))
    assert p.link_kinds == ("nvlink", "pcie")
    assert p.rate_gbps == pytest.approx(p.bound_gbps, rel=1e-6)


def test_shm_allreduce_is_one_depth_1_star_per_rank():
    p = plan(Topology.preset("shm:4"))
    assert p.family == "rsag"
    assert sorted(t.root for t in p.trees) == [0, 1, 2, 3]
    assert all(t.depth == 1 for t in p.trees)
    # hose model: every port carries 2(n-1)/n of the data
    assert p.rate_gbps == pytest.approx(10.0 * 4 / 6, rel=1e-9)


def test_nvswitch_presets_reach_the_port_bound():
    p = plan(Topology.preset("hgx-h100"))
    assert p.rate_gbps == pytest.approx(450.0 * 8 / 14, rel=1e-9)
    assert p.rate_gbps == pytest.approx(p.bound_gbps, rel=1e-6)


def test_reduce_matches_broadcast_on_symmetric_links():
    t = Topology.preset("dgx1-v100").subset([0, 1, 2, 6])
    r, b = plan(t, "reduce", root=2), plan(t, "broadcast", root=2)
    assert r.rate_gbps == pytest.approx(b.rate_gbps, rel=1e-9)
    r.lower(4096, "float32").validate()


def test_max_trees_and_tolerance_trade_rate_for_trees():
    t = Topology.preset("dgx1-v100").subset([0, 1, 2, 3, 4])
    full = plan(t)
    one = plan(t, max_trees=1)
    assert len(one.trees) == 1 and one.rate_gbps <= full.rate_gbps * (1 + 1e-9)
    loose = plan(t, tolerance=0.2)
    assert len(loose.trees) <= len(full.trees)
    assert loose.rate_gbps >= 0.8 * full.rate_gbps * (1 - 1e-9)


# ---------------------------------------------------------------- properties
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(connected_topologies(), st.data())
def test_random_topologies_reach_their_certified_bound(topology, data):
    allreduce = plan(topology, cache=False)
    assert allreduce.rate_gbps == pytest.approx(allreduce.bound_gbps, rel=1e-6)
    assert allreduce.bound_gbps == pytest.approx(bounds.tree_packing_bound(topology.link_graph()), rel=1e-6)
    assert allreduce.rate_gbps >= allreduce.ring_rate_gbps * (1 - 1e-6)
    root = data.draw(st.integers(0, topology.n - 1))
    bcast = plan(topology, "broadcast", root=root, cache=False)
    assert bcast.rate_gbps == pytest.approx(bounds.broadcast_bound(topology.link_graph(), root), rel=1e-6)
    for p in (allreduce, bcast):
        schedule = p.lower(4 * data.draw(st.integers(1, 3000)), "float32").validate()
        # the planner's routes ride along (trees too light for one aligned block are left out)
        assert len(schedule.routes) == schedule.ntrees
        assert all(routes in [t.paths for t in p.trees] for routes in schedule.routes)
        assert Schedule.decode(schedule.encode()) == dataclasses.replace(schedule, routes=())  # not encoded
        assert Schedule.from_json(schedule.to_json()) == schedule
        again = Plan.from_json(p.to_json())
        assert again.trees == p.trees and again.rate_gbps == p.rate_gbps


@settings(max_examples=10, deadline=None)
@given(st.integers(2, 5), st.lists(st.floats(1.0, 100.0), min_size=5, max_size=5))
def test_random_switch_topologies_reach_their_bound(n, ports):
    topology = Topology.from_links(n, [(r, n, ports[r], "pcie") for r in range(n)], ["switch"])
    p = plan(topology, cache=False)
    assert p.rate_gbps == pytest.approx(p.bound_gbps, rel=1e-6)
    b = plan(topology, "broadcast", root=n - 1, cache=False)
    assert b.rate_gbps == pytest.approx(bounds.broadcast_bound(topology.link_graph(), n - 1), rel=1e-6)


def test_dual_bound_holds_for_any_prices():
    graph = Topology.preset("dgx1-p100").link_graph()
    rng = np.random.default_rng(0)
    for _ in range(5):
        assert bounds.dual_bound(graph, rng.uniform(0, 1, len(graph.arcs)), "both") >= 320 / 7 * (1 - 1e-9)


def test_no_ring_where_fast_links_form_a_tree():
    star = Topology.from_links(4, [(0, 1, 10), (0, 2, 10), (0, 3, 10)])
    assert best_rings(star).rate_gbps("allreduce") == 0.0
    ring = Topology.from_links(3, [(0, 1, 10), (1, 2, 10), (2, 0, 10)])
    rings = best_rings(ring)
    assert len(rings.rings) == 2 and rings.total_gbps == pytest.approx(20.0)


# ------------------------------------------------------------------ lowering
def test_lowering_chooses_more_chunks_for_bigger_messages_and_obeys_overrides():
    p = plan(Topology.preset("dgx1-v100"), links="fast")  # hybrid plans hold slivers lower_trees may drop
    small, big = p.chunks_for(4096), p.chunks_for(256 << 20)
    assert all(s <= b for s, b in zip(small, big)) and max(big) > 1
    assert max(big) <= MAX_CHUNKS_PER_TREE
    s = p.lower(1 << 16, "float32", chunks=2).validate()
    assert len(s.chunks) == 2 * len(p.trees)
    per_tree = [1 + i % 3 for i in range(len(p.trees))]
    assert len(p.lower(1 << 16, "bfloat16", chunks=per_tree).validate().chunks) == sum(per_tree)


@pytest.mark.parametrize("size", [0, 6, -4, 4.0])
def test_bad_message_size_is_named(size):
    with pytest.raises(PlanError, match="size_bytes must be a positive multiple of the 4-byte"):
        plan(Topology.preset("shm:2")).lower(size, "float32")


@pytest.mark.parametrize("chunks", [0, True, 1.5, "4", [1, 2], {"a": 1}])
def test_bad_chunk_counts_are_named(chunks):
    from jax_blink.schedule import ScheduleError
    with pytest.raises(ScheduleError, match=r"chunks must be a positive int or one positive int per tree \(3\)"):
        plan(Topology.preset("shm:3")).lower(4000, "float32", chunks=chunks)


# ------------------------------------------------------------------ caching
def test_warm_lookup_is_fast_and_survives_the_process_cache(tmp_path):
    t = Topology.preset("dgx1-v100").subset([0, 1, 3, 6])
    cold = plan(t)
    warm = plan(t)
    assert warm is cold  # the process cache's own object: nothing planned again
    clear_memory_cache()
    disk = plan(Topology.from_json(t.to_json()))  # fresh process cache: read from disk
    assert disk.trees == cold.trees and disk.plan_seconds == cold.plan_seconds


def test_corrupt_cache_file_is_ignored_and_rewritten():
    t = Topology.preset("shm:3")
    first = plan(t)
    files = list(cache_dir().glob("plan-*.json"))
    assert len(files) == 1
    files[0].write_text("{corrupt")
    clear_memory_cache()
    again = plan(t)
    assert again.trees == first.trees
    assert json.loads(files[0].read_text())["format"] == "jax_blink.plan_cache"


def test_plan_json_round_trip_and_tampering_is_caught():
    p = plan(Topology.preset("dgx1-p100").subset([0, 1, 2]), "broadcast", root=1, links="fast")
    assert Plan.from_json(p.to_json()) == p
    data = p.to_dict()
    data["trees"][0]["weight"] *= 10
    with pytest.raises(PlanError, match="over its capacity|does not match"):
        Plan.from_json(data)
    with pytest.raises(PlanError, match="malformed plan JSON"):
        Plan.from_json("{oops")
    data = p.to_dict()
    tree = data["trees"][0]
    tree["paths"][0] = [tree["edges"][0][0], 3, tree["edges"][0][1]]  # through a switch the plan may not use
    with pytest.raises(PlanError, match="tree 0 .*which has no nvlink link"):
        Plan.from_json(data)


# ------------------------------------------------------------------ bad input
def test_disconnected_topology_names_its_components():
    t = Topology.from_links(5, [(0, 1, 10), (1, 2, 10), (3, 4, 10)])
    with pytest.raises(PlanError, match=r"is disconnected: no link joins its 2 groups of ranks "
                                        r"\[0, 1, 2\] and \[3, 4\]"):
        plan(t)


@pytest.mark.parametrize("kwargs, message", [
    (dict(collective="broadcast", root=4), "root 4 is out of range: .* ranks 0..3"),
    (dict(collective="reduce", root=-1), "root -1 is out of range"),
    (dict(collective="allreduce", root=0), "allreduce has no root"),
    (dict(collective="alltoall"), "unknown collective 'alltoall'"),
    (dict(max_trees=0), "max_trees must be a positive integer"),
    (dict(tolerance=1.5), r"tolerance must be a number in \[0, 1\)"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(PlanError, match=message):
        plan(Topology.preset("shm:4"), **kwargs)


def test_single_rank_and_non_topology_are_rejected():
    with pytest.raises(PlanError, match="1 rank"):
        plan(Topology.preset("shm:1"))
    with pytest.raises(PlanError, match="needs a jax_blink.Topology"):
        plan("dgx1-v100")


# ----------------------------------------------------------------- no jax, CLI
def test_planning_never_imports_jax():
    code = textwrap.dedent("""
        import sys
        sys.modules["jax"] = None  # any import of jax now fails
        from jax_blink import plan
        from jax_blink.cli import bench_cmd, plan_cmd, sizes
        from jax_blink.topo import Topology, detect, presets
        from jax_blink.sim import simulate, tune
        p = plan(Topology.preset("shm:3"), cache=False)
        p.lower(1024, "float32").validate()
        print("ok")
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         env={**os.environ, "PYTHONPATH": root})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ------------------------------------------------------- large or extreme inputs
def test_more_ranks_than_the_limit_are_refused_before_any_work(monkeypatch):
    from jax_blink.planning import MAX_RANKS, planner

    def never(*args, **kwargs):
        raise AssertionError("planning started")

    monkeypatch.setattr(planner, "Packer", never)
    monkeypatch.setattr(planner.plan_cache, "lookup", never)
    t = Topology.preset(f"shm:{MAX_RANKS + 1}")
    with pytest.raises(PlanError, match=f"shm:{MAX_RANKS + 1} has {MAX_RANKS + 1} ranks; plan\\(\\) plans "
                                        f"for at most {MAX_RANKS} ranks"):
        plan(t)


@pytest.mark.parametrize("links, rate", [
    ([(0, 1, 1e-6), (1, 2, 1e6), (0, 2, 1e6, "pcie")], 1e-6),  # NVLink's bottleneck 12 decades below the rest
    ([(0, 1, 1e-6), (1, 2, 1e-6)], 1e-6),
    ([(0, 1, 1e6), (1, 2, 1e6), (0, 2, 1e6)], None),
    ([(0, 3, 1e6, "shm"), (1, 3, 1e6, "shm"), (2, 3, 1e-3, "shm")], None),  # one slow port on a switch
], ids=["bottleneck", "all-slow", "all-fast", "slow-port"])
@pytest.mark.parametrize("collective, root", [("allreduce", None), ("broadcast", 0), ("reduce", 2)])
def test_extreme_bandwidths_plan_to_the_bound(links, rate, collective, root):
    t = Topology.from_links(3, links, ["switch"] if len(links[0]) == 4 and links[0][3] == "shm" else [])
    p = plan(t, collective, root=root, cache=False, links="fast")  # "bottleneck": NVLink alone joins the ranks
    assert p.rate_gbps == pytest.approx(p.bound_gbps, rel=1e-6)
    if rate is not None:
        assert p.rate_gbps == pytest.approx(rate, rel=1e-6)


def test_a_milp_without_a_solution_in_time_falls_back_to_the_lp_trees(monkeypatch):
    from jax_blink.planning import fewest
    monkeypatch.setattr(fewest, "MILP_TIME_LIMIT_S", 1e-9)  # the MILP stops before any incumbent
    p = plan(Topology.preset("dgx1-v100"), cache=False, links="fast")
    assert p.rate_gbps == pytest.approx(600 / 7, rel=1e-9)
