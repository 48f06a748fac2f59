"""sim.nccl: NCCL's allreduce as its own tuner predicts it (NCCL's src/graph/tuning.cc)."""

import math

import pytest

from jax_blink import Topology
from jax_blink.sim import nccl


def test_small_messages_take_a_low_latency_protocol_large_ones_simple():
    for preset in ("dgx1-v100", "dgx1-p100", "dgx-a100", "dgx2"):
        t = Topology.preset(preset)
        assert nccl.predict(t, 256).protocol == "LL"
        assert nccl.predict(t, 1 << 30).protocol == "Simple"


def test_the_latency_of_a_tiny_ring_is_the_tuners_formula():
    """Ring LL on 8 NVLink GPUs: baseLatency 6.6 us + 2(n-1) hops x 0.6 us."""
    p = nccl.predict(Topology.preset("dgx-a100"), 4)
    assert p.times[("ring", "LL")] * 1e6 == pytest.approx(6.6 + 14 * 0.6 + 4 / (1000 * 87.7 * 8 / 14), rel=1e-6)


def test_large_messages_run_at_the_ring_bus_bandwidth():
    """Simple ring on DGX A100 (NVSwitch, 300 GB/s ports): algbw = 300 * n / (2(n-1))."""
    p = nccl.predict(Topology.preset("dgx-a100"), 1 << 30)
    algbw = (1 << 30) / (p.times[("ring", "Simple")] * 1e9)
    assert algbw == pytest.approx(300 * 8 / 14, rel=0.01)


def test_nvls_only_on_hopper_nvswitch():
    assert ("nvls", "Simple") in nccl.predict(Topology.preset("hgx-h100"), 1 << 20).times
    for preset in ("dgx-a100", "dgx1-v100"):
        assert ("nvls", "Simple") not in nccl.predict(Topology.preset(preset), 1 << 20).times


def test_ll128_needs_nvlink_and_volta_or_newer():
    assert ("ring", "LL128") in nccl.predict(Topology.preset("dgx1-v100"), 1 << 20).times
    assert ("ring", "LL128") not in nccl.predict(Topology.preset("dgx1-p100"), 1 << 20).times  # sm60


def test_without_an_nvlink_ring_nccl_runs_over_pcie():
    """DGX-1V GPUs 0, 1, 2, 5: no NVLink ring; NCCL's ring is the PCIe fallback, at PCI latency."""
    t = Topology.preset("dgx1-v100").subset([0, 1, 2, 5])
    p = nccl.predict(t, 1 << 28)
    full = nccl.predict(Topology.preset("dgx1-v100").subset([0, 1, 2, 3]), 1 << 28)
    assert p.seconds > 3 * full.seconds
    assert p.times[("ring", "LL")] * 1e6 == pytest.approx(6.6 + 6 * 1.0 + (1 << 28) / (1000 * min(39.0, 0.5 * nccl._ring_busbw(t)[0]) * 4 / 6), rel=1e-6)


def test_no_gpu_no_prediction():
    assert nccl.predict(Topology.preset("shm:8"), 1 << 20) is None
    assert nccl.predict(Topology.preset("pcie"), 1 << 20) is None
    assert nccl.predict(Topology.preset("dgx1-v100").subset([3]), 1 << 20) is None  # one GPU


def test_every_prediction_is_the_fastest_of_its_options():
    for preset in ("dgx1-v100", "hgx-h100"):
        for size in (64, 1 << 16, 1 << 24):
            p = nccl.predict(Topology.preset(preset), size)
            assert p.seconds == min(p.times.values()) and math.isfinite(p.seconds)


# ---- several hosts (NCCL's tuner with nNodes > 1)


def test_one_host_is_predict():
    t = Topology.preset("dgx-a100")
    for size in (64, 1 << 20, 1 << 28):
        assert nccl.predict_hosts(t, 1, 200.0, size) == nccl.predict(t, size)


def test_the_latency_of_a_tiny_ring_across_hosts_is_the_tuners_formula():
    """Ring LL over 4 DGX-1V (Intel CPUs): baseLatency 6.6 us, then 2(n-1) steps of which
    2(nodes-1) cross the network at 2.7 us and the rest pay the larger of NVLink's 0.6 us and
    the network overhead 1.0 us; LL bandwidth capped at llMaxBw (Intel, more than 2 nodes: 20.4)."""
    t = Topology.preset("dgx1-v100")
    p = nccl.predict_hosts(t, 4, 12.5, 4)
    n, nodes = 32, 4
    lat = 6.6 + (2 * (n - 1) - 2 * (nodes - 1)) * 1.0 + 2 * (nodes - 1) * 2.7
    assert p.times[("ring", "LL")] * 1e6 == pytest.approx(lat + 4 / (1000 * min(20.4, 12.5 * 0.5) * n / 62), rel=1e-6)
    # the tree: 2 ((ppn - 1) NVLink hops + log2(nodes) network hops)
    tree = 6.8 + 2 * (7 * 0.6 + 2 * 5.0)
    assert p.times[("tree", "LL")] * 1e6 == pytest.approx(
        tree + 4 / (1000 * min(min(12.5 * 0.92, 1 * 10.0) / 3.8, 20.4) * 0.5), rel=1e-6)


