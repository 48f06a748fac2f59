"""Schedule format version 2: the header (reduce op, buffer sizes), reduce_scatter and allgather,
the UNDEFINED state, shards, ordered repeats, lower_trees for the new collectives and lower_ring."""

import dataclasses
import random
from types import SimpleNamespace as Tree

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from jax_blink.schedule import Schedule, ScheduleError, Step, lower_ring, lower_trees
from jax_blink.schedule.constants import HEADER_WORDS, MAGIC
from numpy_executor import numpy_execute, reduce_pair
from reference import v1_words, v2_schedules

OPS = ("sum", "max", "min")


def random_tree(rng, n, root=None):
    perm = list(range(n))
    rng.shuffle(perm)
    if root is not None:
        perm.remove(root)
        perm.insert(0, root)
    return Tree(root=perm[0], edges=[(perm[rng.randrange(i)], perm[i]) for i in range(1, n)],
                weight=rng.random() + 0.1)


def fold(op, arrays):
    out = arrays[0]
    for x in arrays[1:]:
        out = reduce_pair(op, out, x)
    return out


def expected(s, inputs):
    """Per rank, the output the collective promises (None where it promises nothing)."""
    n = s.nranks
    if s.collective == "allreduce":
        return [fold(s.op, inputs)] * n
    if s.collective == "reduce":
        return [fold(s.op, inputs) if r == s.root else None for r in range(n)]
    if s.collective == "broadcast":
        return [inputs[s.root]] * n
    if s.collective == "allgather":
        return [np.concatenate(inputs)] * n
    return [fold(s.op, [x[slice(*s.shard(r))] for x in inputs]) for r in range(n)]


def check_numpy(s, seed=0):
    rng = np.random.default_rng(seed)
    inputs = [rng.integers(-100, 100, s.in_count).astype(np.float64) for _ in range(s.nranks)]
    out = numpy_execute(s, inputs)
    for r, want in enumerate(expected(s, inputs)):
        if want is not None:
            np.testing.assert_array_equal(out[r], want)


# ------------------------------------------------------------------ header
def test_the_header_has_twelve_words_and_records_op_and_buffer_sizes():
    s = lower_ring([0, 1, 2], collective="reduce_scatter", count=12, dtype="float32", op="max")
    w = s.encode().tolist()
    assert HEADER_WORDS == 12
    assert w[:HEADER_WORDS] == [MAGIC, 2, 3, 12, 3, -1, 0, 1, 12, 4, 3, 1]
    assert (s.in_count, s.out_count, s.shard(1)) == (12, 4, (4, 8))
    g = lower_ring([0, 1, 2], collective="allgather", count=12, dtype="float32", op="min")
    assert g.encode().tolist()[4:10] == [4, -1, 0, 2, 4, 12]
    assert Schedule.decode(g.encode()) == g


def test_version_1_arrays_still_decode_as_sum_schedules():
    s = lower_trees([Tree(root=0, edges=[(0, 1), (0, 2)], weight=1.0)], nranks=3, collective="allreduce",
                    count=50, dtype="int32", chunks=2)
    back = Schedule.decode(v1_words(s)).validate()
    assert back == s and back.op == "sum" and back.in_count == back.out_count == 50


@pytest.mark.parametrize("version", [0, 3, -1, 1 << 40])
def test_other_versions_are_refused_by_name(version):
    w = lower_ring([0, 1], collective="allreduce", count=4, dtype="float32").encode()
    w[1] = version
    with pytest.raises(ScheduleError, match=f"version {version}"):
        Schedule.decode(w)


@pytest.mark.parametrize("coll, word, value, message", [
    ("reduce_scatter", 8, 4, "in_count is 4.*takes 12"),
    ("reduce_scatter", 9, 12, "out_count is 12.*gives 4"),
    ("allgather", 8, 12, "in_count is 12.*takes 4"),
    ("allgather", 9, 4, "out_count is 4.*gives 12"),
    ("allreduce", 9, 11, "out_count is 11.*gives 12"),
    ("allreduce", 7, 3, "reduce-op code 3"),
])
def test_header_words_that_disagree_with_the_collective_are_refused_naming_both(coll, word, value, message):
    w = lower_ring([0, 2, 1], collective=coll, count=12, dtype="float32").encode()
    w[word] = value
    with pytest.raises(ScheduleError, match=message):
        Schedule.decode(w)


