"""Timing in interleaved rounds, and how far a paired difference can be trusted.

Every measurement that compares programs (``calibrate``, the benchmarks under
``benchmarks/``) times them the same way: each round calls every program once, in
alternating order, so that all of them see the same machine load; a comparison reads
the median of the per-round differences, and :func:`paired_spread` says how far that
median could lie toward zero by noise alone. Processes of a local job report to the
parent in one line, ``RESULT <json>`` (:func:`print_result`, :func:`read_result`).

Pure Python and numpy: imports no jax.
"""

from __future__ import annotations

import json
import math
import time
from typing import Callable, Mapping, Optional

import numpy as np

__all__ = ["interleaved", "paired", "paired_spread", "print_result", "read_result"]


def interleaved(calls: Mapping[str, Callable[[], object]], rounds: int,
                times: Optional[dict] = None) -> dict:
    """Seconds of each of ``calls`` (name -> a call that returns when its work is done),
    ``rounds`` times, every round calling each once: in order on even rounds, reversed on
    odd ones (neither always first). Appends to ``times`` (name -> list) where given, so
    that more rounds pool with earlier ones; returns it."""
    times = {k: [] for k in calls} if times is None else times
    names = list(calls)
    for r in range(rounds):
        for k in (names if r % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            calls[k]()
            times[k].append(time.perf_counter() - start)
    return times


def paired(times: Mapping[str, list], a: str, b: str) -> np.ndarray:
    """Per round, ``a``'s time minus ``b``'s (in :func:`interleaved`'s order)."""
    return np.asarray(times[a], float) - np.asarray(times[b], float)


def paired_spread(diffs, confidence: float = 0.95) -> float:
    """How far the median of paired differences ``diffs`` could lie toward zero by noise
    alone: the distance from their median to the end of its distribution-free
    ``confidence`` interval (order statistics of the binomial sign test) on zero's side. A
    median farther from zero than this is a measured difference; nearer, the rounds cannot
    tell the two apart.

    Examples
    --------
    >>> paired_spread([-5.0, -4.0, -6.0, -5.5, -4.5, -5.2, -4.8])  # all 7 below zero: the max
    1.0
    >>> paired_spread([-5.0, 4.0, -6.0, 5.5, -4.5, 5.2, -4.8]) > 4.5
    True
    """
    d = np.sort(np.asarray(diffs, float))
    n = len(d)
    # k: the most order statistics cut from each end, P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2
    # (in whole numbers: 2**n overflows a float beyond a thousand rounds)
    tail = round((1 - confidence) * 10**6)
    k, cumulative = 0, 0
    for i in range(n):
        cumulative += math.comb(n, i)
        if 2 * 10**6 * cumulative > tail * 2 ** n:
            break
        k = i + 1
    lo, hi = d[max(k - 1, 0)], d[n - max(k, 1)]
    med = float(np.median(d))
    return float(hi - med) if med < 0 else float(med - lo)


_PREFIX = "RESULT "


def print_result(value) -> None:
    """Reports ``value`` (JSON) to the parent of a local job, on one stdout line."""
    print(_PREFIX + json.dumps(value), flush=True)


def read_result(stdout: str):
    """The value a process reported with :func:`print_result`, or None where it printed none."""
    line = next((ln for ln in stdout.splitlines() if ln.startswith(_PREFIX)), None)
    return None if line is None else json.loads(line[len(_PREFIX):])
