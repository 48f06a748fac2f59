"""How far slow-as-leaves trees can cut the time after a late rank arrives, on this machine's memory.

Issue 46 asks that, with one of 8 CPU ranks late, the time from its arrival to the end of
a 1e6-float allreduce be at most 0.7 of the plain plan's. This script times the memory work
each side must do after the arrival, with no executor, no threads of its own per rank and no
waiting: the best any executor could do.

* ``plain``: the executor as it is, whose ranks start once all have joined: all of the
  allreduce remains after the arrival. Each chunk of the 8 inputs is summed in cache and
  written into the 8 outputs (one pass over memory: read 8 vectors, write 8).
* ``leaves, fused``: trees with the late rank as a leaf, on an executor whose ranks start
  before it joins: the 7 punctual ranks' sum is ready (``acc``); each chunk of ``acc`` plus
  the late rank's input is formed in cache and written into the 8 outputs (read 2, write 8).
* ``leaves, two passes``: the same, the late rank's input added into ``acc`` first and
  ``acc`` then copied into the 8 outputs (read 3, write 9), as reducing the late child last
  and then broadcasting does.
* ``plain, early start``: the plain plan on that executor. Shm:8's plain plan is 8 stars,
  each rank the root of an eighth of the vector: the 7 stars that punctual ranks root have
  summed their punctual children before the arrival and finish as the leaves do; the late
  rank's own star (the last eighth here) has all of its work left.

Each side runs on ``--threads`` threads (the vector split between them; numpy releases the
GIL), chunk by chunk, interleaved round by round; medians. On one executor the leaves'
floor is ``leaves / plain, early start`` (with the barrier, nothing is summed before the
arrival whatever the trees, so leaves and plain have the same work left); ``leaves /
plain`` compares them with today's barrier executor. A real executor adds wake-ups and
bookkeeping to every side.

    python benchmarks/bench_late_bound.py [--elements 1e6] [--ranks 8] [--threads 2] [--rounds 41]

Writes benchmarks/results/late_bound_<machine>.json, with the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from _machine import machine, machine_tag

ROOT = Path(__file__).resolve().parent.parent
CHUNK = 1 << 14  # float32 elements per chunk: 64 KiB, a slice that stays in L2


def plain(inputs, outputs, lo, hi):
    t = np.empty(CHUNK, inputs.dtype)
    for a in range(lo, hi, CHUNK):
        b = min(a + CHUNK, hi)
        s = t[:b - a]
        np.sum(inputs[:, a:b], axis=0, out=s)
        outputs[:, a:b] = s


def leaves_fused(acc, late, outputs, lo, hi):
    t = np.empty(CHUNK, acc.dtype)
    for a in range(lo, hi, CHUNK):
        b = min(a + CHUNK, hi)
        s = t[:b - a]
        np.add(acc[a:b], late[a:b], out=s)
        outputs[:, a:b] = s


def leaves_two_passes(acc, late, outputs, lo, hi):
    for a in range(lo, hi, CHUNK):
        b = min(a + CHUNK, hi)
        np.add(acc[a:b], late[a:b], out=acc[a:b])
    for a in range(lo, hi, CHUNK):
        b = min(a + CHUNK, hi)
        outputs[:, a:b] = acc[a:b]


def plain_early_start(inputs, acc, late, outputs, lo, hi, split):
    """Elements below ``split``: stars of punctual roots; the rest: the late rank's star."""
    if lo < split:
        leaves_fused(acc, late, outputs, lo, min(hi, split))
    if hi > split:
        plain(inputs, outputs, max(lo, split), hi)


def timed(work, threads, n):
    """Seconds for ``work(lo, hi)`` over [0, n) split among ``threads`` threads."""
    bounds = np.linspace(0, n, threads + 1).astype(int) // CHUNK * CHUNK
    bounds[-1] = n
    start = threading.Barrier(threads + 1)
    pool = [threading.Thread(target=lambda lo=lo, hi=hi: (start.wait(), work(lo, hi)))
            for lo, hi in zip(bounds[:-1], bounds[1:])]
    for th in pool:
        th.start()
    t0 = time.perf_counter()
    start.wait()
    for th in pool:
        th.join()
    return time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--elements", type=float, default=1e6, help="float32 elements per rank")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--out", help="default: benchmarks/results/late_bound_<machine>.json")
    args = ap.parse_args(argv)
    n, ranks = int(args.elements), args.ranks
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((ranks, n)).astype(np.float32)  # one row per rank
    outputs = np.zeros((ranks, n), np.float32)
    late = inputs[-1]
    punctual = np.sum(inputs[:-1], axis=0, dtype=np.float32)
    acc = punctual.copy()
    split = n - n // ranks  # the late rank's star: the last eighth
    sides = {
        "plain": lambda lo, hi: plain(inputs, outputs, lo, hi),
        "leaves, fused": lambda lo, hi: leaves_fused(acc, late, outputs, lo, hi),
        "leaves, two passes": lambda lo, hi: leaves_two_passes(acc, late, outputs, lo, hi),
        "plain, early start": lambda lo, hi: plain_early_start(inputs, acc, late, outputs, lo, hi,
                                                               split),
    }
    want = np.sum(inputs, axis=0, dtype=np.float64)
    times = {k: [] for k in sides}
    for r in range(args.rounds + 2):
        for k in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            acc[:] = punctual  # (the sum before the arrival, not timed)
            outputs.fill(0)
            t = timed(sides[k], args.threads, n)
            # every output is the sum (float32 rounding of 8 terms)
            bad = max(int((np.abs(o - want) > 1e-4 * (1 + np.abs(want))).sum()) for o in outputs)
            if bad:
                raise SystemExit(f"{k}: {bad} wrong elements")
            if r >= 2:  # two warm-up rounds
                times[k].append(t)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    result = {"machine": machine(), "command": "python benchmarks/bench_late_bound.py "
              + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
              "elements": n, "ranks": ranks, "threads": args.threads, "rounds": args.rounds,
              "ms": med, "leaves_fused_over_plain": med["leaves, fused"] / med["plain"],
              "leaves_two_passes_over_plain": med["leaves, two passes"] / med["plain"],
              "leaves_fused_over_plain_early_start": med["leaves, fused"] / med["plain, early start"]}
    print(f"{n} float32 per rank, {ranks} ranks, {args.threads} threads, median of {args.rounds} rounds")
    for k, v in med.items():
        print(f"  {k:20s} {v:8.3f} ms   / plain {v / med['plain']:.2f}   "
              f"/ plain, early start {v / med['plain, early start']:.2f}")
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"late_bound_{machine_tag()}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
