"""Mutated schedules and the two validators' verdicts on them.

One definition of a valid schedule (``docs/schedule_format.md``) is
implemented twice: ``Schedule.decode(words).validate()`` in Python and
``DecodeSchedule`` in C++ (``jax_blink._blink_ext.validate_schedule``). This
module feeds both the same words and compares their accept/reject verdicts.
The words start from real schedules (:func:`seed_schedules`: planner-lowered,
the simulator's baselines, hand-built ones) and are mutated by
:func:`mutate`: field changes, extreme values (0, -1, 2^31, 2^62, the limits
and their neighbours), truncations, extensions, inserted, deleted, duplicated
and reordered steps, repeated transfers, added and dropped dependencies,
changed chunk tables, changed collectives and reduce ops, and now and then
the version 1 encoding of a schedule.

Used by ``tests/schedule/test_validators_agree.py`` (a few thousand cases per
run) and ``tools/fuzz_schedules.py`` (many more; it also writes the seed
corpus of the C++ fuzz target, ``cc/fuzz/``).
"""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import numpy as np

from jax_blink.schedule import Schedule, ScheduleError, Step, lower_ring, lower_trees
from jax_blink.schedule.constants import HEADER_WORDS, HEADER_WORDS_V1, LIMITS, MAGIC, REDUCE_OPS

__all__ = ["Layout", "hand_built", "seed_schedules", "mutate", "mutated_cases", "verdicts", "Verdict"]

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
#: Values every field is tried with (the limits and their neighbours are added per field).
EXTREMES = (0, 1, -1, 2, 3, 7, 63, 64, 65, 255, 256, (1 << 31) - 1, 1 << 31, -(1 << 31), (1 << 32) - 1,
            1 << 32, 1 << 62, -(1 << 62), I64_MAX, I64_MIN, MAGIC)
LIMIT_VALUES = tuple(sorted({v + d for v in LIMITS.values() for d in (-1, 0, 1)}))


# ------------------------------------------------------------------ seeds
def _star(n, root=0):
    return SimpleNamespace(root=root, edges=[(root, i) for i in range(n) if i != root], weight=1.0)


def _chain(n, weight=2.0):
    return SimpleNamespace(root=n - 1, edges=[(i + 1, i) for i in range(n - 1)], weight=weight)


def _random_tree(rng, n):
    perm = list(range(n))
    rng.shuffle(perm)
    return SimpleNamespace(root=perm[0], edges=[(perm[rng.randrange(i)], perm[i]) for i in range(1, n)],
                           weight=rng.random() + 0.1)


def hand_built() -> dict:
    """Small schedules written by hand, at the edges of the format."""
    one = Schedule(1, 5, "allreduce", -1, "int32", 1, ((0, 5),), ((),))
    # two ranks exchange their inputs and each adds the other's: the SENDs
    # read the inputs, so neither RECV waits for a read (value semantics)
    exchange = Schedule(2, 3, "allreduce", -1, "float64", 1, ((0, 3),), (
        (Step("SEND", 0, 1), Step("RECV_REDUCE", 0, 1, 0, (0,))),
        (Step("SEND", 0, 0), Step("RECV_REDUCE", 0, 0, 0, (0,)))))
    # each rank reduces one chunk and sends it back; both list their RECV
    # first, so running each list strictly in order would deadlock, but the
    # dependencies allow the SENDs of the inputs to go first (as executors do)
    out_of_order = Schedule(2, 2, "allreduce", -1, "float32", 1, ((0, 1), (1, 1)), tuple(
        (Step("RECV_REDUCE", own, 1 - r), Step("SEND", own, 1 - r, 0, (0,)),
         Step("SEND", 1 - own, 1 - r), Step("RECV_COPY", 1 - own, 1 - r, 0, (2,)))
        for r, own in ((0, 0), (1, 1))))
    broadcast = Schedule(3, 7, "broadcast", 2, "uint32", 1, ((0, 7),), (
        (Step("RECV_COPY", 0, 2),), (Step("RECV_COPY", 0, 2),), (Step("SEND", 0, 0), Step("SEND", 0, 1))))
    # allgather by exchange: each rank's other chunk is UNDEFINED until copied
    gather = Schedule(2, 4, "allgather", -1, "float32", 1, ((0, 2), (2, 2)), (
        (Step("SEND", 0, 1), Step("RECV_COPY", 1, 1)), (Step("SEND", 1, 0), Step("RECV_COPY", 0, 0))), (), "max")
    scatter = Schedule(2, 4, "reduce_scatter", -1, "int32", 1, ((0, 2), (2, 2)), (
        (Step("SEND", 1, 1), Step("RECV_REDUCE", 0, 1)), (Step("SEND", 0, 0), Step("RECV_REDUCE", 1, 0))), (), "min")
    # chunk 0 goes 1->0 twice: rank 1's input, then the sum (an ordered repeat)
    repeat = Schedule(2, 3, "allreduce", -1, "float64", 1, ((0, 3),), (
        (Step("SEND", 0, 1), Step("RECV_REDUCE", 0, 1, 0, (0,)), Step("RECV_COPY", 0, 1, 0, (1,))),
        (Step("SEND", 0, 0), Step("RECV_REDUCE", 0, 0, 0, (0,)), Step("SEND", 0, 0, 0, (1,)))))
    return {"one-rank": one, "exchange": exchange, "out-of-order": out_of_order, "broadcast": broadcast,
            "allgather-exchange": gather, "reduce-scatter-exchange": scatter, "repeat": repeat}


