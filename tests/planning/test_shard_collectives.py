"""Reduce-scatter and all-gather: every rank roots trees for its own 1/N slice (ForestColl).

Rates are nccl-tests' algbw ``S / t`` for the full vector of ``S`` bytes;
they are compared with closed forms (switches, rings), with the cut formula
enumerated here over every node set, and with a flow LP written here that
knows nothing of trees.
"""

import itertools
import json
import math

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from jax_blink.planning import COLLECTIVES, Plan, PlanError, bounds, cache, clear_memory_cache, plan
from jax_blink.planning.collectives import DIRECTIONS, bus_factor
from jax_blink.sim import bus_factor as sim_bus_factor
from jax_blink.topo import Topology
from strategies import connected_topologies

SHARDED = ("allgather", "reduce_scatter")
DGX1V = Topology.preset("dgx1-v100")


def ring(n, gbps):
    return Topology.from_links(n, [(i, (i + 1) % n, gbps) for i in range(n)])


# ------------------------------------------------------------------ independent formulations
def cut_formula_gbps(topology, collective):
    """ForestColl's bound, enumerated: ``N min_S c(out of S) / |S ∩ ranks|`` over every node set
    ``S`` (switches included) holding some but not all ranks (arcs into ``S`` for reduce-scatter)."""
    graph = topology.link_graph(topology.planning_kinds("fast"))
    n, nodes = graph.n, graph.num_nodes
    into = collective == "reduce_scatter"
    best = math.inf
    for size in range(1, nodes):
        for members in itertools.combinations(range(nodes), size):
            inside = set(members)
            ranks = len(inside & set(range(n)))
            if 0 < ranks < n:
                cut = sum(cap for (u, v), cap in zip(graph.arcs, graph.capacity_gbps)
                          if (v in inside and u not in inside if into else u in inside and v not in inside))
                best = min(best, cut / ranks)
    return n * best


def flow_lp_gbps(topology, collective):
    """The largest ``N x`` such that every rank ``r`` gets arc loads ``f_r`` (together within capacity)
    in which ``x`` flows from ``r`` to every other rank (into ``r`` from every other rank for
    reduce-scatter). Edmonds: on a graph of ranks only, such loads hold arborescences of weight ``x``."""
    graph = topology.link_graph(topology.planning_kinds("fast"))
    assert not graph.has_switches
    n, arcs, cap = graph.n, graph.arcs, graph.capacity_gbps
    if collective == "reduce_scatter":
        arcs = [(v, u) for u, v in arcs]  # into r along the arcs = out of r along their reverses
    m = len(arcs)
    pairs = [(r, v) for r in range(n) for v in range(n) if v != r]
    nf, ng = n * m, len(pairs) * m  # variables: x, f[r, a], g[(r, v), a]

    def f(r, a):
        return 1 + r * m + a

    def g(k, a):
        return 1 + nf + k * m + a

    nvar = 1 + nf + ng
    rows, cols, vals, b_ub = [], [], [], []
    row = 0
    for a in range(m):  # sum_r f[r, a] <= c_a
        for r in range(n):
            rows.append(row), cols.append(f(r, a)), vals.append(1.0)
        b_ub.append(cap[a])
        row += 1
    for k, (r, _) in enumerate(pairs):  # g[(r, v), a] <= f[r, a]
        for a in range(m):
            rows += [row, row]
            cols += [g(k, a), f(r, a)]
            vals += [1.0, -1.0]
            b_ub.append(0.0)
            row += 1
    a_ub = sp.csr_matrix((vals, (rows, cols)), shape=(row, nvar))
    rows, cols, vals = [], [], []
    row = 0
    for k, (r, v) in enumerate(pairs):  # out - in = x at r, -x at v, 0 elsewhere
        for node in range(n):
            for a, (p, q) in enumerate(arcs):
                if p == node:
                    rows.append(row), cols.append(g(k, a)), vals.append(1.0)
                if q == node:
                    rows.append(row), cols.append(g(k, a)), vals.append(-1.0)
            if node in (r, v):
                rows.append(row), cols.append(0), vals.append(-1.0 if node == r else 1.0)
            row += 1
    a_eq = sp.csr_matrix((vals, (rows, cols)), shape=(row, nvar))
    objective = np.zeros(nvar)
    objective[0] = -1.0
    res = linprog(objective, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.zeros(row), bounds=(0, None),
                  method="highs")
    assert res.status == 0, res.message
    return n * res.x[0]