def test_large_messages_across_hosts_run_at_the_network_bandwidth():
    """A Simple ring over 4 DGX A100 whose NICs give 100 GB/s (below their NVSwitch ring):
    algbw -> 100 * n / (2(n-1)); with faster NICs the host's ring bounds it instead."""
    t = Topology.preset("dgx-a100")
    size = 1 << 36  # the latency (hundreds of us across hosts) under 1%
    p = nccl.predict_hosts(t, 4, 100.0, size)
    assert size / (p.times[("ring", "Simple")] * 1e9) == pytest.approx(100 * 32 / 62, rel=0.01)
    fast = nccl.predict_hosts(t, 4, 1000.0, size)
    assert size / (fast.times[("ring", "Simple")] * 1e9) == pytest.approx(300 * 32 / 62, rel=0.01)


def test_a_slower_network_is_never_predicted_faster():
    t = Topology.preset("dgx1-v100")
    for size in (1 << 10, 1 << 20, 1 << 28):
        times = [nccl.predict_hosts(t, 4, gbps, size).seconds for gbps in (6.25, 12.5, 25.0, 50.0, 400.0)]
        assert times == sorted(times, reverse=True)
        more = [nccl.predict_hosts(t, hosts, 25.0, size).seconds for hosts in (2, 4, 8, 16)]
        assert more == sorted(more)


def test_nvls_across_hosts_is_nvls_tree_on_hopper_only():
    h100 = nccl.predict_hosts(Topology.preset("hgx-h100"), 4, 400.0, 1 << 28)
    assert ("nvls_tree", "Simple") in h100.times and ("nvls", "Simple") not in h100.times
    assert not any(a.startswith("nvls") for a, _ in nccl.predict_hosts(Topology.preset("dgx-a100"), 4, 200.0,
                                                                          1 << 28).times)


def test_one_gpu_per_host_and_no_gpu():
    one = Topology.preset("dgx-a100").subset([0])
    p = nccl.predict_hosts(one, 4, 25.0, 1 << 28)
    # one rank per node: no step stays inside a node; the ring's bandwidth is the network's
    assert (1 << 28) / (p.times[("ring", "Simple")] * 1e9) == pytest.approx(25.0 * 4 / 6, rel=0.02)
    assert nccl.predict_hosts(Topology.preset("shm:8"), 4, 25.0, 1 << 20) is None
    assert nccl.predict_hosts(Topology.preset("dgx-a100"), 4, 0.0, 1 << 20) is None


def test_reduce_scatter_and_allgather_across_hosts_follow_the_tuner():
    """Ring LL over 4 DGX-1V: baseLatency 6.6 us, then n - 1 steps, of which nodes - 1 cross the
    network at 2.7 us and the rest pay the larger of NVLink's 0.6 us and the network overhead
    1.0 us; LL capped at llMaxBw (Intel, more than 2 nodes: 20.4); large sizes at the network."""
    t = Topology.preset("dgx1-v100")
    n, nodes = 32, 4
    for collective in ("reduce_scatter", "allgather"):
        p = nccl.predict_collective_hosts(t, nodes, 12.5, collective, 64)
        lat = 6.6 + (n - 1 - (nodes - 1)) * 1.0 + (nodes - 1) * 2.7
        assert p.times[("ring", "LL")] * 1e6 == pytest.approx(lat + 64 / (1000 * min(20.4, 6.25) * n / (n - 1)),
                                                              rel=1e-6)
        size = 1 << 36
        big = nccl.predict_collective_hosts(t, nodes, 12.5, collective, size)
        assert size / (big.times[("ring", "Simple")] * 1e9) == pytest.approx(12.5 * n / (n - 1), rel=0.01)
        assert not any(a.startswith("nvls") for a, _ in nccl.predict_collective_hosts(
            Topology.preset("hgx-h100"), nodes, 400.0, collective, size).times)  # NVLS: one machine only
        # one host is predict_collective; one GPU per host pays the network's tree latency per step
        assert nccl.predict_collective_hosts(t, 1, 12.5, collective, 1 << 20) == nccl.predict_collective(
            t, collective, 1 << 20)
        one = nccl.predict_collective_hosts(t.subset([0]), nodes, 12.5, collective, 64)
        assert one.times[("ring", "LL")] * 1e6 == pytest.approx(
            6.6 + (nodes - 1) * 5.0 + 64 / (1000 * min(20.4, 6.25) * nodes / (nodes - 1)), rel=1e-6)
        times = [nccl.predict_collective_hosts(t, nodes, g, collective, 1 << 28).seconds for g in (6.25, 12.5, 50.0)]
        assert times == sorted(times, reverse=True)
    assert nccl.predict_collective_hosts(t, 4, 12.5, "allreduce", 1 << 20) == nccl.predict_hosts(t, 4, 12.5, 1 << 20)
    assert nccl.predict_collective_hosts(Topology.preset("shm:8"), 4, 12.5, "allgather", 1 << 20) is None
    with pytest.raises(ValueError, match="no NCCL model of 'broadcast'"):
        nccl.predict_collective_hosts(t, 4, 12.5, "broadcast", 1 << 20)
