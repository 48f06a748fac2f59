"""jax_blink.settings: every JAX_BLINK_* variable, its default, keyword precedence
and a clear error for a bad value."""

import os

import pytest

from jax_blink import settings


def test_defaults_with_an_empty_environment(monkeypatch):
    for name in ("MIN_BYTES", "TIMEOUT_S", "CHUNKS", "TOPOLOGY", "CUDA", "DEBUG", "SPIN",
                 "YIELD_US", "PUSH", "NT_BYTES", "HUGEPAGE_BYTES", "CACHE_DIR", "BUCKET_BYTES",
                 "ALGO", "PLAN", "CUDA_EXECUTOR"):
        monkeypatch.delenv(f"JAX_BLINK_{name}", raising=False)
    assert settings.min_bytes() == settings.DEFAULT_MIN_BYTES == 0
    assert settings.timeout_ms() == 60_000
    assert settings.chunks() is None
    assert settings.bucket_bytes() is None
    assert settings.algo() == "auto" and settings.plan_file() is None
    assert settings.topology_source() is None
    assert settings.cuda_enabled() is True
    assert settings.cuda_executor() == "stream"
    assert settings.debug() is False
    assert settings.executor() == settings.ExecutorSettings(
        spin=0, yield_us=200, push=True, nt_bytes=1 << 20, hugepage_bytes=2 << 20, debug=False)


def test_keywords_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("JAX_BLINK_MIN_BYTES", "4096")
    monkeypatch.setenv("JAX_BLINK_TIMEOUT_S", "5")
    monkeypatch.setenv("JAX_BLINK_CHUNKS", "3")
    assert (settings.min_bytes(), settings.min_bytes(8)) == (4096, 8)
    assert (settings.timeout_ms(), settings.timeout_ms(0.0015)) == (5000, 2)
    assert (settings.chunks(), settings.chunks(7)) == (3, 7)


def test_executor_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("JAX_BLINK_SPIN", "100")
    monkeypatch.setenv("JAX_BLINK_YIELD_US", "0")
    monkeypatch.setenv("JAX_BLINK_PUSH", "0")
    monkeypatch.setenv("JAX_BLINK_NT_BYTES", "1e6")
    monkeypatch.setenv("JAX_BLINK_DEBUG", "1")
    assert settings.executor() == settings.ExecutorSettings(
        spin=100, yield_us=0, push=False, nt_bytes=1_000_000, hugepage_bytes=2 << 20, debug=True)


@pytest.mark.parametrize("value", ["device", "stream", "DEVICE"])
def test_cuda_executor_from_the_environment(monkeypatch, value):
    monkeypatch.setenv("JAX_BLINK_CUDA_EXECUTOR", value)
    assert settings.executor().cuda_executor == value.lower()


def test_explain_names_the_cuda_executor_on_gpus(monkeypatch):
    from jax_blink.choice.decide import decide

    monkeypatch.setenv("JAX_BLINK_ALGO", "blink")
    for value in ("stream", "device"):
        monkeypatch.setenv("JAX_BLINK_CUDA_EXECUTOR", value)
        d = decide(1 << 20, "float32", 8, topology="dgx1-v100", platform="cuda")
        assert d.uses_blink and d.text.endswith(f"; CUDA executor: {value} (JAX_BLINK_CUDA_EXECUTOR)"), d.text
        cpu = decide(1 << 20, "float32", 8, topology="shm:8", platform="cpu")
        assert "CUDA executor" not in cpu.text


