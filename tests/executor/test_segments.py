"""The CPU executor's segmented allreduce (``ExecArgs::nsegs``): the vector in several input
and output buffers, as a bucket's leaves reach the ``jax_blink_collective_segments`` custom
call. ``run_ranks(segments=...)`` puts each segment in a heap block of its own, so a read or
write past a segment is a heap overflow under the sanitizers (.ci/sanitizers).

The same schedule on the same inputs sums in the same order whatever the segments, so a
segmented call's result must be bit-identical to the one-buffer call's, and both must
pass the summation-order check against numpy (tests/reference.py).
"""

import numpy as np
import pytest

from jax_blink import _ffi
from jax_blink.schedule import lower_trees
from reference import NP_DTYPES, assert_bit_identical, check_sum, lowered, make_inputs

harness = _ffi.load_testing()


def run(schedule, inputs, segments=None, **kw):
    outputs = [np.full_like(x, 7) for x in inputs]  # not the sum anywhere
    errors = harness.run_ranks(schedule, inputs, outputs, 20000, segments=segments, **kw)
    return errors, outputs


def cuts(rng, count, k):
    """``k`` segment sizes (at least 1 each) summing to ``count``, at random places."""
    k = min(k, count)
    at = np.sort(rng.choice(np.arange(1, count), size=k - 1, replace=False)) if k > 1 else []
    return [int(v) for v in np.diff([0, *at, count])]


@pytest.mark.parametrize("dtype", list(NP_DTYPES))
@pytest.mark.parametrize("nranks,count,chunks,k", [(2, 1, 1, 1), (3, 7, 3, 7), (8, 1000, 5, 4),
                                                   (8, 100_003, 16, 13), (5, 4099, 8, 2)])
def test_a_segmented_allreduce_sums_as_the_one_buffer_call_bit_for_bit(dtype, nranks, count, chunks, k):
    sched = lowered(nranks, count, dtype, chunks=chunks)
    inputs = make_inputs(dtype, nranks, count)
    rng = np.random.default_rng(count + k)
    segments = cuts(rng, count, k)
    errors, seg = run(sched, inputs, [segments])
    assert errors == [None] * nranks
    check_sum(dtype, inputs, seg[0])
    assert_bit_identical(seg)
    errors, whole = run(sched, inputs)
    assert errors == [None] * nranks
    assert seg[0].tobytes() == whole[0].tobytes()


def test_segments_at_every_chunk_edge_and_inside_chunks():
    """Segments of one element, and segments that end exactly where chunks end: each piece
    of a chunk is copied, reduced and pushed on its own."""
    count = 64
    sched = lowered(8, count, "float32", chunks=8)  # chunks of 8 elements per tree slice
    inputs = make_inputs("float32", 8, count)
    for segments in ([1] * count, [8] * 8, [3, 5, 8, 1, 47]):
        errors, outputs = run(sched, inputs, [segments])
        assert errors == [None] * 8
        check_sum("float32", inputs, outputs[0])
        assert_bit_identical(outputs)


@pytest.mark.parametrize("seed", range(6))
def test_random_trees_with_random_segments(seed):
    rng = np.random.default_rng(100 + seed)
    nranks = int(rng.integers(2, 9))
    trees = []
    for _ in range(int(rng.integers(1, 5))):
        root = int(rng.integers(0, nranks))
        order = [root] + [int(r) for r in rng.permutation([r for r in range(nranks) if r != root])]
        trees.append(type("T", (), dict(root=root, weight=float(rng.uniform(0.5, 2)),
                                        edges=[(order[int(rng.integers(0, i))], order[i])
                                               for i in range(1, nranks)])))
    dtype = list(NP_DTYPES)[seed % len(NP_DTYPES)]
    count = int(rng.integers(2, 30_000))
    sched = np.asarray(lower_trees(trees, nranks=nranks, collective="allreduce", count=count, dtype=dtype,
                                   chunks=int(rng.integers(1, 9))).validate().encode())
    inputs = make_inputs(dtype, nranks, count, seed=seed)
    segments = cuts(rng, count, int(rng.integers(2, 20)))
    ext = _ffi.load_extension()
    saved = ext.configuration()
    for repeat, push in ((1, True), (5, True), (1, False)):  # generations; pulled copies
        try:
            ext.configure(**dict(saved, push=push))
            errors, outputs = run(sched, inputs, [segments], repeat=repeat)
        finally:
            ext.configure(**saved)
        assert errors == [None] * nranks
        check_sum(dtype, inputs, outputs[0])
        assert_bit_identical(outputs)


def test_the_check_rejects_a_wrong_segmented_result():
    """The checks above fail on a sum that dropped a rank, and on an output left unwritten."""
    sched = lowered(8, 1000, "float32", chunks=4)
    inputs = make_inputs("float32", 8, 1000)
    errors, outputs = run(sched, inputs, [[300, 700]])
    assert errors == [None] * 8
    with pytest.raises(AssertionError):
        check_sum("float32", inputs[:-1], outputs[0])
    with pytest.raises(AssertionError):
        check_sum("float32", inputs, np.full_like(outputs[0], 7))


def test_ranks_that_disagree_on_their_segments_all_fail_naming_it():
    sched = lowered(4, 1000, "float32")
    inputs = make_inputs("float32", 4, 1000)
    errors, _ = run(sched, inputs, [[500, 500]] * 3 + [[400, 600]])
    assert len(errors) == 4 and all(e is not None and e.startswith("INVALID_ARGUMENT") for e in errors)
    assert all("disagree on the segments of their vector" in e and "rank 3 has 2 (of other sizes)" in e
               for e in errors)
    errors, _ = run(sched, inputs, [[1000]] * 3 + [[400, 600]])
    assert all("rank 0 has 1 buffer(s), rank 3 has 2 " in e for e in errors)


def test_segments_of_another_collective_are_refused_on_every_rank():
    """Only an allreduce takes its vector in several buffers: a segmented broadcast fails on
    every rank, without running."""
    tree = type("T", (), dict(root=0, weight=1.0, edges=[(0, 1), (0, 2)]))
    sched = np.asarray(lower_trees([tree], nranks=3, collective="broadcast", root=0, count=300,
                                   dtype="float32").validate().encode())
    errors, outputs = run(sched, make_inputs("float32", 3, 300), [[100, 200]])
    assert all(e is not None and e.startswith("INVALID_ARGUMENT") and "only an allreduce" in e for e in errors)
    assert all((o == 7).all() for o in outputs)


def test_bad_segment_lists_are_value_errors_naming_them():
    sched = lowered(2, 10, "float32")
    inputs = make_inputs("float32", 2, 10)
    with pytest.raises(ValueError, match="every count must be at least 1"):
        run(sched, inputs, [[0, 10]])
    with pytest.raises(ValueError, match="one list of element counts for every rank, or one per rank"):
        run(sched, inputs, [[5, 5]] * 3)