def test_json_carries_the_op_and_version_1_json_still_loads():
    s = lower_ring([1, 0, 2], collective="allgather", count=9, dtype="bfloat16", op="min")
    d = s.to_dict()
    assert d["version"] == 2 and d["op"] == "min"
    assert Schedule.from_json(s.to_json()) == s
    old = lower_ring([1, 0, 2], collective="allreduce", count=9, dtype="float32").to_dict()
    del old["op"]
    old["version"] = 1
    assert Schedule.from_json(old).op == "sum"
    with pytest.raises(ScheduleError, match="reduce op 'prod'"):
        Schedule.from_json(dict(d, op="prod"))
    with pytest.raises(ScheduleError, match="version 3"):
        Schedule.from_json(dict(d, version=3))


# -------------------------------------------------------------- structure
def test_sharded_collectives_need_count_divisible_by_nranks():
    s = lower_ring([0, 1, 2], collective="allreduce", count=10, dtype="float32")
    with pytest.raises(ScheduleError, match="divisible"):
        dataclasses.replace(s, collective="reduce_scatter").validate()
    with pytest.raises(ScheduleError, match="divisible"):
        lower_ring([0, 1, 2], collective="allgather", count=10, dtype="float32")


def test_a_chunk_across_a_shard_boundary_is_refused():
    s = lower_ring([0, 1], collective="reduce_scatter", count=4, dtype="float32", chunks=2)
    # merge chunks 1 and 2 ([1, 2) and [2, 3)): the result crosses the boundary at 2
    chunks = ((0, 1), (1, 2), (3, 1))
    steps = tuple(tuple(dataclasses.replace(x, chunk=min(x.chunk, 2) - (x.chunk == 3)) for x in r) for r in s.steps)
    with pytest.raises(ScheduleError, match="crosses the boundary of shard 0"):
        dataclasses.replace(s, chunks=chunks, steps=steps).validate()


@pytest.mark.parametrize("coll", ["reduce_scatter", "allgather"])
def test_sharded_collectives_have_no_root(coll):
    s = lower_ring([0, 1], collective=coll, count=4, dtype="float32")
    with pytest.raises(ScheduleError, match="no root"):
        dataclasses.replace(s, root=0).validate()


def test_unknown_op_is_refused():
    s = lower_ring([0, 1], collective="allreduce", count=4, dtype="float32")
    with pytest.raises(ScheduleError, match="unknown reduce op 'prod'"):
        dataclasses.replace(s, op="prod").validate()


# -------------------------------------------------------- UNDEFINED state
def test_sending_an_undefined_chunk_is_refused():
    # rank 0 forwards rank 1's shard before receiving it
    steps = ((Step("SEND", 0, 1), Step("SEND", 1, 1)), (Step("RECV_COPY", 0, 0), Step("RECV_COPY", 1, 0)))
    with pytest.raises(ScheduleError, match="sends chunk 1 to rank 1, but the chunk is UNDEFINED"):
        Schedule(2, 4, "allgather", -1, "float32", 1, ((0, 2), (2, 2)), steps).validate()


def test_reducing_into_an_undefined_chunk_is_refused():
    steps = ((Step("SEND", 0, 1), Step("RECV_COPY", 1, 1)),
             (Step("RECV_REDUCE", 0, 0), Step("SEND", 1, 0)))
    with pytest.raises(ScheduleError, match="reduces chunk 0 from rank 0 into an UNDEFINED chunk"):
        Schedule(2, 4, "allgather", -1, "float32", 1, ((0, 2), (2, 2)), steps).validate()


def test_a_copy_defines_a_chunk_and_an_allgather_needs_every_chunk_defined():
    exchange = ((Step("SEND", 0, 1), Step("RECV_COPY", 1, 1)), (Step("SEND", 1, 0), Step("RECV_COPY", 0, 0)))
    s = Schedule(2, 4, "allgather", -1, "float32", 1, ((0, 2), (2, 2)), exchange).validate()
    check_numpy(s)
    one_way = ((Step("SEND", 0, 1),), (Step("RECV_COPY", 0, 0),))
    with pytest.raises(ScheduleError, match="allgather: rank 0 ends with chunk 1 UNDEFINED"):
        Schedule(2, 4, "allgather", -1, "float32", 1, ((0, 2), (2, 2)), one_way).validate()