@pytest.mark.parametrize("name,value,call,message", [
    ("JAX_BLINK_MIN_BYTES", "lots", settings.min_bytes, "is not a number; use a whole number of bytes"),
    ("JAX_BLINK_MIN_BYTES", "-1", settings.min_bytes, "is out of range; use a whole number of bytes from 0"),
    ("JAX_BLINK_TIMEOUT_S", "soon", settings.timeout_ms, "is not a number; use a number of seconds"),
    ("JAX_BLINK_TIMEOUT_S", "0", settings.timeout_ms, "is out of range; use a number of seconds > 0"),
    ("JAX_BLINK_CHUNKS", "2.5", settings.chunks, "is not a whole number; use a whole number of chunks"),
    ("JAX_BLINK_CHUNKS", "0", settings.chunks, "from 1 to 1024"),
    ("JAX_BLINK_CUDA", "maybe", settings.cuda_enabled, "use 0 to keep psum off"),
    ("JAX_BLINK_SEGMENTED", "maybe", settings.segmented, "use 1 \\(the default\\) to sum a bucket's leaves"),
    ("JAX_BLINK_CUDA_EXECUTOR", "kernel", settings.cuda_executor, "use one of stream, device"),
    ("JAX_BLINK_DEBUG", "verbose", settings.debug, "use 1 or 0"),
    ("JAX_BLINK_SPIN", "fast", settings.executor, "is not a number; use a whole number of iterations"),
    ("JAX_BLINK_PUSH", "2", settings.executor, "use 1 or 0"),
    ("JAX_BLINK_HUGEPAGE_BYTES", "-5", settings.executor, "is out of range"),
])
def test_bad_values_name_the_variable(monkeypatch, name, value, call, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message) as err:
        call()
    assert f"{name}={value!r}" in str(err.value)


# Every variable read by settings: how to read it, and the values of the table below it accepts
# (with what it reads them as). The rest must be refused with the variable and the value named.
WHOLE = {"1e30", "-1", "2.7", "abc", "inf", "nan"}
VARIABLES = {
    "JAX_BLINK_MIN_BYTES": (settings.min_bytes, {}),
    "JAX_BLINK_CHUNKS": (settings.chunks, {}),
    "JAX_BLINK_BUCKET_BYTES": (settings.bucket_bytes, {}),
    "JAX_BLINK_TIMEOUT_S": (settings.timeout_ms, {"2.7": 2700}),
    "JAX_BLINK_SPIN": (lambda: settings.executor().spin, {}),
    "JAX_BLINK_YIELD_US": (lambda: settings.executor().yield_us, {}),
    "JAX_BLINK_NT_BYTES": (lambda: settings.executor().nt_bytes, {}),
    "JAX_BLINK_HUGEPAGE_BYTES": (lambda: settings.executor().hugepage_bytes, {}),
    "JAX_BLINK_PUSH": (lambda: settings.executor().push, {}),
    "JAX_BLINK_BARRIER": (lambda: settings.executor().barrier, {}),
    "JAX_BLINK_DEBUG": (settings.debug, {}),
    "JAX_BLINK_CUDA": (settings.cuda_enabled, {}),
    "JAX_BLINK_SEGMENTED": (settings.segmented, {}),
    "JAX_BLINK_HOST_TRANSPORT": (settings.host_transport, {}),
    "JAX_BLINK_HOST_KEY": (settings.host_label, {v: v for v in WHOLE}),  # any label
    "JAX_BLINK_ALGO": (settings.algo, {}),
}


@pytest.mark.parametrize("value", sorted(WHOLE) + [""])
@pytest.mark.parametrize("name", sorted(VARIABLES))
def test_every_variable_takes_or_refuses_every_value_by_name(monkeypatch, name, value):
    """The table of issue 30: inf, nan, 1e30, -1, 2.7, abc and empty for every variable. An
    empty value is the same as unset; anything else is read exactly or refused with an
    error naming the variable, the value and what is allowed (never a raw Python error)."""
    read, accepted = VARIABLES[name]
    monkeypatch.delenv(name, raising=False)
    default = read()
    monkeypatch.setenv(name, value)
    if value == "":
        assert read() == default
    elif value in accepted:
        assert read() == accepted[value]
    else:
        with pytest.raises(ValueError) as err:
            read()
        text = str(err.value)
        assert f"{name}={value!r}" in text and ("use" in text or "expected" in text), text