# ------------------------------------------------------------------ closed forms
@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("collective", SHARDED)
def test_a_switch_reaches_port_bandwidth_times_n_over_n_minus_1(n, collective):
    port = 10.0  # shm:N: one host-memory switch, 10 GB/s ports
    p = plan(Topology.preset(f"shm:{n}"), collective)
    assert p.family == "rsag" and p.root is None
    assert p.rate_gbps == pytest.approx(port * n / (n - 1), rel=1e-9)
    assert p.busbw_gbps == pytest.approx(port, rel=1e-9)
    assert p.bound_gbps == pytest.approx(p.rate_gbps, rel=1e-9)
    assert sorted(t.root for t in p.trees) == list(range(n))  # one depth-1 star per rank
    assert all(t.depth == 1 for t in p.trees)


@pytest.mark.parametrize("name, port", [("dgx-a100", 300.0), ("hgx-h100", 450.0)])
def test_nvswitch_machines_reach_the_port_bound(name, port):
    for collective in SHARDED:
        p = plan(Topology.preset(name), collective)
        assert p.rate_gbps == pytest.approx(port * 8 / 7, rel=1e-9)


@pytest.mark.parametrize("n", [3, 4, 5, 6, 8])
@pytest.mark.parametrize("collective", SHARDED)
def test_a_bidirectional_ring_moves_s_bytes_in_n_minus_1_over_n_times_s_over_2b(n, collective):
    b, size = 20.0, 1e9  # GB/s per direction; bytes of the full vector
    p = plan(ring(n, b), collective)
    # every rank receives (N-1)/N of the vector, on its two links
    assert size / p.rate_gbps == pytest.approx((n - 1) / n * size / (2 * b), rel=1e-9)
    assert p.bound_gbps == pytest.approx(p.rate_gbps, rel=1e-9)
    assert p.busbw_gbps == pytest.approx(2 * b, rel=1e-9)


def test_full_dgx1_gathers_at_every_gpus_nvlink_bandwidth():
    # every GPU has 150 (V100: 6 x 25) or 80 (P100: 4 x 20) GB/s of NVLink in and out,
    # and receives 7/8 of the vector: algbw = 8/7 of it, busbw = all of it
    for name, per_gpu in [("dgx1-v100", 150.0), ("dgx1-p100", 80.0)]:
        for collective in SHARDED:
            p = plan(Topology.preset(name), collective, links="fast")
            assert p.rate_gbps == pytest.approx(per_gpu * 8 / 7, rel=1e-9)
            assert p.busbw_gbps == pytest.approx(per_gpu, rel=1e-9)
            assert p.ring_rate_gbps == pytest.approx(per_gpu * 8 / 7, rel=1e-9)  # rings are optimal here


# ------------------------------------------------------------------ independent formulations
ALLOCATIONS = [list(range(8)), [0, 1, 2, 3, 4], [0, 1, 2, 5, 6], [0, 1, 4, 5, 7], [0, 1, 2, 5], [1, 2, 4, 7, 3]]


