"""Which ranks arrive late: ``jax_blink.stats()``.

The CPU executor's rendezvous notes, for every collective of this process's devices,
how long after the call's first rank each rank joined (``cc/sync/rendezvous.h``,
``ArrivalLateness``), over each rank count's last 256 calls. Over the host transport a
call's ranks live in several processes of the host: each process records every rank of
the call (the ranks of the process that was late among them). A rank that is late call after call (a slower device, a busier host thread, a
straggling input pipeline) delays every rank below it in a tree; a training loop can read
it here and pass those ranks as ``slow_ranks`` when it next compiles its step, so that the
planner makes them leaves (docs/sharp_bits.md, "Slow ranks").

Collectives across hosts (the hierarchical path) and the GPU executor's are not recorded
(yet).
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
    when no such collective was recorded. ValueError for fewer than 2 ranks (a collective
    of one rank waits for nobody) and for a negative or non-finite threshold."""
    if isinstance(nranks, bool) or not isinstance(nranks, int) or nranks < 2:
        raise ValueError(f"jax_blink.slow_ranks: nranks must be a whole number of at least 2 (the ranks of "
                         f"the collectives to look at), got {nranks!r}")
    if isinstance(threshold_ms, bool) or not isinstance(threshold_ms, (int, float)) or not (
            0 <= threshold_ms < float("inf")):
        raise ValueError(f"jax_blink.slow_ranks: threshold_ms must be a finite number of milliseconds, 0 or "
                         f"more, got {threshold_ms!r}")
    entry = (stats() if recorded is None else recorded).get(nranks)
    if entry is None:
        return []
    late = entry["mean_late_ms"]
    return sorted((r for r, t in enumerate(late) if t > threshold_ms), key=lambda r: -late[r])
