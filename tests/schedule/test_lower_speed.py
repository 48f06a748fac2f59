"""Lowering grows linearly with the number of chunks, not with its square.

Lowering 1,000 chunks per tree once took 130 times as long as 125 chunks per
tree (94 s against 1.6 s on a DGX-1V plan): every receive scanned the sender's
later steps. These tests check the growth without a clock: eight times the
chunks make exactly eight times the schedule, and the lowering executes about
eight times the Python lines (counted with a trace function, so the count is
the same on a busy machine). The wall-clock time of lowering belongs to the
planner benchmark, not here.
"""

import sys
from collections import defaultdict
from pathlib import Path

import pytest

import jax_blink
from jax_blink.planning import plan
from jax_blink.schedule import lower
from jax_blink.topo import Topology

PACKAGE = str(Path(jax_blink.__file__).resolve().parent)
SMALL, LARGE = 8, 64  # chunks per tree: 8x
#: Python lines executed lowering LARGE against SMALL chunks per tree: 7.8 times as many
#: in linear time (both plans); the quadratic lowering executed 37 times as many.
MOST_WORK_RATIO = 12


@pytest.fixture(scope="module")
def plans():
    return {"dgx1-v100": plan(Topology.preset("dgx1-v100"), cache=False, links="fast"),  # no sliver trees
            "shm:8": plan(Topology.preset("shm:8"), cache=False)}


def executed_lines(fn, also=()):
    """``(lines of jax_blink, and of the functions in also, that fn executed; fn's result)``."""
    codes = {f.__code__ for f in also}
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def calls(frame, event, arg):
        code = frame.f_code
        return local if code.co_filename.startswith(PACKAGE) or code in codes else None

    before = sys.gettrace()
    sys.settrace(calls)
    try:
        result = fn()
    finally:
        sys.settrace(before)
    return count, result


def lowering(p, chunks_per_tree, also=()):
    """Lines executed lowering ``chunks_per_tree`` chunks for every tree of ``p``, and the schedule."""
    # room for every tree's chunks whatever its weight (a chunk is at least 64 bytes, 16 float32)
    count = len(p.trees) * chunks_per_tree * 16 * 4
    return executed_lines(lambda: p.lower(count * 4, "float32", chunks=chunks_per_tree), also)


@pytest.mark.parametrize("preset", ["dgx1-v100", "shm:8"])
def test_eight_times_the_chunks_make_eight_times_the_steps_with_about_eight_times_the_work(plans, preset):
    p = plans[preset]
    small_work, small = lowering(p, SMALL)
    large_work, large = lowering(p, LARGE)
    assert len(small.chunks) == len(p.trees) * SMALL
    assert len(large.chunks) == len(p.trees) * LARGE
    assert [len(r) for r in large.steps] == [8 * len(r) for r in small.steps]
    assert 7 < large_work / small_work < MOST_WORK_RATIO, (small_work, large_work)
    large.validate()


def test_the_work_count_rejects_the_quadratic_lowering(plans, monkeypatch):
    """The check can fail: with the scan lowering once did (every receive looks through the
    sender's later steps for its next write of the chunk), the work grows far past 8x."""
    order_steps = lower._order_steps

    def scanning_order_steps(raw):
        send_at = defaultdict(list)
        for r, steps in enumerate(raw):
            for i, (op, chunk, peer, _) in enumerate(steps):
                if op == "SEND":
                    send_at[(r, peer, chunk)].append(i)
        for r, steps in enumerate(raw):
            for op, chunk, peer, _ in steps:
                if op != "SEND":
                    j = send_at[(peer, r, chunk)][0]
                    for k in range(j + 1, len(raw[peer])):
                        if raw[peer][k][1] == chunk and raw[peer][k][0] != "SEND":
                            break
        return order_steps(raw)

    monkeypatch.setattr(lower, "_order_steps", scanning_order_steps)
    small, _ = lowering(plans["dgx1-v100"], SMALL, also=[scanning_order_steps])
    large, _ = lowering(plans["dgx1-v100"], LARGE, also=[scanning_order_steps])
    assert large / small > MOST_WORK_RATIO, (small, large)


def test_a_million_chunks_requested_are_clamped_to_the_64_byte_blocks(plans):
    schedule = plans["shm:8"].lower(8_000 * 4, "float32", chunks=10 ** 6)
    assert len(schedule.chunks) == 8_000 * 4 // 64
    assert {size for _, size in schedule.chunks} == {16}
    schedule.validate()
