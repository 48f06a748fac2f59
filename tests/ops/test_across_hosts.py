"""psum across processes on GPUs: Blink's three phases against NCCL over all the devices,
by one model (``choice.across_hosts.across_hosts``), and never the path it says is slower."""

import types

import numpy as np
import pytest

from jax_blink import Topology, settings
from jax_blink.choice import decide
from jax_blink.ops import hierarchical
from jax_blink.choice import across_hosts as _hosts
from jax_blink.choice import log as _decisions
from jax_blink.choice import predict_gpu as _predict_gpu
from jax_blink.choice import requests as _schedules
from jax_blink.processes.layout import Spanning
from jax_blink.planning.cost import CUDA_STREAM
from jax_blink.schedule import DTYPES
from jax_blink.sim import nccl, simulate


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    monkeypatch.setenv("JAX_BLINK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("JAX_BLINK_NETWORK_GBPS", raising=False)
    monkeypatch.delenv("JAX_BLINK_ALGO", raising=False)
    monkeypatch.delenv("JAX_BLINK_CHUNKS", raising=False)
    _hosts._across_hosts.cache_clear()
    _predict_gpu.other.cache_clear()
    _schedules.tuned_schedule.cache_clear()
    monkeypatch.setattr(_hosts, "_detected_network", lambda: None)  # this machine's NICs play no part


def test_the_network_setting(monkeypatch):
    assert settings.network_gbps() is None
    monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", "12.5")
    assert settings.network_gbps() == 12.5
    for bad in ("fast", "0", "-3", "inf", "nan"):
        monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", bad)
        with pytest.raises(ValueError, match="JAX_BLINK_NETWORK_GBPS.*GB/s per direction"):
            settings.network_gbps()


def test_without_a_network_bandwidth_the_three_phases_run_and_say_why():
    lax_faster, why = _hosts.across_hosts([(1 << 20, "float32")], 4, 8, topology="dgx1-v100")
    assert not lax_faster and "JAX_BLINK_NETWORK_GBPS" in why


def test_the_network_found_in_sysfs_unless_the_setting_says(monkeypatch):
    monkeypatch.setattr(_hosts, "_detected_network", lambda: (50.0, "mlx5_0 port 1 400 Gb/s"))
    lax_faster, why = _hosts.across_hosts([(1 << 26, "float32")], 4, 8, topology="dgx1-v100")
    assert lax_faster and "50 GB/s per host (found in sysfs: mlx5_0 port 1 400 Gb/s)" in why
    monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", "12.5")  # the setting wins: the NIC decides
    lax_faster, why = _hosts.across_hosts([(1 << 26, "float32")], 4, 8, topology="dgx1-v100")
    assert not lax_faster and "12.5 GB/s per host (JAX_BLINK_NETWORK_GBPS)" in why


def _sysfs(root, ib=(), net=()):
    for dev, port, state, rate in ib:
        d = root / "class" / "infiniband" / dev / "ports" / str(port)
        d.mkdir(parents=True)
        (d / "state").write_text(state + "\n")
        (d / "rate").write_text(rate + "\n")
    for name, operstate, speed, physical in net:
        d = root / "class" / "net" / name
        d.mkdir(parents=True)
        (d / "operstate").write_text(operstate + "\n")
        (d / "speed").write_text(speed + "\n")
        if physical:
            (d / "device").mkdir()
    return root


def test_detect_network_gbps_reads_rdma_ports_then_ethernet(tmp_path):
    from jax_blink.topo.detect import detect_network_gbps

    root = _sysfs(tmp_path / "a", ib=[("mlx5_0", 1, "4: ACTIVE", "200 Gb/sec (4X HDR)"),
                                      ("mlx5_1", 1, "4: ACTIVE", "200 Gb/sec (4X HDR)"),
                                      ("mlx5_2", 1, "1: DOWN", "200 Gb/sec (4X HDR)")],
                  net=[("eth0", "up", "100000", True)])
    assert detect_network_gbps(root) == (50.0, "mlx5_0 port 1 200 Gb/s, mlx5_1 port 1 200 Gb/s")
    root = _sysfs(tmp_path / "b", net=[("eth0", "up", "25000", True), ("eth1", "down", "25000", True),
                                       ("docker0", "up", "10000", False), ("lo", "unknown", "-1", False),
                                       ("eth2", "up", "-1", True)])
    assert detect_network_gbps(root) == (3.125, "eth0 25 Gb/s")
    assert detect_network_gbps(_sysfs(tmp_path / "c", net=[("lo", "unknown", "-1", False)])) is None


def test_without_a_gpu_model_the_three_phases_run_and_say_why(monkeypatch):
    monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", "25")
    lax_faster, why = _hosts.across_hosts([(1 << 20, "float32")], 4, 4, topology="shm:4")
    assert not lax_faster and "no NCCL model for shm:4" in why


def _three_phases(host, hosts, network, count, dtype="float32"):
    """The three phases' prediction, from its parts, independently of decide's bookkeeping:
    each in-process phase the faster of the tuned schedule and NCCL's own collective."""
    k = host.n
    padded = -(-count // k) * k
    item = DTYPES[dtype][1]
    total = nccl.predict_hosts(host.subset([0]), hosts, network / k, padded // k * item).seconds
    for collective in ("reduce_scatter", "allgather"):
        request = _schedules.PlanRequest(host, None, _schedules.launch_s("gpu"), collective, algo="blink-tuned")
        schedule = _schedules.schedule_for(request, padded, dtype)[1]
        ours = CUDA_STREAM.seconds(simulate(schedule, host).time_s, schedule)
        total += min(ours, nccl.predict_collective(host, collective, padded * item).seconds)
    return total


@pytest.mark.parametrize("preset,network,count,lax_expected", [
    ("dgx1-v100", 12.5, 1 << 6, True),    # tiny: three latencies and two executor calls lose
    ("dgx1-v100", 12.5, 1 << 26, False),  # 256 MB over one 100 Gb/s NIC: the NIC decides
    ("dgx-a100", 200.0, 1 << 26, True),   # eight 200 Gb/s NICs: NCCL's pipelined ring wins
])
def test_the_faster_path_by_the_model(monkeypatch, preset, network, count, lax_expected):
    monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", str(network))
    host = Topology.preset(preset)
    lax_faster, why = _hosts.across_hosts([(count, "float32")], 4, host.n, topology=host)
    three = _three_phases(host, 4, network, count)
    lax = nccl.predict_hosts(host, 4, network, count * 4).seconds
    assert lax_faster == (lax <= three) == lax_expected  # never the path predicted slower
    assert f"three phases {three * 1e6:.4g} us" in why and f"NCCL over all 32 GPUs {lax * 1e6:.4g} us" in why
    # the check rejects a wrong sum: a phase left out changes the text
    assert f"three phases {(three - lax / 2) * 1e6:.4g} us" not in why
    assert "(JAX_BLINK_NETWORK_GBPS)" in why


def _two_phases(host, hosts, network, collective, count, dtype="float32"):
    """The reduce-scatter's or all-gather's two phases across hosts, from their parts: the
    in-process phase (the faster of the tuned schedule and NCCL's own) and NCCL's collective
    among one GPU per host, on its share of the host's network."""
    k, item = host.n, DTYPES[dtype][1]
    inside = count * hosts if collective == "allgather" else count  # elements of the in-process phase
    whole = inside * k if collective == "allgather" else inside
    request = _schedules.PlanRequest(host, None, _schedules.launch_s("gpu"), collective, algo="blink-tuned")
    schedule = _schedules.schedule_for(request, whole, dtype)[1]
    ours = CUDA_STREAM.seconds(simulate(schedule, host).time_s, schedule)
    local = min(ours, nccl.predict_collective(host, collective, whole * item).seconds)
    shard = inside if collective == "allgather" else inside // k
    return local + nccl.predict_collective_hosts(host.subset([0]), hosts, network / k, collective, shard * item).seconds


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather"])
@pytest.mark.parametrize("preset,network,count,lax_expected", [
    ("dgx1-v100", 12.5, 1 << 24, False),  # one 100 Gb/s NIC: a GPU per host carries 1/8 across it
    ("dgx-a100", 200.0, 1 << 24, True),   # eight 200 Gb/s NICs: NCCL's ring over all 32 GPUs wins
    ("dgx-a100", 200.0, 1 << 6, False),   # tiny: NCCL's ring pays 31 steps of latency, ours 3 + one call
])
def test_reduce_scatter_and_allgather_across_hosts_take_the_faster_by_the_model(
        monkeypatch, collective, preset, network, count, lax_expected):
    """``count``: each device's input (the reduce-scatter's whole vector, the all-gather's block)."""
    monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", str(network))
    host = Topology.preset(preset)
    count = count * (32 if collective == "reduce_scatter" else 1)
    lax_faster, why = _hosts.across_hosts([(count, "float32")], 4, 8, collective=collective, topology=host)
    two = _two_phases(host, 4, network, collective, count)
    whole = count * (32 if collective == "allgather" else 1) * 4
    lax = nccl.predict_collective_hosts(host, 4, network, collective, whole).seconds
    assert lax_faster == (lax <= two) == lax_expected  # never the path predicted slower
    assert f"two phases {two * 1e6:.4g} us" in why and f"NCCL over all 32 GPUs {lax * 1e6:.4g} us" in why
    # the check rejects a wrong sum: the in-process phase left out changes the text
    local = two - nccl.predict_collective_hosts(host.subset([0]), 4, network / 8, collective,
                                                (count * 4 if collective == "allgather" else count // 8) * 4).seconds
    assert f"two phases {(two - local) * 1e6:.4g} us" not in why


def test_across_hosts_names_the_collectives_it_models(monkeypatch):
    monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", "12.5")
    with pytest.raises(ValueError, match="no phases for 'broadcast'"):
        _hosts.across_hosts([(1 << 20, "float32")], 4, 8, collective="broadcast", topology="dgx1-v100")


def test_dtype_groups_add_up(monkeypatch):
    monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", "12.5")
    host = Topology.preset("dgx1-v100").subset([0, 1, 2, 3])
    groups = [(1 << 20, "float32"), (1 << 19, "bfloat16")]
    _, why = _hosts.across_hosts(groups, 2, 4, topology=host)
    three = sum(_three_phases(host, 2, 12.5, c, d) for c, d in groups)
    lax = sum(nccl.predict_hosts(host, 2, 12.5, c * DTYPES[d][1]).seconds for c, d in groups)
    assert f"three phases {three * 1e6:.4g} us" in why and f"{lax * 1e6:.4g} us" in why


def test_dtypes_jax_blink_does_not_reduce_are_left_out(monkeypatch):
    monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", "12.5")
    host = Topology.preset("dgx1-v100")
    lax_faster, why = _hosts.across_hosts([(1 << 10, "bool"), (0, "float32")], 4, 8, topology=host)
    assert not lax_faster and "no value of a dtype jax_blink reduces" in why
    with_bool = _hosts.across_hosts([(1 << 10, "bool"), (1 << 26, "float32")], 4, 8, topology=host)
    assert with_bool == _hosts.across_hosts([(1 << 26, "float32")], 4, 8, topology=host)


def test_one_gpu_per_process_is_lax(monkeypatch):
    """One GPU per process: nothing to reduce inside a process, the same NCCL call either way."""
    monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", "25")
    lax_faster, why = _hosts.across_hosts([(1 << 20, "float32")], 8, 1,
                                          topology=Topology.preset("dgx-a100").subset([0]))
    assert lax_faster and "reduce-scatter 0," in why


def test_reduce_scatter_and_allgather_on_gpus_are_tuned_for_the_cuda_executor(monkeypatch):
    """The in-process phases run the lowering tuned for the CUDA executor: the pipeline
    model's chunks alone put thousands of steps (each an API call) on a DGX-1V."""
    monkeypatch.setenv("JAX_BLINK_ALGO", "blink")  # the plan, whatever NCCL's model says
    host = Topology.preset("dgx1-v100")
    count = 1 << 24
    for collective in ("reduce_scatter", "allgather"):
        tuned = decide.decide(count, "float32", 8, collective=collective, topology=host, platform="gpu")
        plain = decide.decide(count, "float32", 8, collective=collective, topology=host, platform="cpu")
        assert "tuned for the CUDA executor" in tuned.text and "tuned" not in plain.text
        times = []
        for d in (tuned, plain):
            schedule = _schedules.schedule_for(d.request, count, "float32")[1]
            times.append(CUDA_STREAM.seconds(simulate(schedule, host).time_s, schedule))
        assert times[0] < 0.5 * times[1]
        forced = decide.decide(count, "float32", 8, collective=collective, topology=host, platform="gpu",
                               chunks=3)
        assert forced.request.algo == "blink" and forced.request.chunks == 3  # chunks= is kept
    # JAX_BLINK_ALGO=lax is lax for every collective on GPUs too
    monkeypatch.setenv("JAX_BLINK_ALGO", "lax")
    for collective in ("reduce_scatter", "allgather", "broadcast"):
        d = decide.decide(count, "float32", 8, collective=collective, topology=host, platform="gpu",
                          root=0 if collective == "broadcast" else None)
        assert d.chosen == "lax" and d.request is None and "JAX_BLINK_ALGO=lax" in d.text


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather", "broadcast"])
def test_the_other_collectives_on_gpus_run_nccl_where_it_is_predicted_faster(collective):
    """auto on GPUs: the tuned plan against NCCL running the lax equivalent, and never the
    slower (NCCL's ring over PCIe loses on DGX-1V GPUs 0, 1, 2, 5, which have no NVLink ring;
    small values, and the whole DGX-1V, go to NCCL)."""
    root = 0 if collective == "broadcast" else None
    for topology, per_device, blink in ((Topology.preset("dgx1-v100").subset([0, 1, 2, 5]), 1 << 24, True),
                                        (Topology.preset("dgx1-v100"), 1 << 24, False),
                                        (Topology.preset("dgx1-v100").subset([0, 1, 2, 5]), 1 << 8, False)):
        n = topology.n
        count = per_device * (n if collective != "broadcast" else 1)
        d = decide.decide(count, "float32", n, collective=collective, root=root, topology=topology,
                          platform="gpu")
        theirs = (nccl.predict(topology, count * 4) if collective == "broadcast"
                  else nccl.predict_collective(topology, collective, count * 4)).seconds
        request = _schedules.PlanRequest(topology, None, _schedules.launch_s("gpu"), collective, root=root,
                                     algo="blink-tuned")
        schedule = _schedules.schedule_for(request, count, "float32")[1]
        ours = CUDA_STREAM.seconds(simulate(schedule, topology).time_s, schedule)
        assert d.uses_blink == blink == (ours < theirs), (topology.name, d.text)
        assert f"{theirs * 1e6:.4g} us" in d.text
        if blink:
            assert f"tuned for the CUDA executor: {ours * 1e6:.4g} us" in d.text
        else:
            assert d.text.split(": ", 1)[1].startswith(decide.lax_equivalent(collective))


def test_nccls_reduce_scatter_and_all_gather_follow_its_tuner():
    """Ring LL over 8 NVSwitch A100s: baseLatency 6.6 us + (n-1) hops x 0.6 us, bandwidth
    min(llMaxBw 87.7, busbw / 2) x n / (n-1); large: busbw 300 x n / (n-1)."""
    t = Topology.preset("dgx-a100")
    for collective in ("reduce_scatter", "allgather"):
        p = nccl.predict_collective(t, collective, 64)
        assert p.times[("ring", "LL")] * 1e6 == pytest.approx(6.6 + 7 * 0.6 + 64 / (1000 * 87.7 * 8 / 7), rel=1e-6)
        big = nccl.predict_collective(t, collective, 1 << 34)
        assert (1 << 34) / (big.times[("ring", "Simple")] * 1e9) == pytest.approx(300 * 8 / 7, rel=0.01)
    assert nccl.predict_collective(t, "allreduce", 1 << 20) == nccl.predict(t, 1 << 20)
    assert nccl.predict_collective(Topology.preset("shm:8"), "allgather", 1 << 20) is None
    with pytest.raises(ValueError, match="no NCCL model of 'broadcast'"):
        nccl.predict_collective(t, "broadcast", 1 << 20)


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
    assert _decisions.recent()[-1].startswith("psum over ('h', 'l'): lax.psum (predicted faster")
    big = [types.SimpleNamespace(shape=(1 << 26,), dtype=np.float32, size=1 << 26)]
    monkeypatch.setattr(hierarchical.jnp, "result_type", lambda leaf: leaf.dtype)
    assert hierarchical.path("psum", ("h", "l"), None, big, "lax.psum", topology="dgx1-v100") is span
    assert "three phases across processes (predicted fastest" in _decisions.recent()[-1]
    monkeypatch.setenv("JAX_BLINK_ALGO", "blink")  # forced: no prediction
    assert hierarchical.path("psum", ("h", "l"), None, leaves, "lax.psum", topology="dgx1-v100") is span


def test_psum_scatter_and_all_gathers_path_on_gpus_follows_the_model(monkeypatch):
    """hierarchical.path for a reduce-scatter or all-gather on a GPU backend: the model of
    across_hosts, not the CPU's measured byte range (which would keep the phases here)."""
    import jax
    import jax.numpy as jnp

    span = Spanning(nprocesses=4, per_process=8, local_axes=("l",), cross_axes=("h",))
    monkeypatch.setattr(hierarchical, "span_for", lambda *a, **k: span)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(hierarchical.jnp, "result_type", lambda leaf: leaf.dtype)
    monkeypatch.setenv("JAX_BLINK_NETWORK_GBPS", "200")
    for collective, name, count in (("reduce_scatter", "psum_scatter", 32 << 24), ("allgather", "all_gather", 1 << 24)):
        big = [types.SimpleNamespace(shape=(count,), dtype=np.float32, size=count)]
        out = hierarchical.path(name, ("h", "l"), None, big, f"lax.{name}", collective=collective,
                                topology="dgx-a100")
        assert isinstance(out, str) and "(predicted faster than the two phases" in out
        assert _decisions.recent()[-1] == out
        assert out.startswith(f"{name} over ('h', 'l'): lax.{name} (predicted faster")
        small = [types.SimpleNamespace(shape=(64,), dtype=np.float32, size=64)]
        assert hierarchical.path(name, ("h", "l"), None, small, f"lax.{name}", collective=collective,
                                 topology="dgx-a100") is span
        assert "two phases across processes (predicted fastest" in _decisions.recent()[-1]


@pytest.mark.parametrize("collective, nbytes, chosen", [
    ("reduce_scatter", 4096, "lax"), ("reduce_scatter", 8 << 20, "phases"),
    ("allgather", 4096, "phases"), ("allgather", 8 << 20, "lax"), ("allreduce", 4096, "phases")])
def test_the_chooser_decides_the_phases_across_cpu_hosts(collective, nbytes, chosen, monkeypatch):
    """On CPU devices spanning hosts, decide.across (the one chooser) picks from the recorded
    range where the phases won (no profile measures that path), records the decision and
    names its source; JAX_BLINK_ALGO=blink keeps the phases."""
    monkeypatch.delenv("JAX_BLINK_ALGO", raising=False)
    d = decide.across("op", ("h", "l"), "lax.op", collective, {"float32": nbytes // 4}, 2, 4,
                      platform="cpu")
    assert d.chosen == chosen and d.phases == (chosen == "phases") and not d.request
    if collective != "allreduce":
        assert "CPU_CROSS_PROCESS_BYTES" in d.source
        assert _decisions.recent()[-1] == d.text
    monkeypatch.setenv("JAX_BLINK_ALGO", "blink")
    assert decide.across("op", ("h", "l"), "lax.op", collective, {"float32": nbytes // 4}, 2, 4,
                         platform="cpu").chosen == "phases"
