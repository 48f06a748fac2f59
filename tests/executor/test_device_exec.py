"""The device executor's interpreter, in its host build, against the CPU executor and numpy.

``_blink_testing.run_device_ranks`` runs ``cc/device/device_interp.h`` (the
step interpreter the CUDA kernel compiles too) with one ``std::thread`` per
program block and ``std::atomic_ref`` flags. Every schedule family the other
executor tests build runs here: v1 and v2, every collective and reduce op and
dtype, split plans, rings with repeated triples, random trees, and schedules
whose step lists are shuffled into random orders of their dependencies.
Outputs must equal the CPU executor's (``run_ranks``) bit for bit and
numpy's reference (``reference.check_outputs``). Failures: a rank that never
starts and a rank that stops in mid-call give DEADLINE_EXCEEDED on every rank,
naming it, and the next call on the same flags succeeds (nothing is reset).
"""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from jax_blink import _ffi
from jax_blink.schedule import lower_ring, lower_trees
from reference import NP_DTYPES, check_outputs, make_inputs, v1_words, v2_schedules

harness = _ffi.load_testing()

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint32"]
OPS = ["sum", "max", "min"]


def inputs_for(s, seed=0):
    """Inputs of in_count elements; max/min get NaN, signed zeros and infinities too."""
    return make_inputs(s.dtype, s.nranks, s.in_count, seed, specials=s.op != "sum")


def fresh_outputs(s, fill=7):
    return [np.full(s.out_count, fill, NP_DTYPES[s.dtype]) for _ in range(s.nranks)]


def run_cpu(words, s, inputs):
    outputs = fresh_outputs(s)
    errors = harness.run_ranks(words, inputs, outputs, 20000)
    assert errors == [None] * s.nranks, errors
    return outputs


def run_device(words, s, inputs, repeat=1, **kw):
    outputs = fresh_outputs(s, fill=3)
    calls = harness.run_device_ranks(words, inputs, outputs, timeout_ms=20000, repeat=repeat, **kw)
    assert calls == [[None] * s.nranks] * repeat, calls
    return outputs


def counted(s, outputs):
    """The outputs the collective defines (a reduce's non-roots are unspecified)."""
    return [o for r, o in enumerate(outputs) if s.collective != "reduce" or r == s.root]


def check_against_cpu(s, inputs=None, words=None, **kw):
    """The device executor gives numpy's result and the CPU executor's bits."""
    inputs = inputs_for(s) if inputs is None else inputs
    words = np.asarray(s.encode()) if words is None else words
    device = run_device(words, s, inputs, **kw)
    check_outputs(s, inputs, device)
    cpu = run_cpu(words, s, inputs)
    for r, (a, b) in enumerate(zip(counted(s, cpu), counted(s, device))):
        assert a.tobytes() == b.tobytes(), f"rank {r}: device executor's bits differ from the CPU's"
    return device


