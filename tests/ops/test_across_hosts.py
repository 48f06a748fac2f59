"""psum across processes on GPUs: Blink's three phases against NCCL over all the devices,
by one model (``ops.decide.across_hosts``), and never the path it says is slower."""

import types

import numpy as np
import pytest

from jax_blink import Topology, settings
from jax_blink.ops import decide, hierarchical
from jax_blink.ops.processes import Spanning
from jax_blink.planning.cost import CUDA_STREAM
from jax_blink.schedule import DTYPES
from jax_blink.sim import nccl, simulate


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    monkeypatch.setenv("JAX_BLINK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("JAX_BLINK_NETWORK_GBPS", raising=False)
    monkeypatch.delenv("JAX_BLINK_ALGO", raising=False)
    monkeypatch.delenv("JAX_BLINK_CHUNKS", raising=False)
    decide._across_hosts.cache_clear()


def test_the_network_setting(monkeypatch):
    assert settings.network_gbps() is None
    monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", "12.5")
    assert settings.network_gbps() == 12.5
    for bad in ("fast", "0", "-3", "inf", "nan"):
        monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", bad)
        with pytest.raises(ValueError, match="JAX_BLINK_NETWORK_GBPS.*GB/s per direction"):
            settings.network_gbps()


def test_without_a_network_bandwidth_the_three_phases_run_and_say_why():
    lax_faster, why = decide.across_hosts([(1 << 20, "float32")], 4, 8, topology="dgx1-v100")
    assert not lax_faster and "JAX_BLINK_NETWORK_GBPS" in why


def test_without_a_gpu_model_the_three_phases_run_and_say_why(monkeypatch):
    monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", "25")
    lax_faster, why = decide.across_hosts([(1 << 20, "float32")], 4, 4, topology="shm:4")
    assert not lax_faster and "no NCCL model for shm:4" in why


def _three_phases(host, hosts, network, count, dtype="float32"):
    """The three phases' prediction, from its parts, independently of decide's bookkeeping."""
    k = host.n
    padded = -(-count // k) * k
    item = DTYPES[dtype][1]
    total = nccl.predict_hosts(host.subset([0]), hosts, network / k, padded // k * item).seconds
    for collective in ("reduce_scatter", "allgather"):
        d = decide.decide(padded, dtype, k, collective=collective, topology=host, platform="gpu")
        schedule = decide.schedule_for(d.request, padded, dtype)[1]
        assert d.request.algo == "blink-tuned"
        total += CUDA_STREAM.seconds(simulate(schedule, host).time_s, schedule)
    return total


@pytest.mark.parametrize("preset,network,count,lax_expected", [
    ("dgx1-v100", 12.5, 1 << 6, True),    # tiny: three latencies and two executor calls lose
    ("dgx1-v100", 12.5, 1 << 26, False),  # 256 MB over one 100 Gb/s NIC: the NIC decides
    ("dgx-a100", 200.0, 1 << 26, True),   # eight 200 Gb/s NICs: NCCL's pipelined ring wins
])
def test_the_faster_path_by_the_model(monkeypatch, preset, network, count, lax_expected):
    monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", str(network))
    host = Topology.preset(preset)
    lax_faster, why = decide.across_hosts([(count, "float32")], 4, host.n, topology=host)
    three = _three_phases(host, 4, network, count)
    lax = nccl.predict_hosts(host, 4, network, count * 4).seconds
    assert lax_faster == (lax <= three) == lax_expected  # never the path predicted slower
    assert f"three phases {three * 1e6:.4g} us" in why and f"NCCL over all 32 GPUs {lax * 1e6:.4g} us" in why
    # the check rejects a wrong sum: a phase left out changes the text
    assert f"three phases {(three - lax / 2) * 1e6:.4g} us" not in why


def test_dtype_groups_add_up(monkeypatch):
    monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", "12.5")
    host = Topology.preset("dgx1-v100").subset([0, 1, 2, 3])
    groups = [(1 << 20, "float32"), (1 << 19, "bfloat16")]
    _, why = decide.across_hosts(groups, 2, 4, topology=host)
    three = sum(_three_phases(host, 2, 12.5, c, d) for c, d in groups)
    lax = sum(nccl.predict_hosts(host, 2, 12.5, c * DTYPES[d][1]).seconds for c, d in groups)
    assert f"three phases {three * 1e6:.4g} us" in why and f"{lax * 1e6:.4g} us" in why


def test_one_gpu_per_process_is_lax(monkeypatch):
    """One GPU per process: nothing to reduce inside a process, the same NCCL call either way."""
    monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", "25")
    lax_faster, why = decide.across_hosts([(1 << 20, "float32")], 8, 1,
                                          topology=Topology.preset("dgx-a100").subset([0]))
    assert lax_faster and "reduce-scatter 0," in why


def test_reduce_scatter_and_allgather_on_gpus_are_tuned_for_the_cuda_executor():
    """The in-process phases run the lowering tuned for the CUDA executor: the pipeline
    model's chunks alone put thousands of steps (each an API call) on a DGX-1V."""
    host = Topology.preset("dgx1-v100")
    count = 1 << 24
    for collective in ("reduce_scatter", "allgather"):
        tuned = decide.decide(count, "float32", 8, collective=collective, topology=host, platform="gpu")
        plain = decide.decide(count, "float32", 8, collective=collective, topology=host, platform="cpu")
        assert "tuned for the CUDA executor" in tuned.text and "tuned" not in plain.text
        times = []
        for d in (tuned, plain):
            schedule = decide.schedule_for(d.request, count, "float32")[1]
            times.append(CUDA_STREAM.seconds(simulate(schedule, host).time_s, schedule))
        assert times[0] < 0.5 * times[1]
        forced = decide.decide(count, "float32", 8, collective=collective, topology=host, platform="gpu",
                               chunks=3)
        assert forced.request.algo == "blink" and forced.request.chunks == 3  # chunks= is kept


def test_psums_path_takes_lax_where_the_model_says_so(monkeypatch):
    """hierarchical.path on a GPU backend: the reason goes to explain() and lax runs."""
    import jax
    import jax.numpy as jnp

    span = Spanning(nprocesses=4, per_process=8, local_axes=("l",), cross_axes=("h",))
    monkeypatch.setattr(hierarchical, "span_for", lambda *a, **k: span)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    leaves = [jnp.zeros((16,), jnp.float32)]
    monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", "12.5")
    out = hierarchical.path("psum", ("h", "l"), None, leaves, "lax.psum", topology="dgx1-v100")
    assert isinstance(out, str) and "predicted faster than the three phases" in out
    assert decide.recent()[-1].startswith("psum over ('h', 'l'): lax.psum (predicted faster")
    big = [types.SimpleNamespace(shape=(1 << 26,), dtype=np.float32, size=1 << 26)]
    monkeypatch.setattr(hierarchical.jnp, "result_type", lambda leaf: leaf.dtype)
    assert hierarchical.path("psum", ("h", "l"), None, big, "lax.psum", topology="dgx1-v100") is span
    assert "three phases across processes (predicted fastest" in decide.recent()[-1]
    monkeypatch.setenv("JAX_BLINK_ALGO", "blink")  # forced: no prediction
    assert hierarchical.path("psum", ("h", "l"), None, leaves, "lax.psum", topology="dgx1-v100") is span
