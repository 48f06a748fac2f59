"""Early start in the CPU executor (issue 58): a rank runs each step as soon as the peers it
touches have arrived, instead of waiting at a call-wide barrier for all of them.

Every test runs in both modes of the executor: ``early`` (the default) and ``barrier``
(configure(barrier=True), JAX_BLINK_BARRIER=1, kept to compare the two). Lateness is injected
by the run_ranks harness (``delays_ms``: a rank's thread sleeps before its call).
"""

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from jax_blink import _ffi
from jax_blink.schedule import lower_trees
from reference import assert_bit_identical, check_sum, lowered, make_inputs

ext = _ffi.load_extension()
harness = _ffi.load_testing()


@pytest.fixture(params=["early", "barrier"])
def mode(request):
    saved = ext.configuration()
    ext.configure(**dict(saved, barrier=request.param == "barrier"))
    try:
        yield request.param
    finally:
        ext.configure(**saved)


def chain_broadcast(nranks, count, chunks):
    """Rank 0's vector down the chain 0 -> 1 -> ... -> nranks - 1."""
    tree = SimpleNamespace(root=0, edges=[(r, r + 1) for r in range(nranks - 1)], weight=1.0)
    s = lower_trees([tree], nranks=nranks, collective="broadcast", root=0, count=count,
                    dtype="float32", chunks=chunks)
    return np.asarray(s.validate().encode())


def run(schedule, inputs, outputs=None, timeout_ms=20000, **kw):
    outputs = [np.zeros_like(x) for x in inputs] if outputs is None else outputs
    return harness.run_ranks(schedule, inputs, outputs, timeout_ms, **kw), outputs


def test_steps_that_do_not_need_a_late_rank_run_before_it_arrives(mode):
    """A broadcast down the chain 0 -> 1 -> 2 -> 3 with rank 3 late by 0.6 s. Early start:
    half-way through the delay, rank 2 already holds the broadcast value, and nothing was
    written into rank 3's output (rank 2 would push into it were it there). With the
    barrier neither has moved. In the end every rank holds the value."""
    n, count, delay_ms = 4, 100_000, 600.0
    sched = chain_broadcast(n, count, chunks=4)
    x = np.random.default_rng(0).standard_normal(count).astype(np.float32)
    inputs = [x] + [np.zeros(count, np.float32)] * (n - 1)
    sentinel = np.float32(-7.5)
    outputs = [np.full(count, sentinel, np.float32) for _ in range(n)]
    result = {}
    worker = threading.Thread(target=lambda: result.update(
        errors=run(sched, inputs, outputs, delays_ms=[0, 0, 0, delay_ms])[0]))
    worker.start()
    time.sleep(delay_ms / 2000)
    mid = [o.copy() for o in outputs]
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert result["errors"] == [None] * n
    assert np.all(mid[3] == sentinel)  # a late rank's buffers are touched only once it is there
    if mode == "early":
        np.testing.assert_array_equal(mid[1], x)
        np.testing.assert_array_equal(mid[2], x)
    else:
        assert np.all(mid[2] == sentinel)
    for o in outputs:
        np.testing.assert_array_equal(o, x)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
def test_results_do_not_depend_on_who_is_late(dtype):
    """Random lateness on every rank, both modes: the sums equal numpy's and are bit-identical
    to a run where nobody is late (the reduction order is the schedule's, not the arrival
    order)."""
    n, count = 6, 20_011
    sched = lowered(n, count, dtype, chunks=4)
    inputs = make_inputs(dtype, n, count)
    errors, punctual = run(sched, inputs)
    assert errors == [None] * n
    check_sum(dtype, inputs, punctual[0])
    rng = np.random.default_rng(58)
    saved = ext.configuration()
    try:
        for barrier in (False, True):
            ext.configure(**dict(saved, barrier=barrier))
            for _ in range(3):
                delays = [float(d) for d in rng.uniform(0, 15, n) * (rng.random(n) < 0.5)]
                errors, outputs = run(sched, inputs, delays_ms=delays)
                assert errors == [None] * n, (barrier, delays)
                assert_bit_identical(outputs + punctual)
    finally:
        ext.configure(**saved)


def test_the_checker_sees_a_wrong_sum():
    """The comparisons above reject a result that misses one rank."""
    n, count = 4, 1000
    inputs = make_inputs("float32", n, count)
    wrong = sum(inputs[1:]).astype(np.float32)
    with pytest.raises(AssertionError):
        check_sum("float32", inputs, wrong)
    with pytest.raises(AssertionError):
        assert_bit_identical([np.sum(inputs, axis=0, dtype=np.float32), wrong])