# ------------------------------------------------------------------ results
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_every_collective_and_op_equals_the_cpu_executor_bitwise(dtype, op):
    for name, s in v2_schedules(4, 4 * 37, dtype, op).items():
        check_against_cpu(s, inputs_for(s, seed=len(name)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_version_1_schedules(dtype):
    s = v2_schedules(4, 4 * 29, dtype, "sum")["trees:allreduce"]
    check_against_cpu(s, words=v1_words(s))


@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter", "allgather"])
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_rings_with_repeated_triples(coll, n):
    s = lower_ring(list(range(n))[::-1], collective=coll, count=n * 1000 + (7 if coll == "allreduce" else 0),
                   dtype="float32", chunks=3, op="sum").validate()
    check_against_cpu(s, inputs_for(s, n))


@pytest.mark.parametrize("nranks", [2, 5, 8])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_split_plans_and_eight_ranks(nranks, dtype):
    s = v2_schedules(nranks, nranks * 101, dtype, "sum", chunks=3)["trees:allreduce-split"]
    check_against_cpu(s)


def _random_tree(rng, nranks, root):
    order = [root] + [int(r) for r in rng.permutation([r for r in range(nranks) if r != root])]
    return [(order[int(rng.integers(0, i))], order[i]) for i in range(1, nranks)]


def random_schedule(seed):
    """Random trees of a random collective, reduce op, dtype, size and chunk count."""
    rng = np.random.default_rng(seed)
    nranks = int(rng.integers(2, 9))
    coll = ["allreduce", "broadcast", "reduce", "reduce_scatter", "allgather"][seed % 5]
    root = int(rng.integers(0, nranks))
    if coll in ("reduce_scatter", "allgather"):
        trees = [SimpleNamespace(root=r, edges=_random_tree(rng, nranks, r), weight=float(rng.uniform(0.5, 2)))
                 for r in range(nranks)]
    else:
        trees = [SimpleNamespace(root=root if coll != "allreduce" else int(rng.integers(0, nranks)),
                                 edges=None, weight=float(rng.uniform(0.5, 2)))
                 for _ in range(int(rng.integers(1, 4)))]
        for t in trees:
            t.edges = _random_tree(rng, nranks, t.root)
    count = nranks * int(rng.integers(1, 400))
    kw = {} if coll in ("allreduce", "reduce_scatter", "allgather") else {"root": root}
    return lower_trees(trees, nranks=nranks, collective=coll, count=count, dtype=DTYPES[seed % 7],
                       chunks=int(rng.integers(1, 6)), op=OPS[seed % 3], **kw).validate()


def shuffled(s, seed):
    """The same schedule with every rank's list in a random order of its dependencies
    (still valid; a list order need not run in sequence, docs/schedule_format.md)."""
    rng = np.random.default_rng(seed)
    ranks = []
    for steps in s.steps:
        n = len(steps)
        deps = [set(st.deps) for st in steps]
        order, done = [], set()
        while len(order) < n:
            ready = [i for i in range(n) if i not in done and deps[i] <= done]
            i = ready[int(rng.integers(0, len(ready)))]
            order.append(i)
            done.add(i)
        new = {old: k for k, old in enumerate(order)}
        ranks.append(tuple(dataclasses.replace(steps[i], deps=tuple(sorted(new[d] for d in steps[i].deps)))
                           for i in order))
    return dataclasses.replace(s, steps=tuple(ranks)).validate()


@pytest.mark.parametrize("seed", range(15))
def test_random_tree_schedules(seed):
    s = random_schedule(seed)
    check_against_cpu(s, inputs_for(s, seed))


@pytest.mark.parametrize("seed", range(10))
def test_schedules_with_shuffled_step_lists(seed):
    s = shuffled(random_schedule(100 + seed), seed)
    check_against_cpu(s, inputs_for(s, seed))


@pytest.mark.parametrize("max_blocks", [1, 2])
def test_fewer_blocks_than_peers(max_blocks):
    s = v2_schedules(6, 6 * 40, "float64", "sum", chunks=3)["trees:reduce_scatter"]
    info = harness.device_program(s.encode(), max_blocks=max_blocks)
    assert info["max_blocks"] == max_blocks
    check_against_cpu(s, max_blocks=max_blocks)


def test_a_block_per_link_into_the_rank():
    s = v2_schedules(4, 4 * 8, "float32", "sum")["trees:allreduce"]
    info = harness.device_program(s.encode())
    for r, blocks in enumerate(info["blocks"]):
        peers = {st.peer for st in s.steps[r] if st.op != "SEND"}
        assert len(blocks) == max(1, len(peers)), (r, blocks, peers)
        assert sorted(i for b in blocks for i in b) == list(range(len(s.steps[r])))
        for b in blocks:  # a block pulls from one peer only
            assert len({s.steps[r][i].peer for i in b if s.steps[r][i].op != "SEND"}) <= 1


def test_float16_and_bfloat16_accumulate_in_float32_and_round_once():
    s = v2_schedules(8, 8 * 16, "float16", "sum")["trees:allreduce"]
    info = harness.device_program(s.encode())
    assert not info["acc_is_out"] and info["workspace_bytes"] == s.count * 4
    x = np.full(s.count, 0.1, np.float16)
    inputs = [x.copy() for _ in range(8)]
    out = run_device(s.encode(), s, inputs)
    want = np.float16(np.float32(np.float16(0.1)) * 8)  # exact in float32 (8 is a power of two)
    assert all((o == want).all() for o in out)


def test_repeated_calls_reuse_the_flags_through_generations():
    s = v2_schedules(5, 5 * 60, "int64", "sum", chunks=3)["ring:allreduce"]
    check_against_cpu(s, repeat=6)


# ------------------------------------------------------------------ failures
def fail_run(s, **kw):
    """The first call faulty (its timeout short), the next ones with the default 20 s."""
    inputs = inputs_for(s)
    outputs = fresh_outputs(s)
    return harness.run_device_ranks(s.encode(), inputs, outputs, timeout_ms=20000, **kw), inputs, outputs


def test_a_rank_that_never_starts_times_out_naming_it_and_the_next_call_succeeds():
    s = v2_schedules(4, 4 * 20, "float32", "sum")["trees:allreduce"]
    calls, inputs, outputs = fail_run(s, faulty_timeout_ms=300, skip_ranks=[2], repeat=2, faulty_calls=1)
    first, second = calls
    assert first[2] is None  # (it never started)
    for r in (0, 1, 3):
        assert first[r].startswith("DEADLINE_EXCEEDED: "), first[r]
        assert "; rank(s) 2 never started; flags never came from rank(s) " in first[r], first[r]
        assert "stopped making progress" not in first[r], first[r]
    assert second == [None] * 4, second  # the same flags, one generation later
    check_outputs(s, inputs, outputs)


@pytest.mark.parametrize("publishes", [0, 1, 3])
def test_a_rank_stopping_in_mid_call_fails_every_rank_naming_it(publishes):
    s = v2_schedules(4, 4 * 20, "float32", "sum", chunks=3)["ring:allreduce"]
    calls, inputs, outputs = fail_run(s, faulty_timeout_ms=300, fault_rank=1, fault_publishes=publishes,
                                      repeat=2, faulty_calls=1)
    first, second = calls
    for r in range(4):
        assert first[r].startswith("DEADLINE_EXCEEDED: "), first[r]
        assert "rank(s) 1 stopped making progress" in first[r], first[r]
        assert f"at rank {r} failed: timed out after 300 ms" in first[r], first[r]
    assert second == [None] * 4, second
    check_outputs(s, inputs, outputs)


def test_timeouts_are_bounded():
    import time

    s = v2_schedules(8, 8 * 10, "float32", "sum")["trees:allreduce"]
    t0 = time.monotonic()
    calls, _, _ = fail_run(s, faulty_timeout_ms=200, skip_ranks=[0, 5])
    assert time.monotonic() - t0 < 5
    assert all(e is None if r in (0, 5) else "rank(s) 0, 5 never started" in e
               for r, e in enumerate(calls[0])), calls


def test_the_checker_rejects_a_wrong_result():
    """check_against_cpu fails on a corrupted device output (the comparisons can fail)."""
    s = v2_schedules(3, 3 * 10, "float32", "sum")["trees:allreduce"]
    inputs = inputs_for(s)
    out = run_device(s.encode(), s, inputs)
    out[1][4] = np.nextafter(out[1][4], np.float32(np.inf))
    with pytest.raises(AssertionError):
        check_outputs(s, inputs, out)
    cpu = run_cpu(s.encode(), s, inputs)
    assert cpu[1].tobytes() != out[1].tobytes()


def test_bad_arguments_raise():
    s = v2_schedules(2, 2 * 10, "float32", "sum")["trees:allreduce"]
    inputs = inputs_for(s)
    with pytest.raises(ValueError, match="needs 20 input and 20 output"):
        harness.run_device_ranks(s.encode(), inputs, [np.zeros(3, np.float32)] * 2)
    with pytest.raises(ValueError, match="apart from the input"):
        harness.run_device_ranks(s.encode(), inputs, inputs)
    with pytest.raises(ValueError, match="skip_ranks"):
        harness.run_device_ranks(s.encode(), inputs, fresh_outputs(s), skip_ranks=[5])