@pytest.mark.parametrize("gpus", ALLOCATIONS, ids=lambda g: ",".join(map(str, g)))
@pytest.mark.parametrize("collective", SHARDED)
def test_dgx1v_allocations_match_a_flow_lp_and_the_cut_formula(gpus, collective):
    t = DGX1V.subset(gpus)
    p = plan(t, collective, links="fast")  # hybrid plans: tests/planning/test_hybrid.py
    assert p.link_kinds == ("nvlink",)
    assert p.rate_gbps == pytest.approx(flow_lp_gbps(t, collective), rel=1e-6)
    assert p.rate_gbps == pytest.approx(cut_formula_gbps(t, collective), rel=1e-6)
    assert p.bound_gbps == pytest.approx(p.rate_gbps, rel=1e-6)


def test_a_five_gpu_dgx1v_allocation_is_held_back_by_its_single_link_gpu():
    # GPU 4 reaches 0..3 only over its 50 GB/s link to GPU 0: the other four slices enter it there
    p = plan(DGX1V.subset([0, 1, 2, 3, 4]), "allgather", links="fast")
    assert p.rate_gbps == pytest.approx(5 * 50.0 / 4, rel=1e-9)


@pytest.mark.parametrize("gpus", [[0, 3, 5, 6], [0, 5], [1, 6, 7]], ids=lambda g: ",".join(map(str, g)))
@pytest.mark.parametrize("collective", SHARDED)
def test_nvlink_islands_bridged_by_pcie_switches_match_the_cut_formula(gpus, collective):
    t = DGX1V.subset(gpus)
    p = plan(t, collective)
    assert "pcie" in p.link_kinds
    assert any(len(path) > 2 for tree in p.trees for path in tree.paths)  # routes through switches
    assert p.rate_gbps == pytest.approx(cut_formula_gbps(t, collective), rel=1e-6)
    assert p.bound_gbps == pytest.approx(p.rate_gbps, rel=1e-6)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(connected_topologies(), st.sampled_from(SHARDED))
def test_random_topologies_reach_the_cut_formula(topology, collective):
    p = plan(topology, collective, cache=False)
    formula = cut_formula_gbps(topology, collective)
    assert p.rate_gbps == pytest.approx(formula, rel=1e-6)
    assert p.bound_gbps == pytest.approx(formula, rel=1e-6)
    assert bounds.shard_bound(topology.link_graph(), collective == "reduce_scatter") == \
        pytest.approx(formula, rel=1e-9)


@settings(max_examples=10, deadline=None)
@given(st.integers(2, 5), st.lists(st.floats(1.0, 100.0), min_size=5, max_size=5), st.sampled_from(SHARDED))
def test_random_switch_ports_reach_the_cut_formula(n, ports, collective):
    topology = Topology.from_links(n, [(r, n, ports[r], "pcie") for r in range(n)], ["switch"])
    p = plan(topology, collective, cache=False)
    assert p.rate_gbps == pytest.approx(cut_formula_gbps(topology, collective), rel=1e-6)


def test_cut_search_is_exact_where_ratios_are_close():
    # two candidate sets whose ratios differ in the 7th digit; shm:64 is beyond any enumeration
    t = Topology.from_links(3, [(0, 1, 10.0), (1, 2, 10.0 + 1e-5), (0, 2, 10.0)])
    for collective in SHARDED:
        assert bounds.shard_bound(t.link_graph(), collective == "reduce_scatter") == \
            pytest.approx(cut_formula_gbps(t, collective), rel=1e-12)
    assert bounds.shard_bound(Topology.preset("shm:64").link_graph()) == pytest.approx(10.0 * 64 / 63, rel=1e-12)


# ------------------------------------------------------------------ certificate
def test_per_root_dual_bound_holds_for_any_prices_and_the_lp_prices_are_tight():
    graph = Topology.preset("dgx1-p100").link_graph(("nvlink",))
    optimum = 80.0 * 8 / 7
    rng = np.random.default_rng(0)
    for directions in ("down", "up"):
        for _ in range(5):
            assert bounds.dual_bound(graph, rng.uniform(0, 1, len(graph.arcs)), directions) >= optimum * (1 - 1e-9)
    from jax_blink.planning.packing import Packer
    for collective in SHARDED:
        _, _, prices = Packer(graph, collective, "rsag", None).generate()
        assert bounds.dual_bound(graph, prices, DIRECTIONS[collective]) == pytest.approx(optimum, rel=1e-6)