def test_whole_numbers_may_be_written_with_an_exponent(monkeypatch):
    monkeypatch.setenv("JAX_BLINK_MIN_BYTES", "1e6")
    monkeypatch.setenv("JAX_BLINK_BUCKET_BYTES", "4096.0")
    assert settings.min_bytes() == 10**6 and settings.bucket_bytes() == 4096


def test_the_executor_settings_fit_what_the_cpu_executor_accepts(monkeypatch):
    """The largest value each executor variable accepts is one configure() takes."""
    from jax_blink import _ffi

    ext = _ffi.load_extension()
    before = ext.configuration()
    for name, top in (("JAX_BLINK_SPIN", settings.MAX_SPIN), ("JAX_BLINK_YIELD_US", settings.MAX_YIELD_US),
                      ("JAX_BLINK_NT_BYTES", settings.MAX_BYTES),
                      ("JAX_BLINK_HUGEPAGE_BYTES", settings.MAX_BYTES)):
        monkeypatch.setenv(name, str(top))
    cfg = settings.executor()
    try:
        ext.configure(spin=cfg.spin, yield_us=cfg.yield_us, push=cfg.push, nt_bytes=cfg.nt_bytes,
                      hugepage_bytes=cfg.hugepage_bytes, debug=False)
        assert ext.configuration()["spin"] == settings.MAX_SPIN
    finally:
        ext.configure(**before)


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("JAX_BLINK_CACHE_DIR", str(tmp_path / "plans"))
    assert settings.cache_dir() == tmp_path / "plans"
    monkeypatch.delenv("JAX_BLINK_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert settings.cache_dir() == tmp_path / "jax_blink"


@pytest.mark.parametrize("call,value,error,message", [
    (settings.timeout_ms, 1e10, ValueError, "at most"),
    (settings.timeout_ms, float("inf"), ValueError, "at most"),
    (settings.timeout_ms, float("nan"), ValueError, "must be > 0"),
    (settings.timeout_ms, "5", TypeError, "a number of seconds, got '5'"),
    (settings.timeout_ms, True, TypeError, "a number of seconds"),
    (settings.chunks, 1.7, TypeError, "whole number of chunks"),
    (settings.chunks, 10**6, ValueError, "between 1 and 1024"),
    (settings.min_bytes, 10.5, TypeError, "whole number of bytes"),
    (settings.min_bytes, -1, ValueError, "min_bytes must be between 0 and"),
    (settings.bucket_bytes, 0, ValueError, "bucket_bytes must be between 1 and"),
    (settings.bucket_bytes, 2.5, TypeError, "bucket_bytes must be a whole number of bytes"),
])
def test_keyword_values_are_checked_not_coerced(call, value, error, message):
    with pytest.raises(error, match=message):
        call(value)


def test_the_executor_settings_reach_the_cpu_executor():
    """End to end, in a fresh process: JAX_BLINK_DEBUG=1 makes the C++ executor
    log each collective, JAX_BLINK_PUSH=0 reaches its configuration."""
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np, jax, jax_blink\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "mesh = jax.make_mesh((2,), ('x',))\n"
        "f = jax.jit(jax.shard_map(lambda v: jax_blink.psum(v, 'x'), mesh=mesh,\n"
        "                          in_specs=P('x'), out_specs=P()))\n"
        "x = jax.device_put(np.ones((2, 8), np.float32), NamedSharding(mesh, P('x')))\n"
        "print(np.asarray(f(x))[0, 0])\n"
        "from jax_blink import _ffi\n"
        "print(_ffi.load_extension().configuration())\n")
    env = dict(os.environ, JAX_BLINK_DEBUG="1", JAX_BLINK_PUSH="0",
               XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines()[0] == "2.0"
    assert "'push': False" in res.stdout and "'debug': True" in res.stdout, res.stdout
    assert any(line.startswith("jax_blink: op=1 ") for line in res.stderr.splitlines()), \
        res.stderr[-2000:]


def _paths(tmp_path):
    """Bad files for the path settings: a FIFO, an endless device, JSON nested 200,000 deep,
    malformed JSON."""
    import os

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": ')
    return {"fifo": (str(fifo), "not a regular file"), "device": ("/dev/zero", "not a regular file"),
            "deep": (str(deep), "nested too deeply"), "malformed": (str(broken), "malformed")}


@pytest.mark.parametrize("kind", ["fifo", "device", "deep", "malformed"])
@pytest.mark.parametrize("name", ["JAX_BLINK_PLAN", "JAX_BLINK_TOPOLOGY"])
def test_path_settings_are_read_bounded_and_errors_name_the_variable(monkeypatch, tmp_path, name, kind):
    import time

    import jax
    import numpy as np

    import jax_blink
    from jax_blink.choice import requests as _schedules

    _schedules.schedule_for.cache_clear()
    path, message = _paths(tmp_path)[kind]
    monkeypatch.setenv(name, path)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=message) as err:
        jax_blink.explain(jax.ShapeDtypeStruct((64,), np.float32), 8)
    assert time.perf_counter() - start < 5  # never blocks on the FIFO, never reads /dev/zero out
    assert f"{name}={path!r}" in str(err.value)
    if kind == "malformed":
        assert path in str(err.value)


