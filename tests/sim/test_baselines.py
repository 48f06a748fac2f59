"""Baseline schedules: valid, computing the sum, shaped as documented."""

import itertools

import numpy as np
import pytest

from jax_blink.planning.rings import best_rings
from jax_blink.schedule import Schedule, ScheduleError
from jax_blink.sim import SimModel, simulate
from jax_blink.sim.baselines import (BASELINES, all_baselines, baseline, chain, double_binary_tree,
                                     ring_allreduce, rs_ag)
from jax_blink.topo import Topology
from numpy_executor import numpy_execute


@pytest.mark.parametrize("preset", ["dgx1-v100", "dgx1-p100"])
def test_every_baseline_validates_on_every_dgx1_allocation(preset):
    topo = Topology.preset(preset)
    for k in range(2, 9):
        for sub in itertools.combinations(range(8), k):
            for name, s in all_baselines(topo.subset(sub), 4096 * k).items():
                assert isinstance(s, Schedule)
                s.validate()


@pytest.mark.parametrize("preset", ["dgx2", "dgx-a100", "pcie", "shm:3"])
def test_baselines_validate_on_switched_machines(preset):
    topo = Topology.preset(preset)
    for s in all_baselines(topo, 2**16).values():
        s.validate()
        assert simulate(s, topo).time_s > 0


@pytest.mark.parametrize("name", BASELINES)
def test_baselines_compute_the_sum(name):
    topo = Topology.preset("dgx1-v100").subset([0, 1, 2, 5, 6])
    s = baseline(name, topo, 4 * 3000, "int32")
    inputs = [np.random.default_rng(r).integers(-1000, 1000, s.count) for r in range(topo.n)]
    for out in numpy_execute(s, inputs):
        np.testing.assert_array_equal(out, np.sum(inputs, axis=0))


def test_rings_are_the_best_nvlink_rings_when_they_exist():
    topo = Topology.preset("dgx1-v100")
    s = ring_allreduce(topo, 2**28)
    assert s.ntrees == len(best_rings(topo).rings)
    # at a large size the rings reach the ring packing rate: 150 GB/s -> 85.7 algbw
    r = simulate(s, topo)
    assert r.algbw_gbps == pytest.approx(best_rings(topo).rate_gbps("allreduce"), rel=0.05)


def test_rings_fall_back_to_pcie_in_rank_order_without_an_nvlink_ring():
    topo = Topology.preset("dgx1-v100").subset([0, 1, 5])  # 0-5 has no NVLink
    assert not best_rings(topo).rings
    s = ring_allreduce(topo, 2**20).validate()
    assert s.ntrees == 1
    forward = {(r, step.peer) for r, steps in enumerate(s.steps)
               for step in steps if step.op == "RECV_REDUCE"}
    assert forward == {(1, 0), (2, 1), (0, 2)}  # reduce-scatter flows 0 -> 1 -> 2 -> 0
    r = simulate(s, topo)
    assert r.link_bytes[(0, 1)] > 0  # the NVLink hop is still used
    assert r.link_bytes[(1, 0)] > 0
    pcie = [u for (a, b), u in r.link_utilisation.items() if a >= topo.n or b >= topo.n]
    assert max(pcie) > max(r.link_utilisation[(0, 1)], r.link_utilisation[(1, 0)])  # the bottleneck


def test_double_binary_tree_is_nccls():
    s = double_binary_tree(Topology.preset("dgx1-p100"), 2**20, order=range(8))
    parents = [{} for _ in range(s.ntrees)]
    for r, steps in enumerate(s.steps):
        for step in steps:
            if step.op == "RECV_COPY":
                parents[step.tree][r] = step.peer
    # ncclGetBtree for 8 ranks: 0 -> 4 -> {2, 6}, 2 -> {1, 3}, 6 -> {5, 7}; the second mirrors it
    assert parents[0] == {4: 0, 2: 4, 6: 4, 1: 2, 3: 2, 5: 6, 7: 6}
    assert parents[1] == {7 - c: 7 - p for c, p in parents[0].items()}


def test_rs_ag_sends_every_slice_straight_to_its_owner():
    s = rs_ag(Topology.preset("shm:4"), 4096).validate()
    assert s.ntrees == 4
    for r, steps in enumerate(s.steps):
        assert {st.peer for st in steps} == set(range(4)) - {r}


def test_chain_pipelines_along_nvlinks():
    topo = Topology.preset("dgx1-v100")
    s = chain(topo, 2**24, collective="broadcast", root=2).validate()
    assert s.root == 2 and len(s.chunks) > 1
    senders = {(r, st.peer) for r, steps in enumerate(s.steps) for st in steps if st.op == "SEND"}
    assert all(any(l.kind == "nvlink" and {l.u, l.v} == set(p) for l in topo.links) for p in senders)


def test_chunk_choice_follows_the_model():
    topo = Topology.preset("dgx1-v100").subset([0, 1, 2, 3])
    fast = SimModel(step_overhead_us=0.0, latency_us={"nvlink": 0.1})
    slow = SimModel(step_overhead_us=20.0)
    assert len(chain(topo, 2**22, model=fast).chunks) > len(chain(topo, 2**22, model=slow).chunks)


def test_bad_inputs_raise_clear_errors():
    topo = Topology.preset("dgx1-v100").subset([0, 1, 2])
    with pytest.raises(ScheduleError, match="unknown baseline"):
        baseline("butterfly", topo, 4096)
    with pytest.raises(ScheduleError, match="multiple of the float32 item size"):
        ring_allreduce(topo, 4095)
    with pytest.raises(ScheduleError, match="at least 2 ranks"):
        rs_ag(Topology.preset("dgx1-v100").subset([3]), 4096)
    with pytest.raises(ScheduleError, match="not an order of the ranks"):
        chain(topo, 4096, order=(0, 1, 1))
    with pytest.raises(ScheduleError, match="must start at its root"):
        chain(topo, 4096, collective="reduce", root=2, order=(0, 1, 2))
