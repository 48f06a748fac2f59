"""jax_blink.settings: every JAX_BLINK_* variable, its default, keyword precedence
and a clear error for a bad value."""

import pytest

from jax_blink import settings


def test_defaults_with_an_empty_environment(monkeypatch):
    for name in ("MIN_BYTES", "TIMEOUT_S", "CHUNKS", "TOPOLOGY", "CUDA", "DEBUG", "SPIN",
                 "YIELD_US", "PUSH", "NT_BYTES", "HUGEPAGE_BYTES", "CACHE_DIR"):
        monkeypatch.delenv(f"JAX_BLINK_{name}", raising=False)
    assert settings.min_bytes() == settings.DEFAULT_MIN_BYTES == 0
    assert settings.timeout_ms() == 60_000
    assert settings.chunks() is None
    assert settings.topology_source() is None
    assert settings.cuda_enabled() is True
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


@pytest.mark.parametrize("name,value,call,message", [
    ("JAX_BLINK_MIN_BYTES", "lots", settings.min_bytes, "is not a number of bytes"),
    ("JAX_BLINK_MIN_BYTES", "-1", settings.min_bytes, "must not be negative"),
    ("JAX_BLINK_TIMEOUT_S", "soon", settings.timeout_ms, "is not a number of seconds"),
    ("JAX_BLINK_TIMEOUT_S", "0", settings.timeout_ms, "must be > 0"),
    ("JAX_BLINK_CHUNKS", "2.5", settings.chunks, "is not a whole number of chunks"),
    ("JAX_BLINK_CHUNKS", "0", settings.chunks, "must be between 1 and 1024"),
    ("JAX_BLINK_CUDA", "maybe", settings.cuda_enabled, "use 0 to keep psum off"),
    ("JAX_BLINK_DEBUG", "verbose", settings.debug, "use 1 or 0"),
    ("JAX_BLINK_SPIN", "fast", settings.executor, "is not a number of iterations"),
    ("JAX_BLINK_PUSH", "2", settings.executor, "use 1 or 0"),
    ("JAX_BLINK_HUGEPAGE_BYTES", "-5", settings.executor, "must not be negative"),
])
def test_bad_values_name_the_variable(monkeypatch, name, value, call, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message) as err:
        call()
    assert name in str(err.value)


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
