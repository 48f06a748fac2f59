"""Every ``JAX_BLINK_*`` setting, read from the environment and validated in one place.

Keyword arguments win over environment variables; each function here takes
the keyword's value (``None``: not given) and falls back to the variable,
then to the default. Variables are read at each call, so a program (or a
test) may change them between traces. The README's "Settings" table lists
the same names and defaults. Pure Python: never imports jax, so the planner
can use it too.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from pathlib import Path
from typing import Optional

__all__ = ["ALGOS", "algo", "plan_file", "DEFAULT_MIN_BYTES", "DEFAULT_TIMEOUT_S", "MAX_TIMEOUT_S", "MAX_CHUNKS", "ExecutorSettings", "min_bytes", "timeout_ms",
           "chunks", "topology_source", "cuda_enabled", "debug", "cache_dir", "executor"]

#: Per-device size (bytes, per dtype group) below which psum calls lax.psum.
#: On 8 CPU devices jax_blink is faster at every size measured, down to one
#: element (benchmarks/bench_psum_cpu.py), so only empty values fall back by
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


def _env(name: str) -> Optional[str]:
    value = os.environ.get(name)
    return None if value is None or value.strip() == "" else value.strip()


def _number(name: str, text: str, what: str, kind=float):
    try:
        value = kind(float(text)) if kind is int else kind(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not {what}") from None
    if value < 0:
        raise ValueError(f"{name}={text!r} must not be negative")
    return value


def _flag(name: str, default: bool) -> bool:
    text = _env(name)
    if text is None:
        return default
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(f"{name}={text!r}: use 1 or 0")


def _is_integer(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Integral)


def _is_real(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real)


def min_bytes(value=None) -> int:
    """``min_bytes=``, else ``JAX_BLINK_MIN_BYTES``, else :data:`DEFAULT_MIN_BYTES`."""
    if value is not None:
        if not _is_integer(value):
            raise TypeError(f"min_bytes must be a whole number of bytes, got {value!r}")
        if value < 0:
            raise ValueError(f"min_bytes must not be negative, got {value}")
        return int(value)
    text = _env("JAX_BLINK_MIN_BYTES")
    if text is None:
        return DEFAULT_MIN_BYTES
    return _number("JAX_BLINK_MIN_BYTES", text, "a number of bytes", int)


def timeout_ms(value=None) -> int:
    """``timeout_s=`` (seconds), else ``JAX_BLINK_TIMEOUT_S``, else
    :data:`DEFAULT_TIMEOUT_S`, as whole milliseconds (rounded up)."""
    where = "timeout_s"
    if value is None:
        text = _env("JAX_BLINK_TIMEOUT_S")
        if text is not None:
            where = "JAX_BLINK_TIMEOUT_S"
        value = DEFAULT_TIMEOUT_S if text is None else \
            _number("JAX_BLINK_TIMEOUT_S", text, "a number of seconds")
    if not _is_real(value):
        raise TypeError(f"{where} must be a number of seconds, got {value!r}")
    if not 0 < value <= MAX_TIMEOUT_S:  # also refuses nan and inf
        raise ValueError(f"{where} must be > 0 and at most {MAX_TIMEOUT_S:g} seconds, got {value}")
    return int(math.ceil(value * 1000))


def chunks(value=None) -> Optional[int]:
    """``chunks=``, else ``JAX_BLINK_CHUNKS``, else None (the planner's model)."""
    where = "chunks"
    if value is None:
        text = _env("JAX_BLINK_CHUNKS")
        if text is None:
            return None
        where = "JAX_BLINK_CHUNKS"
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"JAX_BLINK_CHUNKS={text!r} is not a whole number of chunks") from None
    if not _is_integer(value):
        raise TypeError(f"{where} must be a whole number of chunks per tree, got {value!r}")
    if not 1 <= value <= MAX_CHUNKS:
        raise ValueError(f"{where} must be between 1 and {MAX_CHUNKS} per tree, got {value}")
    return int(value)


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
    text = _env("JAX_BLINK_CUDA")
    if text is None or text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(f"JAX_BLINK_CUDA={text!r}: use 0 to keep psum off the CUDA executor "
                     "(lax.psum on GPUs), 1 (the default) to use it")


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


@dataclasses.dataclass(frozen=True)
class ExecutorSettings:
    """The C++ executors' run-time settings (see the README's table)."""

    spin: int = 0                    # JAX_BLINK_SPIN: busy-wait iterations
    yield_us: int = 200              # JAX_BLINK_YIELD_US: then sched_yield this long
    push: bool = True                # JAX_BLINK_PUSH: completing rank writes ready receivers
    nt_bytes: int = 1 << 20          # JAX_BLINK_NT_BYTES: non-temporal copies from this size
    hugepage_bytes: int = 2 << 20    # JAX_BLINK_HUGEPAGE_BYTES: madvise outputs from this size
    debug: bool = False              # JAX_BLINK_DEBUG: a log line per collective


def executor() -> ExecutorSettings:
    """The executors' settings from the environment (defaults where unset)."""
    d = ExecutorSettings()
    values = {}
    for field, name, what in (("spin", "JAX_BLINK_SPIN", "a number of iterations"),
                              ("yield_us", "JAX_BLINK_YIELD_US", "a number of microseconds"),
                              ("nt_bytes", "JAX_BLINK_NT_BYTES", "a number of bytes"),
                              ("hugepage_bytes", "JAX_BLINK_HUGEPAGE_BYTES", "a number of bytes")):
        text = _env(name)
        values[field] = getattr(d, field) if text is None else _number(name, text, what, int)
    return ExecutorSettings(push=_flag("JAX_BLINK_PUSH", d.push), debug=debug(), **values)