def test_certified_bound_of_a_sharded_collective_is_the_cut_or_a_dual_bound():
    graph = DGX1V.link_graph(("nvlink",))
    assert bounds.certified_bound(graph, "allgather", None, []) == pytest.approx(150 * 8 / 7, rel=1e-9)
    uniform = np.ones(len(graph.arcs))  # every tree costs 7 arcs: 8 * sum(c) / (8 * 7) = 1200 / 7
    assert bounds.dual_bound(graph, uniform, "down") == pytest.approx(1200 / 7, rel=1e-9)
    one_arc = np.eye(len(graph.arcs))[0]  # trees avoid the arc: no bound
    assert bounds.dual_bound(graph, one_arc, "up") == math.inf
    assert bounds.certified_bound(graph, "reduce_scatter", None, [one_arc]) == pytest.approx(150 * 8 / 7)


# ------------------------------------------------------------------ Plan.check
def _data(collective="allgather", topology=Topology.preset("shm:4")):
    return plan(topology, collective).to_dict()


def test_plans_of_both_collectives_load_back_and_check():
    for collective in SHARDED:
        p = plan(DGX1V.subset([0, 1, 2, 5, 6]), collective)
        assert Plan.from_json(p.to_json()) == p
        assert f"{collective} on dgx1-v100[0,1,2,5,6]" in p.summary()


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["trees"][0].update(weight=d["trees"][0]["weight"] / 2), "ranks root unequal weights"),
    (lambda d: d.update(trees=d["trees"][1:]), "ranks root unequal weights"),  # rank 0 roots nothing
    (lambda d: d.update(family="tree"), "cannot have family 'tree'; expected 'rsag'"),
    (lambda d: d.update(root=0), "allgather plan has no root, got root 0"),
    (lambda d: d.update(collective="allreduce"), "over its capacity"),  # allreduce loads both directions
    (lambda d: d.update(collective="gather"), "unknown collective 'gather'"),
    (lambda d: d["trees"][0].update(edges=d["trees"][0]["edges"][:-1], paths=d["trees"][0]["paths"][:-1]),
     "does not span the ranks"),
    (lambda d: d.update(bound_gbps=d["bound_gbps"] / 2), "exceeds the certified bound"),
], ids=["unequal", "root-missing", "family", "root", "directions", "collective", "spanning", "bound"])
def test_check_refuses_broken_sharded_plans(edit, message):
    data = _data()
    edit(data)
    with pytest.raises(PlanError, match=message):
        Plan.from_json(data)


def test_trees_are_loaded_in_their_collectives_direction():
    # one 10 GB/s link: each rank sends its slice over its own direction at 10 GB/s
    t = Topology.from_links(2, [(0, 1, 10.0)])
    for collective in SHARDED:
        p = plan(t, collective)
        assert p.rate_gbps == pytest.approx(20.0, rel=1e-9)
        (a,), (b,) = [tr.edges for tr in p.trees]
        assert {a, b} == {(0, 1), (1, 0)}
    assert plan(t).rate_gbps == pytest.approx(10.0, rel=1e-9)  # allreduce: 2(N-1)/N of the vector each way


# ------------------------------------------------------------------ arguments, few trees, lowering
@pytest.mark.parametrize("collective", SHARDED)
def test_bad_arguments_are_named(collective):
    t = Topology.preset("shm:4")
    with pytest.raises(PlanError, match=f"{collective} has no root; pass root=None"):
        plan(t, collective, root=0)
    with pytest.raises(PlanError, match=f"max_trees=3 is too few for {collective}: .* needs max_trees >= 4"):
        plan(t, collective, max_trees=3)


