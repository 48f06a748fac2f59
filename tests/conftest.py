"""Test configuration: 8 virtual CPU devices, set before jax is imported.

PJRT_NPROC sizes XLA CPU's thread pool: twice the devices (jax_blink.settings.xla_cpu_threads;
docs/sharp_bits.md, "PJRT_NPROC"), or tests that queue many asynchronous steps would
deadlock lax.psum and jax_blink.psum alike.
"""

import importlib.util
import os
import shutil
import tempfile

from jax_blink.settings import set_xla_cpu_threads  # imports no jax


def _nvidia_gpu_for_jax() -> bool:
    """A CUDA plugin for jax is installed and an NVIDIA device node exists."""
    plugin = any(importlib.util.find_spec(name) is not None
                 for name in ("jax_cuda12_plugin", "jax_cuda13_plugin"))
    return plugin and os.path.exists("/dev/nvidia0")


os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
set_xla_cpu_threads(8)
# The CPU tests run on 8 virtual CPU devices (the default backend, first in the list); on a
# machine with an NVIDIA GPU jax starts its CUDA backend too, so that the XLA:GPU tests
# (tests/executor/test_cuda.py, jax.devices("gpu")) run under plain pytest.
os.environ.setdefault("JAX_PLATFORMS", "cpu,cuda" if _nvidia_gpu_for_jax() else "cpu")
# psum's choices in the tests come from the costs recorded in jax_blink.planning.cost, never
# from a machine profile `python -m jax_blink calibrate` may have left on this machine
# (tests/ops/test_profile.py points JAX_BLINK_PROFILE at profiles of its own).
os.environ["JAX_BLINK_PROFILE"] = "defaults"
# One XLA compilation cache for the whole run: the pytest-xdist workers and the processes the
# tests start (the example, the jax.distributed jobs) compile many of the same programs, and on
# 2 cores compiling is a large share of the suite's time. The controller makes it (workers
# inherit the variable) and removes it at the end; a cache the user set is used and kept.
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_CACHE = tempfile.mkdtemp(prefix="jax_blink_tests_xla_cache_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_unconfigure(config):
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the default, pyproject.toml): a worker per core, at most 4. Each worker
    runs 8 CPU devices and the multi-process tests start 2-4 processes of their own, so
    more workers than cores only queue (and stretch the tests' time limits)."""
    return max(1, min(os.cpu_count() or 1, 4))
