"""A reference executor for the planning tests: a schedule run on numpy arrays.

Each rank runs, in list order among those ready, any step whose
dependencies are done (a RECV once its SEND is done), with value semantics
(a RECV gets the value its SEND had when sent), as
``docs/schedule_format.md`` specifies for format version 2: the reduce op
(:func:`reduce_pair`), allgather's initial accumulator (the own shard
defined, the other chunks UNDEFINED until a RECV_COPY writes them),
reduce_scatter's output (the own shard of the accumulator), and repeated
(sender, receiver, chunk) triples (the k-th SEND matches the k-th RECV).
"""

from collections import deque

import numpy as np


def reduce_pair(op, a, b):
    """``op(a, b)`` elementwise as the format defines it (float64 or integer arrays).

    sum: ``a + b``. max/min: a NaN operand counts as -inf (max) or +inf
    (min), so a NaN never wins and an all-NaN reduction is -inf / +inf, as
    XLA CPU's ``lax.pmax`` / ``lax.pmin`` give; equal values are the same
    bits except +0 and -0, where max gives +0 and min gives -0 whichever
    operand holds it.
    """
    if op == "sum":
        return a + b
    if not np.issubdtype(np.asarray(a).dtype, np.floating):
        return np.maximum(a, b) if op == "max" else np.minimum(a, b)
    fill = -np.inf if op == "max" else np.inf
    a = np.where(np.isnan(a), fill, a)
    b = np.where(np.isnan(b), fill, b)
    if op == "max":
        tie = np.where(np.signbit(a), b, a)
        return np.where(a > b, a, np.where(b > a, b, tie))
    tie = np.where(np.signbit(a), a, b)
    return np.where(a < b, a, np.where(b < a, b, tie))


def numpy_execute(schedule, inputs):
    """Run a schedule on numpy arrays, any ready step first, with value semantics.

    ``inputs[r]`` has ``schedule.in_count`` elements. Returns each rank's
    output (``schedule.out_count`` elements) in float64 (exact for the small
    integers the tests use). Elements a rank never defined are NaN.
    """
    n, count, coll = schedule.nranks, schedule.count, schedule.collective
    op = getattr(schedule, "op", "sum")
    acc, defined = [], []
    for r, x in enumerate(inputs):
        x = np.asarray(x).astype(np.float64)
        if coll == "allgather":
            lo, hi = schedule.shard(r)
            a = np.full(count, np.nan)
            a[lo:hi] = x
            d = np.zeros(count, bool)
            d[lo:hi] = True
        else:
            a, d = x.copy(), np.ones(count, bool)
        acc.append(a)
        defined.append(d)
    sent = {}  # (sender, receiver, chunk) -> values sent and not yet received, in order
    done = [[False] * len(s) for s in schedule.steps]
    left = sum(len(s) for s in schedule.steps)
    while left:
        progressed = False
        for r, steps in enumerate(schedule.steps):
            for i, s in enumerate(steps):
                if done[r][i] or not all(done[r][d] for d in s.deps):
                    continue
                lo, m = schedule.chunks[s.chunk]
                key = (r, s.peer, s.chunk) if s.op == "SEND" else (s.peer, r, s.chunk)
                if s.op == "SEND":
                    assert defined[r][lo:lo + m].all(), f"rank {r} sends UNDEFINED chunk {s.chunk}"
                    sent.setdefault(key, deque()).append(acc[r][lo:lo + m].copy())
                elif sent.get(key):
                    v = sent[key].popleft()
                    if s.op == "RECV_REDUCE":
                        assert defined[r][lo:lo + m].all(), f"rank {r} reduces into UNDEFINED chunk {s.chunk}"
                        acc[r][lo:lo + m] = reduce_pair(op, acc[r][lo:lo + m], v)
                    else:
                        acc[r][lo:lo + m] = v
                        defined[r][lo:lo + m] = True
                else:
                    continue
                done[r][i] = True
                left -= 1
                progressed = True
        assert progressed, "deadlock"
    if coll == "reduce_scatter":
        return [acc[r][slice(*schedule.shard(r))] for r in range(n)]
    return acc
