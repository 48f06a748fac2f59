"""compare_hosts: the three-phase allreduce, NCCL's flat ring and hierarchical tree, against closed forms."""

import math

import pytest

from jax_blink.planning import plan_hosts
from jax_blink.sim import SimModel, compare_hosts, simulate
from jax_blink.sim.hosts import HOST_ALGORITHMS, flat_ring, hierarchical_tree, host_paths, host_rings
from jax_blink.topo import Topology

SIZE = 2**28
FAST_REDUCER = SimModel(reduce_gbps=math.inf)


@pytest.fixture(scope="module")
def four_a100s():
    """4 DGX A100s, one 25 GB/s NIC each: the NIC is 12x slower than the NVSwitch."""
    return Topology.multi_host("dgx-a100", 4, nic_gbps=25)


def test_rows_and_closed_forms_at_256mb(four_a100s):
    t = four_a100s
    hp = plan_hosts(t)
    rows = compare_hosts(t, SIZE, model=FAST_REDUCER, host_plan=hp)
    assert tuple(rows) == HOST_ALGORITHMS
    n, h, nic = t.n, 4, 25e9
    # the flat ring crosses every NIC once each way with 2(N-1)/N of the vector
    assert rows["nccl-ring"]["time_us"] * 1e-6 == pytest.approx(2 * (n - 1) / n * SIZE / nic, rel=0.02)
    # the three phases: in-host phases at their plans' rates, a ring of 2(H-1)/H across the NICs
    rs, net, ag = (x * 1e-6 for x in rows["blink-3phase"]["phases_us"])
    assert rows["blink-3phase"]["network"] == "ring"
    assert net == pytest.approx(2 * (h - 1) / h * SIZE / nic, rel=0.02)
    assert rs == pytest.approx(SIZE / (hp.reduce_scatter[0].rate_gbps * 1e9), rel=0.02)
    assert ag == pytest.approx(SIZE / (hp.allgather[0].rate_gbps * 1e9), rel=0.02)
    assert rows["blink-3phase"]["time_us"] * 1e-6 == pytest.approx(hp.bandwidth_time_s(SIZE), rel=0.02)
    # no allreduce beats the NICs' cut: each host sends and receives 2(H-1)/H of the vector
    for name, row in rows.items():
        assert row["time_us"] * 1e-6 >= 2 * (h - 1) / h * SIZE / nic * (1 - 1e-9), name
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * (n - 1) / n)
    blink = rows["blink-3phase"]
    assert blink["speedup"] == pytest.approx(
        min(rows["nccl-ring"]["time_us"], rows["nccl-tree"]["time_us"]) / blink["time_us"])
    assert blink["speedup"] > 1.1  # at most 2 * 31 / 32 / 1.5 = 1.29 (the NIC time), less the in-host phases


def test_flat_ring_and_tree_follow_the_hosts_nvlink_rings():
    t = Topology.multi_host("dgx1-v100", 2, nic_gbps=12.5)
    hp = plan_hosts(t)
    paths = host_paths(hp)
    assert [sorted(p) for p in paths] == [list(range(8)), list(range(8, 16))]
    graph = t.link_graph()
    for p in paths:  # consecutive GPUs of a host share an NVLink
        assert all(graph.arc_kind[graph.index[a, b]] == "nvlink" for a, b in zip(p, p[1:]))
    ring = flat_ring(t, 2**20, host_plan=hp).validate()
    tree = hierarchical_tree(t, 2**20, host_plan=hp).validate()
    assert ring.ntrees == len(host_rings(hp)) == 10 and tree.ntrees == 2  # one NIC: one pair of trees
    # the tree's only cross-host transfers are between the chain heads, both on the host's one NIC
    cross = {(r, s.peer) for r, steps in enumerate(tree.steps) for s in steps
             if s.op == "SEND" and (s.peer < 8) != (r < 8)}
    assert cross == {(paths[1][0], paths[0][0]), (paths[0][0], paths[1][0])}
    for schedule in (ring, tree):
        assert simulate(schedule, t).time_s > 0


def test_every_nic_carries_rings_and_trees():
    t = Topology.multi_host("dgx-a100", 2, nic_gbps=25, nics=8)
    hp = plan_hosts(t)
    assert hp.network_gbps == pytest.approx(200)
    ring, tree = flat_ring(t, 2**20, host_plan=hp), hierarchical_tree(t, 2**20, host_plan=hp)
    assert ring.ntrees == 8 and tree.ntrees == 16  # one NVSwitch ring split over 8 NICs; a pair per NIC
    for schedule in (ring, tree):
        leaving = {r for r, steps in enumerate(schedule.steps) for s in steps
                   if s.op == "SEND" and (s.peer < 8) != (r < 8)}
        assert leaving == set(range(16))  # every GPU sends across hosts through its own NIC
    rows = compare_hosts(t, 2**28, model=FAST_REDUCER, host_plan=hp)
    rs, net, ag = (x * 1e-6 for x in rows["blink-3phase"]["phases_us"])
    assert net == pytest.approx(2**28 / 200e9, rel=0.02)  # 2(H-1)/H = 1 over all 8 NICs
    assert rows["nccl-ring"]["time_us"] * 1e-6 == pytest.approx(2 * 15 / 16 * 2**28 / 200e9, rel=0.02)