def seed_schedules(planner: bool = True) -> dict:
    """``{name: Schedule}``: valid schedules the mutations start from.

    Planner-lowered ones (``jax_blink.plan(...).lower(...)``, when
    ``planner``: planning takes a few seconds the first time), every
    baseline of :mod:`jax_blink.sim.baselines`, trees lowered directly for
    the three collectives and several dtypes, and :func:`hand_built` ones.
    """
    from jax_blink.sim.baselines import all_baselines, chain
    from jax_blink.topo import Topology

    seeds = dict(hand_built())
    if planner:
        import jax_blink

        for preset, size, dtype in (("dgx1-v100", 4096, "float32"), ("shm:4", 1 << 14, "bfloat16")):
            seeds[f"plan:{preset}"] = jax_blink.plan(Topology.preset(preset)).lower(size, dtype)
    topo = Topology.preset("dgx1-v100").subset([0, 1, 2, 5, 6])
    for name, s in all_baselines(topo, 8192, "float32").items():
        seeds[f"baseline:{name}"] = s
    seeds["baseline:chain-reduce"] = chain(Topology.preset("shm:3"), 600, "int32", collective="reduce")
    rng = random.Random(1234)
    for n, ntrees, count, chunks, coll, dtype in ((3, 2, 100, 3, "allreduce", "float16"),
                                                  (4, 1, 9, 2, "broadcast", "int64"),
                                                  (5, 1, 40, 4, "reduce", "float64"),
                                                  (2, 1, 1, 1, "allreduce", "float32"),
                                                  (9, 3, 1000, 2, "allreduce", "int32")):
        trees = [_random_tree(rng, n) for _ in range(ntrees)]
        seeds[f"trees:{coll}:{n}"] = lower_trees(trees, nranks=n, collective=coll, root=trees[0].root,
                                                 count=count, dtype=dtype, chunks=chunks)
    # more than 64 ranks: the C++ sets of ranks take several words
    for n, coll, chunks in ((70, "allreduce", 2), (130, "broadcast", 1)):
        tree = _random_tree(rng, n)
        seeds[f"trees:{coll}:{n}"] = lower_trees([tree], nranks=n, collective=coll, root=tree.root, count=4 * n,
                                                 dtype="float32", chunks=chunks)
    seeds["trees:star-chain"] = lower_trees([_star(4), _chain(4)], nranks=4, collective="allreduce",
                                            count=64, dtype="float32", chunks=3)
    # format version 2: reduce ops, the sharded collectives, rings (repeated triples)
    for n, per_rank, shard, chunks, coll, dtype, op in ((3, 1, 5, 2, "reduce_scatter", "float32", "max"),
                                                        (4, 2, 3, 1, "allgather", "bfloat16", "min"),
                                                        (5, 1, 4, 3, "reduce_scatter", "int64", "sum"),
                                                        (66, 1, 1, 1, "allgather", "int32", "sum")):
        trees = [_random_tree(rng, n) for _ in range(n * per_rank)]
        for i, t in enumerate(trees):  # re-root each tree at rank i % n
            t.root, t.edges = i % n, _rerooted(t.edges, i % n)
        seeds[f"trees:{coll}:{n}:{op}"] = lower_trees(trees, nranks=n, collective=coll, count=n * shard,
                                                      dtype=dtype, chunks=chunks, op=op)
    for n, coll, chunks, op in ((4, "allreduce", 2, "max"), (3, "reduce_scatter", 1, "sum"),
                                (5, "allgather", 2, "min"), (2, "allreduce", 1, "sum")):
        order = list(range(n))
        rng.shuffle(order)
        seeds[f"ring:{coll}:{n}"] = lower_ring(order, collective=coll, count=n * 4, dtype="float32",
                                               chunks=chunks, op=op)
    return {name: s.validate() for name, s in seeds.items()}