def _chain_allreduce(n, count, chunks):
    tree = SimpleNamespace(root=n - 1, edges=[(r + 1, r) for r in range(n - 1)], weight=1.0)
    s = lower_trees([tree], nranks=n, collective="allreduce", count=count, dtype="float32",
                    chunks=chunks)
    return np.asarray(s.validate().encode())


DISAGREEMENTS = {
    # rank 2 runs another schedule with more steps: late (the others already run on the
    # flags the first rank's schedule sized), or first to arrive
    "more steps, late": (2, "chunks", [0, 0, 30, 0]),
    "more steps, first": (2, "chunks", [30, 30, 0, 30]),
    "another count": (1, "count", [0, 30, 0, 0]),
    "a bad buffer": (3, "buffer", [0, 0, 0, 30]),
}


@pytest.mark.parametrize("case", sorted(DISAGREEMENTS))
def test_a_disagreement_fails_every_rank_with_the_barrier_message(case):
    """Early start checks each peer before touching it; a rank that disagrees (another
    schedule, count or a buffer that does not fit) fails the call on every rank with the
    message the barrier gives, whichever rank arrives first. Nothing hangs."""
    odd, what, delays = DISAGREEMENTS[case]
    n, count = 4, 1000
    scheds = [_chain_allreduce(n, count, 2)] * n
    inputs = [np.ones(count, np.float32) for _ in range(n)]
    if what == "chunks":
        scheds[odd] = _chain_allreduce(n, count, 8)
    elif what == "count":
        scheds[odd] = _chain_allreduce(n, count + 1, 2)
        inputs[odd] = np.ones(count + 1, np.float32)
    else:
        inputs[odd] = np.ones(count - 1, np.float32)
    saved = ext.configuration()
    found = {}
    try:
        for barrier in (True, False):
            ext.configure(**dict(saved, barrier=barrier))
            t0 = time.monotonic()
            found[barrier] = run(scheds, inputs, timeout_ms=30000, delays_ms=delays)[0]
            assert time.monotonic() - t0 < 10  # not the timeout
    finally:
        ext.configure(**saved)
    assert all(e is not None and e.startswith("INVALID_ARGUMENT: ") for e in found[True])
    assert len(set(found[True])) == 1, found[True]  # one verdict for every rank
    assert found[False] == found[True]


def test_a_rank_that_never_arrives_is_named_alike_in_both_modes():
    """A missing rank: every other rank returns DEADLINE_EXCEEDED naming it, with the same
    message in both modes, and the next call of the same op succeeds."""
    n, count = 4, 5000
    sched = lowered(n, count, "float32", chunks=2)
    inputs = make_inputs("float32", n, count)
    saved = ext.configuration()
    found = {}
    try:
        for barrier in (True, False):
            ext.configure(**dict(saved, barrier=barrier))
            found[barrier] = run(sched, inputs, timeout_ms=300, skip_ranks=[1], op_id=5801)[0]
            errors, outputs = run(sched, inputs, op_id=5801)
            assert errors == [None] * n
            check_sum("float32", inputs, outputs[0])
    finally:
        ext.configure(**saved)
    for r in (0, 2, 3):
        assert found[False][r].startswith("DEADLINE_EXCEEDED: "), found[False]
        assert "rank(s) [1] never arrived" in found[False][r]
    assert found[False] == found[True]


def test_a_rank_arriving_after_the_deadline_fails_at_once(mode):
    """The ranks that did arrive leave at their deadline; the late one finds the call
    aborted when it arrives, instead of waiting out its own timeout, and no state is left."""
    n, count = 4, 1000
    sched = _chain_allreduce(n, count, 2)
    inputs = [np.ones(count, np.float32) for _ in range(n)]
    before = harness.rendezvous_stats()
    t0 = time.monotonic()
    errors, _ = run(sched, inputs, timeout_ms=200, delays_ms=[0, 0, 500, 0])
    assert time.monotonic() - t0 < 5
    for r in range(n):
        assert errors[r].startswith("DEADLINE_EXCEEDED: ") and "rank(s) [2] never arrived" in errors[r]
    assert "arrived after the deadline" in errors[2]
    after = harness.rendezvous_stats()
    assert after["entries"] == before["entries"] and after["active_slots"] == before["active_slots"]