def test_reduce_scatter_checks_each_rank_for_its_own_shard_only():
    # each rank reduces its own shard (chunk r) from the other: nothing else is needed
    steps = ((Step("SEND", 1, 1), Step("RECV_REDUCE", 0, 1)), (Step("SEND", 0, 0), Step("RECV_REDUCE", 1, 0)))
    s = Schedule(2, 4, "reduce_scatter", -1, "int32", 1, ((0, 2), (2, 2)), steps, (), "max").validate()
    check_numpy(s)
    # the same steps reduce the wrong shards when the shards swap owners
    swapped = tuple(tuple(dataclasses.replace(x, chunk=1 - x.chunk) for x in r) for r in steps)
    with pytest.raises(ScheduleError, match="reduce_scatter: rank 0 ends with chunk 0 = sum over ranks \\[0\\]"):
        Schedule(2, 4, "reduce_scatter", -1, "int32", 1, ((0, 2), (2, 2)), swapped).validate()


# -------------------------------------------------------- ordered repeats
def test_a_triple_may_repeat_and_the_kth_send_matches_the_kth_recv():
    # the two ranks exchange inputs and add them; rank 1 then sends its sum to rank 0, which
    # overwrites its own: chunk 0 goes 1->0 twice, first rank 1's input, then the sum
    steps = ((Step("SEND", 0, 1), Step("RECV_REDUCE", 0, 1, 0, (0,)), Step("RECV_COPY", 0, 1, 0, (1,))),
             (Step("SEND", 0, 0), Step("RECV_REDUCE", 0, 0, 0, (0,)), Step("SEND", 0, 0, 0, (1,))))
    s = Schedule(2, 3, "allreduce", -1, "float64", 1, ((0, 3),), steps).validate()
    check_numpy(s)
    assert Schedule.decode(s.encode()) == s


def test_repeated_triples_must_be_sent_and_received_equally_often():
    steps = ((Step("SEND", 0, 1), Step("RECV_REDUCE", 0, 1, 0, (0,)), Step("RECV_COPY", 0, 1, 0, (1,))),
             (Step("SEND", 0, 0), Step("RECV_REDUCE", 0, 0, 0, (0,))))
    with pytest.raises(ScheduleError, match="sent 1->0 1 time.*received 2 time"):
        Schedule(2, 3, "allreduce", -1, "float64", 1, ((0, 3),), steps).validate()


def test_repeated_sends_of_a_triple_must_be_ordered_by_dependencies():
    # rank 1 sends chunk 0 to rank 0 twice with no dependency between the two SENDs
    steps = ((Step("RECV_COPY", 0, 1), Step("RECV_COPY", 0, 1, 0, (0,))),
             (Step("SEND", 0, 0), Step("SEND", 0, 0)))
    with pytest.raises(ScheduleError, match="steps 0 and 1 both send chunk 0 to rank 0"):
        Schedule(2, 3, "broadcast", 1, "float64", 1, ((0, 3),), steps).validate()
    ordered = ((steps[0]), (Step("SEND", 0, 0), Step("SEND", 0, 0, 0, (0,))))
    check_numpy(Schedule(2, 3, "broadcast", 1, "float64", 1, ((0, 3),), ordered).validate())


# ---------------------------------------------------------------- lowering
@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 7), st.integers(1, 3), st.integers(1, 40), st.integers(1, 4),
       st.sampled_from(["reduce_scatter", "allgather", "allreduce", "reduce", "broadcast"]), st.sampled_from(OPS))
def test_lowered_trees_of_every_collective_compute_it_in_numpy(seed, n, per_rank, shard, k, coll, op):
    rng = random.Random(seed)
    if coll in ("reduce_scatter", "allgather"):
        trees = [random_tree(rng, n, root=r) for r in range(n) for _ in range(per_rank)]
    else:
        trees = [random_tree(rng, n)] * (per_rank if coll == "allreduce" else 1)
    s = lower_trees(trees, nranks=n, collective=coll, root=trees[0].root, count=n * shard, dtype="float32",
                    chunks=k, op=op, align_bytes=8).validate()
    assert s.op == op
    assert Schedule.decode(s.encode()) == s
    assert Schedule.from_json(s.to_json()) == s
    check_numpy(s, seed)


