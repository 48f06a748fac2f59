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