def _rerooted(edges, root):
    """The (parent, child) edges of the same undirected tree, rooted at ``root``."""
    adj = {}
    for a, b in edges:
        adj.setdefault(a, []).append(b)
        adj.setdefault(b, []).append(a)
    out, seen, stack = [], {root}, [root]
    while stack:
        v = stack.pop()
        for w in adj.get(v, ()):
            if w not in seen:
                seen.add(w)
                out.append((v, w))
                stack.append(w)
    return out


# ---------------------------------------------------------------- layout
@dataclasses.dataclass
class Layout:
    """Where the fields of an encoded schedule are: ``steps[r][i]`` is the word of step i's op."""

    nranks: int
    nchunks: int
    counts_at: int
    steps: list

    @classmethod
    def of(cls, words):
        w = [int(x) for x in words]
        v1 = w[1] == 1
        nranks, nchunks = w[2], w[7] if v1 else w[10]
        counts_at = (HEADER_WORDS_V1 if v1 else HEADER_WORDS) + 2 * nchunks
        pos = counts_at + nranks
        steps = []
        for r in range(nranks):
            starts = []
            for _ in range(w[counts_at + r]):
                starts.append(pos)
                pos += 5 + w[pos + 4]
            steps.append(starts)
        return cls(nranks, nchunks, counts_at, steps)


def _as_schedule_words(s: Schedule, rng=None) -> list:
    """The encoding of ``s``; now and then (given ``rng``) in format version 1 (its 9-word header)."""
    w = [int(x) for x in s.encode()]
    if rng is not None and rng.random() < 0.1:
        w = [MAGIC, 1] + w[2:7] + w[10:]
    return w


# ------------------------------------------------------------- mutations
def _value(rng, old, extra=()):
    """A replacement for a word that held ``old``."""
    k = rng.random()
    if k < 0.35:
        return rng.choice(EXTREMES + tuple(extra))
    if k < 0.5:
        return rng.choice(LIMIT_VALUES)
    if k < 0.85:
        return old + rng.choice((-2, -1, 1, 2, 3, -3, 8, -8))
    return rng.randrange(-4, 70)