def test_sharded_lowering_keeps_chunks_inside_shards_aligned_to_the_shard_start():
    stars = [Tree(root=r, edges=[(r, c) for c in range(3) if c != r], weight=1.0) for r in range(3)]
    s = lower_trees(stars + stars[:1], nranks=3, collective="reduce_scatter", count=3 * 100, dtype="float32",
                    chunks=3, align_bytes=64).validate()
    for offset, length in s.chunks:
        shard = offset // 100
        assert (offset - 100 * shard) % 16 == 0 and offset + length <= 100 * (shard + 1)
    # rank 0 roots two trees of equal weight: its shard is split between them
    assert {c[0] for c in s.chunks if c[0] < 100} >= {0, 48}


def test_sharded_lowering_needs_a_tree_rooted_at_every_rank():
    stars = [Tree(root=r, edges=[(r, c) for c in range(4) if c != r], weight=1.0) for r in (0, 2)]
    with pytest.raises(ScheduleError, match=r"no tree is rooted at rank\(s\) \[1, 3\]"):
        lower_trees(stars, nranks=4, collective="allgather", count=8, dtype="float32")


@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter", "allgather"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_rings_compute_their_collective_in_numpy(coll, op, n):
    order = random.Random(n).sample(range(n), n)
    s = lower_ring(order, collective=coll, count=n * 6, dtype="int32", chunks=2, op=op).validate()
    check_numpy(s, n)


def test_a_ring_allreduce_is_nccls_algorithm_with_repeated_triples():
    n, order = 4, [2, 0, 3, 1]
    s = lower_ring(order, collective="allreduce", count=n * 10, dtype="float32", chunks=1).validate()
    transfers = list(s.transfers())
    # every link carries each chunk at most twice, and only ring links are used
    successor = {order[p]: order[(p + 1) % n] for p in range(n)}
    assert all(successor[u] == v for u, v, _, _ in transfers)
    # 2 (n - 1) transfers per chunk (NCCL: n - 1 reduce-scatter and n - 1 all-gather steps)
    assert len(transfers) == 2 * (n - 1) * len(s.chunks)
    triples = [(u, v, c) for u, v, c, _ in transfers]
    assert max(triples.count(t) for t in set(triples)) == 2
    # the segment of the rank at position p completes there: p receives its last partial via RECV_REDUCE
    for p, x in enumerate(order):
        chunk = next(c for c, (off, _) in enumerate(s.chunks) if off == x * 10)
        reduces = [st_ for st_ in s.steps[x] if st_.chunk == chunk and st_.op == "RECV_REDUCE"]
        assert [st_.peer for st_ in reduces] == [order[(p - 1) % n]]
        assert not [st_ for st_ in s.steps[x] if st_.chunk == chunk and st_.op == "RECV_COPY"]


@pytest.mark.parametrize("bad, message", [
    (dict(order=[0, 0, 1]), "permutation"),
    (dict(order=[0, 1], collective="reduce"), "unknown collective 'reduce'"),
    (dict(order=[0, 1], chunks=0), "chunks must be a positive int"),
    (dict(order=[0, 1], op="prod"), "unknown reduce op"),
])
def test_lower_ring_names_bad_arguments(bad, message):
    kwargs = dict(order=[0, 1], collective="allreduce", count=8, dtype="float32")
    kwargs.update(bad)
    with pytest.raises(ScheduleError, match=message):
        lower_ring(kwargs.pop("order"), **kwargs)


def test_plan_lower_passes_the_op_on():
    import jax_blink
    from jax_blink.topo import Topology

    plan = jax_blink.plan(Topology.preset("shm:4"))
    s = plan.lower(4 * 64, "float32", op="min").validate()
    assert s.op == "min" and s.count == 64
    assert plan.lower(4 * 64, "float32").op == "sum"


@pytest.mark.parametrize("op", OPS)
def test_the_shared_v2_schedules_compute_their_collectives_in_numpy(op):
    for name, s in v2_schedules(4, 4 * 9, "float32", op).items():
        check_numpy(s)