@pytest.mark.parametrize("value, message", [
    ("no-such-preset", "unknown"),
    ("shm:4", "has 4 ranks but the reduced axes have 8 devices; set it to a topology of 8 ranks, "
              "or unset it"),
])
def test_a_bad_topology_variable_is_named(monkeypatch, value, message):
    import jax
    import numpy as np

    import jax_blink

    monkeypatch.setenv("JAX_BLINK_TOPOLOGY", value)
    with pytest.raises(ValueError, match=message) as err:
        jax_blink.explain(jax.ShapeDtypeStruct((64,), np.float32), 8)
    assert f"JAX_BLINK_TOPOLOGY={value!r}" in str(err.value)


def test_a_topology_argument_of_another_type_is_a_type_error():
    import jax
    import numpy as np

    import jax_blink

    with pytest.raises(TypeError, match="topology must be a Topology or a preset name, got 123"):
        jax_blink.explain(jax.ShapeDtypeStruct((64,), np.float32), 8, topology=123)


@pytest.mark.parametrize("devices, cores, threads", [(8, 2, 16), (8, 16, 16), (8, 64, 64), (1, 2, 2), (4, 1, 8)])
def test_xla_cpu_threads_is_the_cores_but_at_least_twice_the_devices(devices, cores, threads):
    # fewer than 2 x devices deadlock queued collectives; more than the cores slow every step
    # (docs/design_notes.md)
    assert settings.xla_cpu_threads(devices, cores=cores) == threads


def test_set_xla_cpu_threads_reads_the_device_count_and_leaves_a_user_setting(monkeypatch):
    monkeypatch.delenv("PJRT_NPROC", raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--foo --xla_force_host_platform_device_count=4 "
                                    "--xla_force_host_platform_device_count=40")
    settings.set_xla_cpu_threads()
    assert os.environ["PJRT_NPROC"] == str(settings.xla_cpu_threads(40))  # the last count wins, as in XLA
    settings.set_xla_cpu_threads(1000)  # set already: left alone
    assert os.environ["PJRT_NPROC"] == str(settings.xla_cpu_threads(40))
    monkeypatch.setenv("PJRT_NPROC", "")
    monkeypatch.setenv("XLA_FLAGS", "")
    settings.set_xla_cpu_threads()  # an empty value is unset; no count: one device
    assert os.environ["PJRT_NPROC"] == str(settings.xla_cpu_threads(1))
