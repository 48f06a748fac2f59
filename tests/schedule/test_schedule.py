"""The schedule contract: lowering, symbolic validation, JSON and flat encoding."""

import dataclasses
import random
from types import SimpleNamespace as Tree

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from jax_blink.schedule import Schedule, ScheduleError, Step, lower_trees
from numpy_executor import numpy_execute


def random_tree(rng, n):
    perm = list(range(n))
    rng.shuffle(perm)
    edges = [(perm[rng.randrange(i)], perm[i]) for i in range(1, n)]
    return Tree(root=perm[0], edges=edges, weight=rng.random() + 0.1)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 9), st.integers(1, 4), st.integers(1, 3000),
       st.integers(1, 6), st.sampled_from(["allreduce", "broadcast", "reduce"]),
       st.sampled_from(["float32", "bfloat16", "int64"]))
def test_lowered_trees_validate_roundtrip_and_compute_the_sum(seed, n, ntrees, count, k, coll, dtype):
    rng = random.Random(seed)
    trees = [random_tree(rng, n) for _ in range(ntrees if coll == "allreduce" else 1)]
    root = trees[0].root
    s = lower_trees(trees, nranks=n, collective=coll, root=root, count=count, dtype=dtype,
                    chunks=k).validate()
    assert Schedule.decode(s.encode()) == s
    assert Schedule.from_json(s.to_json()) == s
    inputs = [np.random.default_rng(r).integers(-100, 100, count) for r in range(n)]
    out = numpy_execute(s, inputs)
    total = np.sum(inputs, axis=0)
    if coll == "allreduce":
        for r in range(n):
            np.testing.assert_array_equal(out[r], total)
    elif coll == "reduce":
        np.testing.assert_array_equal(out[root], total)
    else:
        for r in range(n):
            np.testing.assert_array_equal(out[r], inputs[root])


def star_allreduce(n=3, count=100, chunks=2):
    star = Tree(root=0, edges=[(0, c) for c in range(1, n)], weight=1.0)
    return lower_trees([star], nranks=n, collective="allreduce", count=count,
                       dtype="float32", chunks=chunks)


def replace_step(s, rank, index, step):
    steps = [list(x) for x in s.steps]
    steps[rank][index] = step
    return Schedule(s.nranks, s.count, s.collective, s.root, s.dtype, s.ntrees, s.chunks,
                    tuple(tuple(x) for x in steps))


def test_double_counting_is_rejected():
    s = star_allreduce()
    # rank 0 reduces twice from rank 1 (and never from rank 2): ranks counted wrong
    i = next(i for i, st_ in enumerate(s.steps[0]) if st_.op == "RECV_REDUCE" and st_.peer == 2)
    bad = replace_step(s, 0, i, Step("RECV_REDUCE", s.steps[0][i].chunk, 1, 0, s.steps[0][i].deps))
    with pytest.raises(ScheduleError, match="twice|never"):
        bad.validate()


def test_unordered_steps_on_one_chunk_are_rejected():
    s = star_allreduce()
    i = next(i for i, st_ in enumerate(s.steps[0]) if st_.deps)
    bad = replace_step(s, 0, i, Step(s.steps[0][i].op, s.steps[0][i].chunk, s.steps[0][i].peer, 0, ()))
    with pytest.raises(ScheduleError, match="does not depend"):
        bad.validate()


def test_missing_contribution_is_rejected():
    s = star_allreduce(n=2)
    # turn the root's RECV_REDUCE into RECV_COPY: rank 0's own input is lost
    i = next(i for i, st_ in enumerate(s.steps[0]) if st_.op == "RECV_REDUCE")
    old = s.steps[0][i]
    bad = replace_step(s, 0, i, Step("RECV_COPY", old.chunk, old.peer, 0, old.deps))
    with pytest.raises(ScheduleError, match="expected ranks"):
        bad.validate()


def test_deadlock_is_rejected():
    # two ranks that each receive before they send
    steps = ((Step("RECV_COPY", 0, 1), Step("SEND", 0, 1, 0, (0,))),
             (Step("RECV_COPY", 0, 0), Step("SEND", 0, 0, 0, (0,))))
    with pytest.raises(ScheduleError, match="deadlocks"):
        Schedule(2, 4, "allreduce", -1, "float32", 1, ((0, 4),), steps).validate()