def _field_change(rng, s: Schedule, w: list) -> list:
    """One word of the header, chunk table, step counts or a step set to a nearby or extreme value."""
    layout = Layout.of(w)
    flat = [(r, i) for r in range(layout.nranks) for i in range(len(layout.steps[r]))]
    where = rng.random()
    if where < 0.15 or not flat:
        k = rng.randrange(2, HEADER_WORDS if w[1] != 1 else HEADER_WORDS_V1)
    elif where < 0.3:
        k = rng.randrange(HEADER_WORDS, layout.counts_at + layout.nranks)
    elif where < 0.4:
        k = rng.randrange(len(w))
    else:
        r, i = rng.choice(flat)
        start = layout.steps[r][i]
        k = start + rng.randrange(5 + w[start + 4])
    w = list(w)
    w[k] = _value(rng, w[k], extra=(s.nranks, len(s.chunks),
                                     s.count, s.ntrees, s.count // max(s.nranks, 1)))
    return w


def _rebuild(s: Schedule, steps) -> Schedule:
    return dataclasses.replace(s, steps=tuple(tuple(x) for x in steps), routes=())


def _step_edit(rng, s: Schedule) -> Schedule:
    """A structural change to one rank's list that keeps the encoding well-formed."""
    steps = [list(x) for x in s.steps]
    ranks = [r for r in range(s.nranks) if steps[r]]
    if not ranks:
        return s
    r = rng.choice(ranks)
    lst = steps[r]
    i = rng.randrange(len(lst))
    st = lst[i]
    kind = rng.randrange(11)
    if kind == 10:  # repeat a transfer at the end of both lists: a (sender, receiver, chunk) triple again
        sends = [(q, j) for q in range(s.nranks) for j, x in enumerate(steps[q]) if x.op == "SEND"]
        if not sends:
            return s
        q, j = rng.choice(sends)
        x = steps[q][j]
        ordered = rng.random() < 0.8  # else the repeated SEND is unordered (refused)
        steps[q].append(Step("SEND", x.chunk, x.peer, x.tree, tuple(range(len(steps[q]))) if ordered else ()))
        steps[x.peer].append(Step(rng.choice(("RECV_COPY", "RECV_COPY", "RECV_REDUCE")), x.chunk, q, x.tree,
                                  tuple(range(len(steps[x.peer])))))
    elif kind == 0:  # change the op
        lst[i] = dataclasses.replace(st, op=rng.choice(("SEND", "RECV_REDUCE", "RECV_COPY")))
    elif kind == 1:  # drop a dependency
        if st.deps:
            deps = list(st.deps)
            del deps[rng.randrange(len(deps))]
            lst[i] = dataclasses.replace(st, deps=tuple(deps))
    elif kind == 2:  # add a dependency (possibly a duplicate, unsorted)
        if i:
            lst[i] = dataclasses.replace(st, deps=st.deps + (rng.randrange(i),))
    elif kind == 3:  # delete the step, re-pointing later dependencies
        del lst[i]
        for j in range(i, len(lst)):
            lst[j] = dataclasses.replace(lst[j], deps=tuple(d - (d > i) for d in lst[j].deps if d != i))
    elif kind == 4:  # duplicate the step right after itself
        lst.insert(i + 1, st)
        for j in range(i + 2, len(lst)):
            lst[j] = dataclasses.replace(lst[j], deps=tuple(d + (d > i) for d in lst[j].deps))
    elif kind == 5:  # reorder the rank's steps in another order its dependencies allow
        order, done = [], set()
        while len(order) < len(lst):
            ready = [j for j in range(len(lst)) if j not in done and set(lst[j].deps) <= done]
            if not ready:  # an earlier mutation left a dependency pointing forward
                return s
            j = rng.choice(ready)
            order.append(j)
            done.add(j)
        new = {old: k for k, old in enumerate(order)}
        steps[r] = [dataclasses.replace(lst[j], deps=tuple(new[d] for d in lst[j].deps)) for j in order]
    elif kind == 6:  # swap two steps without fixing dependencies
        j = rng.randrange(len(lst))
        lst[i], lst[j] = lst[j], lst[i]
    elif kind == 7:  # move the step to another rank (as a new last step)
        q = rng.randrange(s.nranks)
        del lst[i]
        for j in range(i, len(lst)):
            lst[j] = dataclasses.replace(lst[j], deps=tuple(d - (d > i) for d in lst[j].deps if d != i))
        steps[q].append(dataclasses.replace(st, deps=()))
    elif kind == 8:  # change the peer or the chunk to another valid one
        if rng.random() < 0.5 and s.nranks > 1:
            lst[i] = dataclasses.replace(st, peer=rng.choice([p for p in range(s.nranks) if p != r]))
        else:
            lst[i] = dataclasses.replace(st, chunk=rng.randrange(len(s.chunks)))
    else:  # depend on every earlier step
        lst[i] = dataclasses.replace(st, deps=tuple(range(i)))
    return _rebuild(s, steps)


def _chunk_edit(rng, s: Schedule) -> Schedule:
    """Split, merge or resize chunks (the steps keep their chunk indices)."""
    chunks = [list(c) for c in s.chunks]
    kind = rng.randrange(4)
    if kind == 0 and any(n > 1 for _, n in chunks):  # split one chunk in two
        c = rng.choice([c for c, (_, n) in enumerate(chunks) if n > 1])
        off, n = chunks[c]
        cut = rng.randrange(1, n)
        chunks[c:c + 1] = [[off, cut], [off + cut, n - cut]]
    elif kind == 1 and len(chunks) > 1:  # merge two neighbours
        c = rng.randrange(len(chunks) - 1)
        chunks[c:c + 2] = [[chunks[c][0], chunks[c][1] + chunks[c + 1][1]]]
    elif kind == 2:  # grow or shrink the last chunk, and count with it
        d = rng.choice((-1, 1, 7, 1 << 20))
        if chunks[-1][1] + d >= 1:
            chunks[-1][1] += d
            s = dataclasses.replace(s, count=s.count + d)
    else:  # a huge count, kept consistent
        big = rng.choice(((1 << 48) - 1, 1 << 48, (1 << 48) + 1, 1 << 40, 1 << 62))
        d = big - s.count
        if chunks[-1][1] + d >= 1:
            chunks[-1][1] += d
            s = dataclasses.replace(s, count=big)
    return dataclasses.replace(s, chunks=tuple(tuple(c) for c in chunks), routes=())


def _header_edit(rng, s: Schedule) -> Schedule:
    """Collective, root, reduce op, ntrees or nranks changed with the rest kept consistent."""
    kind = rng.randrange(5)
    if kind == 4:
        return dataclasses.replace(s, op=rng.choice(REDUCE_OPS), routes=())
    if kind == 0:
        coll = rng.choice(("allreduce", "broadcast", "reduce", "reduce_scatter", "allgather"))
        root = rng.randrange(s.nranks) if coll in ("broadcast", "reduce") else -1
        return dataclasses.replace(s, collective=coll, root=root, routes=())
    if kind == 1:
        return dataclasses.replace(s, ntrees=rng.choice((s.ntrees + 1, 1 << 28, (1 << 28) + 1, 1 << 40)),
                                   routes=())
    if kind == 2:  # add idle ranks
        extra = rng.choice((1, 3, 64))
        return dataclasses.replace(s, nranks=s.nranks + extra, steps=s.steps + ((),) * extra, routes=())
    return dataclasses.replace(s, dtype=rng.choice(("float32", "float64", "float16", "bfloat16", "int32",
                                                    "int64", "uint32")), routes=())


def _truncate_or_extend(rng, w: list) -> list:
    kind = rng.randrange(5)
    if kind == 0:
        return w[:rng.randrange(len(w))]
    if kind == 1:
        return w[:-rng.randint(1, min(len(w), 6))]
    if kind == 2:
        return w + [rng.choice(EXTREMES) for _ in range(rng.randint(1, 6))]
    if kind == 3:  # a step more for some rank, its words appended at the end
        layout = Layout.of(w)
        r = rng.randrange(layout.nranks)
        w = list(w)
        w[layout.counts_at + r] += 1
        return w + [rng.randrange(3), rng.randrange(4), rng.randrange(4), 0, 0]
    # insert words in the middle
    k = rng.randrange(len(w) + 1)
    return w[:k] + [rng.choice(EXTREMES) for _ in range(rng.randint(1, 5))] + w[k:]


def _array(rng, w: list) -> np.ndarray:
    """The words as an int64 array, now and then of another type or shape."""
    a = np.asarray(w, dtype=np.int64)
    if rng.random() < 0.97:
        return a
    kind = rng.choice(("int32", "uint32", "int16", "uint64", "float64", "bool", "2-D"))
    if kind == "2-D":
        return a[:len(a) // 2 * 2].reshape(-1, 2)
    return a.astype(kind)


def mutate(rng: random.Random, s: Schedule) -> np.ndarray:
    """One to three random mutations of ``s``, as the words both validators read."""
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        k = rng.random()
        if k < 0.3:
            s = _step_edit(rng, s)
        elif k < 0.4:
            s = _chunk_edit(rng, s)
        elif k < 0.5:
            s = _header_edit(rng, s)
        else:
            w = _as_schedule_words(s, rng)
            return _array(rng, _field_change(rng, s, w) if k < 0.85 else _truncate_or_extend(rng, w))
    return _array(rng, _as_schedule_words(s, rng))


def mutated_cases(seeds: dict, cases: int, seed: int):
    """``(seed name, words)`` of ``cases`` mutations of randomly chosen ``seeds``, reproducibly from ``seed``."""
    rng = random.Random(seed)
    names = sorted(seeds)
    for _ in range(cases):
        name = rng.choice(names)
        yield name, mutate(rng, seeds[name])


# -------------------------------------------------------------- verdicts
@dataclasses.dataclass(frozen=True)
class Verdict:
    """What each validator said: ``None`` (accepted) or its error message."""

    python: str | None
    cpp: str | None

    @property
    def agree(self) -> bool:
        return (self.python is None) == (self.cpp is None)


def verdicts(words, ext) -> Verdict:
    """Both validators' verdicts on ``words``. Only a ``ScheduleError`` (Python)
    or ``ValueError``/``TypeError`` (C++) is a rejection; anything else propagates."""
    try:
        Schedule.decode(words).validate()
        py = None
    except ScheduleError as e:
        py = str(e) or type(e).__name__
    try:
        ext.validate_schedule(words)
        cc = None
    except (ValueError, TypeError) as e:
        cc = str(e) or type(e).__name__
    return Verdict(py, cc)
