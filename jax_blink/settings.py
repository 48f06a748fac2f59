"""Every ``JAX_BLINK_*`` setting, read from the environment and validated in one place.

Keyword arguments win over environment variables; each function here takes
the keyword's value (``None``: not given) and falls back to the variable,
then to the default. Variables are read at each call, so a program (or a
test) may change them between traces; an empty value is the same as an
unset one. Every bad value is an error that names the variable (or the
keyword), the value and what is allowed. docs/settings.md's table lists
the same names and defaults. Pure Python: never imports jax, so the planner
can use it too.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
from pathlib import Path
from typing import Optional

__all__ = ["ALGOS", "algo", "plan_file", "DEFAULT_MIN_BYTES", "DEFAULT_TIMEOUT_S", "MAX_TIMEOUT_S",
           "MAX_CHUNKS", "MAX_BYTES", "MAX_SPIN", "MAX_YIELD_US", "ExecutorSettings", "min_bytes",
           "timeout_ms", "chunks", "bucket_bytes", "MAX_BUCKET_BYTES", "topology_source",
           "cuda_enabled", "segmented", "CUDA_EXECUTORS", "cuda_executor", "host_transport", "host_label", "network_gbps", "debug", "cache_dir", "executor",
           "profile_file", "PROFILE_DEFAULTS", "xla_cpu_threads", "set_xla_cpu_threads"]

#: Per-device size (bytes, per dtype group) below which psum calls lax.psum.
#: On 8 CPU devices jax_blink is faster at every size measured, down to one
#: element (benchmarks/bench_cpu.py psum), so only empty values fall back by
#: default. Raise it to leave many tiny psums to XLA, which can combine them
#: into one all-reduce.
DEFAULT_MIN_BYTES = 0
DEFAULT_TIMEOUT_S = 60.0
#: The longest timeout accepted (a week): the executors count milliseconds
#: from now, and a larger number would overflow their deadlines.
MAX_TIMEOUT_S = 7 * 24 * 3600.0
#: The most pipeline chunks per tree accepted from ``chunks=`` (lowering
#: time and schedule size grow with it; the model itself picks at most 32).
MAX_CHUNKS = 1024

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

#: Bounds of the whole-number settings (the executors' are what their C++
#: side can hold: an int for spin, microseconds that fit nanoseconds in
#: 64 bits; the byte sizes are capped at 2^62, past any buffer).
MAX_BYTES = 1 << 62
MAX_SPIN = (1 << 31) - 1
MAX_YIELD_US = 60_000_000  # a minute


def _env(name: str) -> Optional[str]:
    """The variable's text, or None when unset or empty (an empty value is unset)."""
    value = os.environ.get(name)
    return None if value is None or value.strip() == "" else value.strip()


def _is_integer(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Integral)


def _is_real(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real)


def _parse_whole(variable: str, text: str, unit: str, lo: int, hi: int) -> int:
    """``text`` of ``variable`` as a whole number in ``[lo, hi]`` (``1e6`` is a whole
    number; ``2.7``, ``inf`` and ``nan`` are not); a ValueError naming the variable,
    the value and what is allowed otherwise."""
    allowed = f"use a whole number of {unit} from {lo} to {hi}"
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"{variable}={text!r} is not a number; {allowed}") from None
        if not math.isfinite(number) or number != math.floor(number):
            raise ValueError(f"{variable}={text!r} is not a whole number; {allowed}") from None
        value = int(number)
    if not lo <= value <= hi:
        raise ValueError(f"{variable}={text!r} is out of range; {allowed}")
    return value


def _whole(value, *, keyword: Optional[str], variable: str, unit: str, lo: int, hi: int, default):
    """The keyword's ``value`` if given, else ``variable``'s, else ``default``: a whole
    number of ``unit`` in ``[lo, hi]``, or an error naming the keyword or variable."""
    if value is not None:
        if not _is_integer(value):
            raise TypeError(f"{keyword} must be a whole number of {unit}, got {value!r:.60}")
        if not lo <= value <= hi:
            raise ValueError(f"{keyword} must be between {lo} and {hi} {unit}, got {value}")
        return int(value)
    text = _env(variable)
    return default if text is None else _parse_whole(variable, text, unit, lo, hi)