def test_max_trees_and_tolerance_keep_one_tree_group_per_rank():
    t = DGX1V.subset([0, 1, 2, 3, 5, 6])
    full = plan(t, "allgather")
    few = plan(t, "allgather", max_trees=6)
    assert len(few.trees) == 6 and sorted(tr.root for tr in few.trees) == list(range(6))
    assert few.rate_gbps <= full.rate_gbps * (1 + 1e-9)
    loose = plan(t, "allgather", tolerance=0.25)
    assert len(loose.trees) <= len(full.trees)
    assert loose.rate_gbps >= 0.75 * full.rate_gbps * (1 - 1e-9)


def test_full_dgx1_uses_few_trees():
    for collective in SHARDED:
        assert len(plan(DGX1V, collective, links="fast").trees) <= 32


@pytest.mark.parametrize("collective", SHARDED)
def test_plans_lower_into_schedules_that_prove_their_collective(collective):
    """Schedule format v2 carries both: the lowered schedule passes the
    symbolic proof (every shard reduced into, or delivered from, its rank)."""
    for topology in (Topology.preset("shm:3"), DGX1V.subset([0, 1, 2, 5, 6])):
        n = topology.n
        p = plan(topology, collective)
        s = p.lower(4 * n * 1000, "float32").validate()
        assert s.collective == collective and s.count == n * 1000
        assert (s.in_count, s.out_count) == ((n * 1000, 1000) if collective == "reduce_scatter"
                                             else (1000, n * 1000))


# ------------------------------------------------------------------ vocabulary, cache, CLI
def test_the_planner_lists_its_collectives_and_their_bus_factors():
    assert set(SHARDED) <= set(COLLECTIVES)
    assert bus_factor("allgather", 8) == bus_factor("reduce_scatter", 8) == pytest.approx(7 / 8)
    assert bus_factor("allreduce", 8) == pytest.approx(14 / 8) and bus_factor("broadcast", 8) == 1.0
    assert sim_bus_factor is bus_factor
    with pytest.raises(PlanError, match="unknown collective 'gather'"):
        bus_factor("gather", 8)


def test_each_collective_has_its_own_cache_entry_and_a_swapped_one_is_refused():
    t = Topology.preset("shm:4")
    plans = {c: plan(t, c) for c in ("allreduce",) + SHARDED}
    keys = {c: cache.cache_key(t, (c, None, None, 0.0, "all")) for c in plans}
    assert len({cache.entry_path(k) for k in keys.values()}) == 3
    clear_memory_cache()
    for c, p in plans.items():
        assert plan(t, c) == p  # read back from disk
    entry = json.loads(cache.entry_path(keys["allgather"]).read_text())
    entry["plan"] = plans["reduce_scatter"].to_dict()
    with pytest.raises(PlanError, match="the plan is for reduce_scatter"):
        cache.check_entry(entry, keys["allgather"])
    entry = json.loads(cache.entry_path(keys["allgather"]).read_text())
    for tree in entry["plan"]["trees"]:
        tree["weight"] /= 2
    entry["plan"]["rate_gbps"] /= 2
    with pytest.raises(PlanError, match="below the certified bound"):
        cache.check_entry(entry, keys["allgather"])


@pytest.mark.parametrize("collective", SHARDED)
def test_cli_plans_the_collective(collective, capsys):
    import argparse

    from jax_blink.cli import plan_cmd

    parser = argparse.ArgumentParser()
    plan_cmd.add_parser(parser.add_subparsers())
    args = parser.parse_args(["plan", "--topology", "dgx1-v100", "--gpus", "0,1,2,3,4",
                              "--collective", collective, "--no-cache", "--links", "fast"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{collective} on dgx1-v100[0,1,2,3,4] (5 ranks): family rsag")
    assert "rate 62.5 GB/s (busbw 50)" in out
