"""Which ranks arrive late: ``jax_blink.stats()``.

The CPU executor's rendezvous notes, for every collective of this process's devices,
how long after the call's first rank each rank joined (the last rank to arrive records
it; ``cc/sync/rendezvous.h``, ``ArrivalLateness``), over each rank count's last 256
calls. A rank that is late call after call (a slower device, a busier host thread, a
straggling input pipeline) delays every rank below it in a tree; a training loop can read
it here and pass those ranks as ``slow_ranks`` when it next compiles its step, so that the
planner makes them leaves (docs/sharp_bits.md, "Slow ranks").

Only in-process collectives are recorded: ranks in several processes (the host
transport, across hosts) and the GPU executor are not (yet).
"""

from __future__ import annotations

from typing import Optional

from jax_blink import _ffi

__all__ = ["stats", "slow_ranks"]


def stats(reset: bool = False) -> dict:
    """Each rank's lateness in this process's recent collectives, by rank count.

    Returns ``{nranks: {"calls": int, "mean_late_ms": [...], "max_late_ms": [...]}}``:
    over the last (at most 256) calls of that many ranks, how long after the first rank
    each rank joined, in milliseconds (rank ``r`` at index ``r``; the first to arrive
    counts 0). ``reset=True`` forgets what was recorded, after returning it (to measure
    the next steps alone).

    Examples
    --------
    >>> jax_blink.stats()[8]["mean_late_ms"]  # doctest: +SKIP
    [0.01, 0.02, 0.01, 5.3, 0.02, 0.01, 0.01, 0.02]
    """
    return {int(s["nranks"]): {"calls": int(s["calls"]), "mean_late_ms": list(s["mean_late_ms"]),
                               "max_late_ms": list(s["max_late_ms"])}
            for s in _ffi.load_extension().arrival_lateness(reset=bool(reset))}


def slow_ranks(nranks: int, threshold_ms: float = 1.0, recorded: Optional[dict] = None) -> list:
    """The ranks of ``nranks``-rank collectives whose mean lateness is above
    ``threshold_ms`` (from ``recorded``, default :func:`stats`), slowest first; ``[]``
    when no such collective was recorded."""
    entry = (stats() if recorded is None else recorded).get(nranks)
    if entry is None:
        return []
    late = entry["mean_late_ms"]
    return sorted((r for r, t in enumerate(late) if t > threshold_ms), key=lambda r: -late[r])
