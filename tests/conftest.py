"""Test configuration: 8 virtual CPU devices, set before jax is imported.

PJRT_NPROC sizes XLA CPU's thread pool: twice the devices (jax_blink.settings.xla_cpu_threads;
docs/sharp_bits.md, "PJRT_NPROC"), or tests that queue many asynchronous steps would
deadlock lax.psum and jax_blink.psum alike.
"""

import fcntl
import importlib.util
import os
import pickle
import shutil
import tempfile
from pathlib import Path

import pytest

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
# One folder for the whole run, which the controller makes (the pytest-xdist workers inherit
# the variable) and removes at the end:
# - XLA's compilation cache: the workers and the processes the tests start (the example, the
#   jax.distributed jobs) compile many of the same programs, and on 2 cores compiling is a
#   large share of the suite's time. A cache the user set is used and kept. (jax writes an
#   entry without a lock: a read that races its write warns and compiles again.)
# - what run_once() made.
_RUN_DIR = "JAX_BLINK_TESTS_RUN_DIR"
_OWN_RUN_DIR = None
if _RUN_DIR not in os.environ:
    _OWN_RUN_DIR = os.environ[_RUN_DIR] = tempfile.mkdtemp(prefix="jax_blink_tests_")
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(_OWN_RUN_DIR, "xla_cache")
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_unconfigure(config):
    if _OWN_RUN_DIR is not None:
        shutil.rmtree(_OWN_RUN_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def run_once():
    """``run_once(name, make)``: ``make(folder)``'s result (picklable), made once per test run
    by whichever pytest-xdist worker asks first, in a folder of the run's, while the others
    wait for it: a slow module fixture (a training run, jobs that wait for a timeout) is not
    made again by each worker that draws one of its tests. A ``make`` that raises leaves
    nothing, and the next to ask makes it again."""
    def once(name, make):
        folder = Path(os.environ[_RUN_DIR]) / name
        folder.mkdir(exist_ok=True)
        with open(folder / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            made = folder / ".result.pickle"
            if not made.exists():
                made.write_bytes(pickle.dumps(make(folder)))
            return pickle.loads(made.read_bytes())
    return once


#: tests that start processes or train for tens of seconds: run first, so that the workers
#: share them out while short tests fill the gaps, rather than one worker finishing them alone
_LONG_FIRST = ("tests/multiprocess/", "tests/ops/test_example.py")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not item.nodeid.startswith(_LONG_FIRST))  # (a stable sort)


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the default, pyproject.toml): a worker per core, at most 4. Each worker
    runs 8 CPU devices and the multi-process tests start 2-4 processes of their own, so
    more workers than cores only queue (and stretch the tests' time limits)."""
    return max(1, min(os.cpu_count() or 1, 4))