def _flag(name: str, default: bool, advice: str = "use 1 or 0 (true/false, yes/no, on/off)") -> bool:
    text = _env(name)
    if text is None:
        return default
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(f"{name}={text!r}: {advice}")


def min_bytes(value=None) -> int:
    """``min_bytes=``, else ``JAX_BLINK_MIN_BYTES``, else :data:`DEFAULT_MIN_BYTES`."""
    return _whole(value, keyword="min_bytes", variable="JAX_BLINK_MIN_BYTES", unit="bytes", lo=0,
                  hi=MAX_BYTES, default=DEFAULT_MIN_BYTES)


def timeout_ms(value=None) -> int:
    """``timeout_s=`` (seconds), else ``JAX_BLINK_TIMEOUT_S``, else
    :data:`DEFAULT_TIMEOUT_S`, as whole milliseconds (rounded up)."""
    if value is not None:
        if not _is_real(value):
            raise TypeError(f"timeout_s must be a number of seconds, got {value!r:.60}")
        if not 0 < value <= MAX_TIMEOUT_S:  # also refuses nan and inf
            raise ValueError(f"timeout_s must be > 0 and at most {MAX_TIMEOUT_S:g} seconds, got {value}")
        return int(math.ceil(value * 1000))
    text = _env("JAX_BLINK_TIMEOUT_S")
    if text is None:
        return int(math.ceil(DEFAULT_TIMEOUT_S * 1000))
    allowed = f"use a number of seconds > 0 and at most {MAX_TIMEOUT_S:g}"
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"JAX_BLINK_TIMEOUT_S={text!r} is not a number; {allowed}") from None
    if not 0 < seconds <= MAX_TIMEOUT_S:
        raise ValueError(f"JAX_BLINK_TIMEOUT_S={text!r} is out of range; {allowed}")
    return int(math.ceil(seconds * 1000))


def chunks(value=None) -> Optional[int]:
    """``chunks=``, else ``JAX_BLINK_CHUNKS``, else None (the planner's model)."""
    return _whole(value, keyword="chunks", variable="JAX_BLINK_CHUNKS", unit="chunks per tree",
                  lo=1, hi=MAX_CHUNKS, default=None)


#: The largest bucket accepted (1 TiB: larger is the same as one bucket).
MAX_BUCKET_BYTES = 1 << 40


def bucket_bytes(value=None) -> Optional[int]:
    """``bucket_bytes=``, else ``JAX_BLINK_BUCKET_BYTES``, else None (the cost model's
    size): per-device bytes of the buckets a pytree's leaves are summed in (a size at
    least the whole pytree gives one bucket)."""
    return _whole(value, keyword="bucket_bytes", variable="JAX_BLINK_BUCKET_BYTES", unit="bytes",
                  lo=1, hi=MAX_BUCKET_BYTES, default=None)


def topology_source() -> Optional[str]:
    """``JAX_BLINK_TOPOLOGY`` (a preset name or a topology JSON file), or None."""
    return _env("JAX_BLINK_TOPOLOGY")


#: the values of JAX_BLINK_ALGO
ALGOS = ("auto", "blink", "ring", "tree", "chain", "lax")


def algo() -> str:
    """``JAX_BLINK_ALGO``: how the allreduces (psum, pmean, pmax, pmin) run.

    ``auto`` (default): the fastest by the cost model; ``blink``: the planned
    trees; ``ring``, ``tree``, ``chain``: NCCL's ring, NCCL's double binary
    tree, a pipelined chain, run by jax_blink's executor; ``lax``: the lax
    collective. Across processes, ``lax`` sends every collective to lax and
    ``blink`` takes the hierarchical psum_scatter and all_gather at every size.
    """
    text = _env("JAX_BLINK_ALGO")
    if text is None:
        return "auto"
    if text.lower() not in ALGOS:
        raise ValueError(f"JAX_BLINK_ALGO={text!r}: use one of {', '.join(ALGOS)}")
    return text.lower()


def plan_file() -> Optional[str]:
    """``JAX_BLINK_PLAN``: a plan or schedule JSON file the allreduces run
    instead of planning (like NCCL's graph file), or None."""
    return _env("JAX_BLINK_PLAN")