@pytest.mark.parametrize("corrupt, message", [
    (lambda a: a.__setitem__(0, 7), "magic"),
    (lambda a: a.__setitem__(1, 99), "version"),
    (lambda a: np.append(a, 0), "trailing"),
    (lambda a: a[:-1], "ends at word"),
])
def test_decode_rejects_corrupted_arrays(corrupt, message):
    a = star_allreduce().encode()
    out = corrupt(a)
    a = a if out is None else out
    with pytest.raises(ScheduleError, match=message):
        Schedule.decode(a)


def test_chunks_align_to_64_bytes_and_cover_the_vector():
    s = star_allreduce(n=4, count=1000, chunks=5)
    assert sum(n for _, n in s.chunks) == 1000
    assert all(off % 16 == 0 for off, _ in s.chunks)


def test_unsupported_dtype_is_named():
    with pytest.raises(ScheduleError, match="complex64"):
        lower_trees([Tree(root=0, edges=[], weight=1.0)], nranks=1, collective="allreduce",
                    count=4, dtype="complex64")


def test_non_spanning_tree_names_unreachable_ranks():
    with pytest.raises(ScheduleError, match=r"unreachable \[2\]"):
        lower_trees([Tree(root=0, edges=[(0, 1)], weight=1.0)], nranks=3,
                    collective="allreduce", count=4, dtype="float32")


def test_routes_ride_along_validate_and_survive_json_but_not_the_encoding():
    # rank 0 reaches 1 directly and 2 through switch 3
    star = Tree(root=0, edges=[(0, 1), (0, 2)], weight=1.0)
    s = lower_trees([star], nranks=3, collective="allreduce", count=64, dtype="float32",
                    routes=[[(0, 1), (0, 3, 2)]]).validate()
    assert s.routes == (((0, 1), (0, 3, 2)),)
    assert Schedule.from_json(s.to_json()) == s
    assert Schedule.decode(s.encode()).routes == ()
    assert "routes" not in lower_trees([star], nranks=3, collective="allreduce", count=64,
                                       dtype="float32").to_dict()


@pytest.mark.parametrize("routes, message", [
    ((((0, 1),),), "join no such pair"),                        # the 0-2 transfers have no route
    ((((0, 1), (0, 1, 2)),), "does not join two ranks through switches"),  # through rank 1
    ((((0, 1), (0, 3, 2)), ((0, 1),)), "routes lists 2 trees, ntrees is 1"),
])
def test_routes_that_do_not_carry_the_transfers_are_rejected(routes, message):
    star = Tree(root=0, edges=[(0, 1), (0, 2)], weight=1.0)
    s = lower_trees([star], nranks=3, collective="allreduce", count=64, dtype="float32")
    with pytest.raises(ScheduleError, match=message):
        dataclasses.replace(s, routes=routes).validate()


def test_lowering_rejects_routes_that_do_not_match_the_edges():
    star = Tree(root=0, edges=[(0, 1), (0, 2)], weight=1.0)
    with pytest.raises(ScheduleError, match="do not join the ends of its edges"):
        lower_trees([star], nranks=3, collective="allreduce", count=64, dtype="float32",
                    routes=[[(0, 2), (0, 1)]])
    with pytest.raises(ScheduleError, match="routes lists 2 trees"):
        lower_trees([star], nranks=3, collective="allreduce", count=64, dtype="float32",
                    routes=[[(0, 1), (0, 2)], [(0, 1)]])


def test_docstring_examples_run():
    import doctest
    import importlib
    import pkgutil

    # every module of the planning packages, found on disk, plus the size parser, settings, the
    # numerics checker and the bucketing
    packages = [importlib.import_module(f"jax_blink.{p}") for p in ("topo", "planning", "schedule", "sim")]
    names = [f"{p.__name__}.{info.name}" for p in packages for info in pkgutil.iter_modules(p.__path__)]
    assert len(names) >= 25
    for name in names + ["jax_blink.cli.sizes", "jax_blink.settings", "jax_blink.numerics",
                         "jax_blink.ops.buckets"]:
        module = importlib.import_module(name)
        result = doctest.testmod(module)
        assert result.failed == 0, f"{module.__name__}: {result.failed} doctest(s) failed"