def cuda_enabled() -> bool:
    """``JAX_BLINK_CUDA``: psum may use the CUDA executor (default), unless 0."""
    return _flag("JAX_BLINK_CUDA", True, "use 0 to keep psum off the CUDA executor (lax.psum on GPUs), "
                 "1 (the default) to use it")


def segmented() -> bool:
    """``JAX_BLINK_SEGMENTED``: a bucket of several leaves goes to the CPU executor as
    separate operands, summed where they are (default), unless 0: concatenated into one
    vector and sliced back (the way before; for comparisons)."""
    return _flag("JAX_BLINK_SEGMENTED", True, "use 1 (the default) to sum a bucket's leaves as separate "
                 "operands, 0 to concatenate them into one vector first")


#: The CUDA executors JAX_BLINK_CUDA_EXECUTOR names: the stream executor (host-enqueued
#: copies and kernels; the default) and the device executor (one kernel per rank per call,
#: docs/architecture.md; not yet verified on a GPU, so never the default).
CUDA_EXECUTORS = ("stream", "device")


def cuda_executor() -> str:
    """``JAX_BLINK_CUDA_EXECUTOR``: which CUDA executor runs a call, ``"stream"`` (default)
    or ``"device"``. The device executor falls back to the stream executor where it cannot
    run a schedule (more ranks than one kernel's parameters carry)."""
    text = _env("JAX_BLINK_CUDA_EXECUTOR")
    if text is None:
        return "stream"
    if text.lower() in CUDA_EXECUTORS:
        return text.lower()
    raise ValueError(f"JAX_BLINK_CUDA_EXECUTOR={text!r}: use one of {', '.join(CUDA_EXECUTORS)}")


def host_transport() -> bool:
    """``JAX_BLINK_HOST_TRANSPORT``: collectives whose devices span processes of one host
    run as one schedule over shared memory (default), unless 0 (then they take the
    hierarchical path or lax, as across hosts)."""
    return _flag("JAX_BLINK_HOST_TRANSPORT", True)


def host_label() -> str:
    """``JAX_BLINK_HOST_KEY``: a label added to this process's host key; processes with
    different labels never share memory, as if on different hosts (default: none)."""
    return _env("JAX_BLINK_HOST_KEY") or ""


def network_gbps() -> Optional[float]:
    """``JAX_BLINK_NETWORK_GBPS``: each process's bandwidth to the network, GB/s per
    direction (its host's NICs together: 8 x 200 Gb/s is 200), or None (unknown). On
    GPUs psum across processes compares Blink's three phases with NCCL over all the
    devices by it."""
    text = _env("JAX_BLINK_NETWORK_GBPS")
    if text is None:
        return None
    allowed = "use a bandwidth in GB/s per direction > 0 (100 Gb/s is 12.5), or unset it"
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"JAX_BLINK_NETWORK_GBPS={text!r} is not a number; {allowed}") from None
    if not 0 < value < math.inf:
        raise ValueError(f"JAX_BLINK_NETWORK_GBPS={text!r} is out of range; {allowed}")
    return value


def debug() -> bool:
    """``JAX_BLINK_DEBUG``: log every psum decision and every executed collective."""
    return _flag("JAX_BLINK_DEBUG", False)


def cache_dir() -> Path:
    """Where plans are cached on disk: ``JAX_BLINK_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/jax_blink``, else ``~/.cache/jax_blink``."""
    text = _env("JAX_BLINK_CACHE_DIR")
    if text is not None:
        return Path(text)
    xdg = _env("XDG_CACHE_HOME")
    if xdg is not None:
        return Path(xdg) / "jax_blink"
    return Path.home() / ".cache" / "jax_blink"


#: ``JAX_BLINK_PROFILE`` value that keeps psum on the recorded costs, without a note.
PROFILE_DEFAULTS = "defaults"


def profile_file():
    """``JAX_BLINK_PROFILE``: the machine profile to use (a file ``python -m jax_blink
    calibrate`` wrote, e.g. on another machine of the same kind); ``"defaults"``
    (:data:`PROFILE_DEFAULTS`): none, the costs recorded in ``planning.cost``, without a
    note; None when unset: this machine's own profile, in :func:`cache_dir`."""
    text = _env("JAX_BLINK_PROFILE")
    if text is None:
        return None
    return PROFILE_DEFAULTS if text == PROFILE_DEFAULTS else Path(text)


@dataclasses.dataclass(frozen=True)
class ExecutorSettings:
    """The C++ executors' run-time settings (see docs/settings.md)."""

    spin: int = 0                    # JAX_BLINK_SPIN: busy-wait iterations
    yield_us: int = 200              # JAX_BLINK_YIELD_US: then sched_yield this long
    push: bool = True                # JAX_BLINK_PUSH: completing rank writes ready receivers
    nt_bytes: int = 1 << 20          # JAX_BLINK_NT_BYTES: non-temporal copies from this size
    hugepage_bytes: int = 2 << 20    # JAX_BLINK_HUGEPAGE_BYTES: madvise outputs from this size
    debug: bool = False              # JAX_BLINK_DEBUG: a log line per collective
    barrier: bool = False            # JAX_BLINK_BARRIER: no early start (comparisons only)
    cuda_executor: str = "stream"    # JAX_BLINK_CUDA_EXECUTOR: stream or device (CUDA only)


def executor() -> ExecutorSettings:
    """The executors' settings from the environment (defaults where unset)."""
    d = ExecutorSettings()
    values = {}
    for field, name, unit, hi in (("spin", "JAX_BLINK_SPIN", "iterations", MAX_SPIN),
                                  ("yield_us", "JAX_BLINK_YIELD_US", "microseconds", MAX_YIELD_US),
                                  ("nt_bytes", "JAX_BLINK_NT_BYTES", "bytes", MAX_BYTES),
                                  ("hugepage_bytes", "JAX_BLINK_HUGEPAGE_BYTES", "bytes", MAX_BYTES)):
        values[field] = _whole(None, keyword=None, variable=name, unit=unit, lo=0, hi=hi,
                               default=getattr(d, field))
    return ExecutorSettings(push=_flag("JAX_BLINK_PUSH", d.push), debug=debug(),
                            barrier=_flag("JAX_BLINK_BARRIER", d.barrier),
                            cuda_executor=cuda_executor(), **values)


def xla_cpu_threads(devices: int, cores: Optional[int] = None) -> int:
    """The ``PJRT_NPROC`` (XLA CPU's thread pool) for a process of ``devices`` CPU devices on
    ``cores`` cores (default: this machine's): the cores, but at least twice the devices.

    XLA's CPU client runs every device's executions on that one pool. With fewer threads
    than twice the devices, a program that queues many steps without blocking deadlocks
    its collectives (lax.psum and jax_blink.psum alike; jax_blink's time out with an
    error); with more than it needs, every step is slower, as the devices' programs all
    run at once on the cores (64 threads for 8 devices on 2 cores: 1.3-1.5x the step time
    of the default pool, 16: 1.2x; docs/design_notes.md, "XLA CPU's thread pool").

    >>> xla_cpu_threads(8, cores=2)
    16
    >>> xla_cpu_threads(8, cores=32)
    32
    """
    cores = (os.cpu_count() or 1) if cores is None else cores
    return max(int(cores), 2 * int(devices))


def set_xla_cpu_threads(devices: Optional[int] = None, env=None) -> None:
    """Sets ``PJRT_NPROC`` to :func:`xla_cpu_threads` in ``env`` (default: this process's
    environment; a child's environment for :func:`jax_blink.launch.run_local`) unless it sets
    it; ``devices``: the process's CPU devices (default: ``env``'s ``XLA_FLAGS``'
    ``--xla_force_host_platform_device_count``, else 1). Call it before jax starts its CPU
    client, which reads the variable once, when it is made."""
    env = os.environ if env is None else env
    if env.get("PJRT_NPROC", "").strip():
        return
    if devices is None:
        found = re.findall(r"--xla_force_host_platform_device_count=(\d+)", env.get("XLA_FLAGS", ""))
        devices = int(found[-1]) if found else 1
    env["PJRT_NPROC"] = str(xla_cpu_threads(devices))
