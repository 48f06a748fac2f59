"""Validation of a schedule: the phases of :meth:`Schedule.validate`, one function each.

:func:`validate` checks the limits of ``docs/schedule_format.md`` and the
structure (chunk partition, indices in range, dependencies distinct and
pointing backwards), the one-to-one SEND/RECV matching, the determinism rule,
the routes a schedule may carry, and finally proves by symbolic execution
that the schedule computes its collective. ``cc/core/validate.cc`` validates
the flat encoding in the same phases and accepts exactly the same schedules
(``tests/schedule/test_validators_agree.py`` checks it on mutated schedules).

Pure Python: never imports jax.
"""

from __future__ import annotations

from .constants import (COLLECTIVE_CODE, COLLECTIVES, DTYPES, HEADER_WORDS, MAX_CHUNKS, MAX_COUNT,
                        MAX_PROOF_WORDS, MAX_RANKS, MAX_STEPS_PER_RANK, MAX_TREES, MAX_WORDS, OP_CODE, OPS,
                        REDUCE_OPS, ROOTED, ScheduleError, io_counts)

__all__ = ["validate", "check_header", "check_io_counts", "check_structure", "check_words", "proof_words",
           "match_transfers", "check_determinism", "check_routes", "symbolic_run"]


def validate(schedule) -> None:
    """Run every check on ``schedule``; see :meth:`~jax_blink.schedule.Schedule.validate`.

    Raises
    ------
    ScheduleError
        Naming the first violation found.
    """
    check_structure(schedule)
    match = match_transfers(schedule)
    guards = check_determinism(schedule)
    check_routes(schedule)
    symbolic_run(schedule, match, guards)


def check_words(nwords: int) -> None:
    """The flat encoding's length is within the limit (checked before reading it)."""
    if nwords > MAX_WORDS:
        raise ScheduleError(f"the encoding has {nwords} words, more than the limit of {MAX_WORDS} "
                            f"(docs/schedule_format.md, \"Limits\")")


def proof_words(nranks: int, nchunks: int, nsteps: int) -> int:
    """Words of state the symbolic proof needs: ``(nranks * nchunks + nsteps) * ceil(nranks / 64)``."""
    return (nranks * nchunks + nsteps) * -(-nranks // 64)


def check_header(nranks: int, count: int, nchunks: int, ntrees: int) -> None:
    """The sizes a header declares are at least 1 and within their limits (and ``nchunks <= count``)."""
    if not 1 <= nranks <= MAX_RANKS:
        raise ScheduleError(f"nranks must be in [1, {MAX_RANKS}], got {nranks}")
    if not 1 <= count <= MAX_COUNT:
        raise ScheduleError(f"count must be in [1, 2^48], got {count}")
    if not 1 <= nchunks <= min(count, MAX_CHUNKS):
        raise ScheduleError(f"nchunks must be in [1, min(count, {MAX_CHUNKS})], got {nchunks}")
    if not 1 <= ntrees <= MAX_TREES:
        raise ScheduleError(f"ntrees must be in [1, {MAX_TREES}], got {ntrees}")


def check_io_counts(collective: str, count: int, nranks: int, in_count: int, out_count: int) -> None:
    """The header's ``in_count`` and ``out_count`` words are those the collective implies (:func:`io_counts`)."""
    want_in, want_out = io_counts(collective, count, nranks)
    if in_count != want_in:
        raise ScheduleError(f"in_count is {in_count}, but a {collective} of count {count} over {nranks} ranks "
                            f"takes {want_in} input elements")
    if out_count != want_out:
        raise ScheduleError(f"out_count is {out_count}, but a {collective} of count {count} over {nranks} ranks "
                            f"gives {want_out} output elements")


def check_structure(schedule) -> None:
    """The limits, header fields, the chunk partition, every step's fields in range; deps distinct and
    pointing backwards.

    The limits are checked as soon as the fields they bound are read, before
    anything sized by them is built (the later phases' state is bounded by
    the proof-state limit).
    """
    nchunks = len(schedule.chunks)
    check_header(schedule.nranks, schedule.count, nchunks, schedule.ntrees)
    if schedule.collective not in COLLECTIVE_CODE:
        raise ScheduleError(f"unknown collective {schedule.collective!r}; expected one of {COLLECTIVES}")
    if schedule.collective not in ROOTED:
        if schedule.root != -1:
            raise ScheduleError(f"{schedule.collective} has no root (use -1), got {schedule.root}")
    elif not 0 <= schedule.root < schedule.nranks:
        raise ScheduleError(f"root {schedule.root} out of range for {schedule.nranks} ranks")
    if schedule.dtype not in DTYPES:
        raise ScheduleError(f"unsupported dtype {schedule.dtype!r}")
    if schedule.op not in REDUCE_OPS:
        raise ScheduleError(f"unknown reduce op {schedule.op!r}; expected one of {REDUCE_OPS}")
    io_counts(schedule.collective, schedule.count, schedule.nranks)  # shards divide the vector
    expected = 0
    for i, (offset, length) in enumerate(schedule.chunks):
        if offset != expected or length < 1:
            raise ScheduleError(
                f"chunk {i} = (offset {offset}, length {length}) breaks the contiguous "
                f"partition of [0, {schedule.count}) (expected offset {expected}, length >= 1)")
        expected += length
    if expected != schedule.count:
        raise ScheduleError(f"chunks cover {expected} elements, count is {schedule.count}")
    if schedule.collective in ("reduce_scatter", "allgather"):
        shard = schedule.count // schedule.nranks
        for i, (offset, length) in enumerate(schedule.chunks):
            if offset // shard != (offset + length - 1) // shard:
                raise ScheduleError(
                    f"chunk {i} = [{offset}, {offset + length}) crosses the boundary of shard {offset // shard} "
                    f"(shards of {shard} elements); a {schedule.collective} chunk lies inside one shard")
    if len(schedule.steps) != schedule.nranks:
        raise ScheduleError(f"steps has {len(schedule.steps)} rank lists, nranks is {schedule.nranks}")
    for rank, steps in enumerate(schedule.steps):
        if len(steps) > MAX_STEPS_PER_RANK:
            raise ScheduleError(f"rank {rank} has {len(steps)} steps, more than the limit of "
                                f"{MAX_STEPS_PER_RANK}")
    check_words(HEADER_WORDS + 2 * nchunks + schedule.nranks
                + sum(5 + len(s.deps) for steps in schedule.steps for s in steps))
    proof = proof_words(schedule.nranks, nchunks, schedule.num_steps)
    if proof > MAX_PROOF_WORDS:
        raise ScheduleError(
            f"too large to verify: (nranks * nchunks + steps) * ceil(nranks / 64) = {proof} words of "
            f"proof state, more than the limit of {MAX_PROOF_WORDS} (use fewer ranks, chunks or steps)")
    for rank, steps in enumerate(schedule.steps):
        for i, s in enumerate(steps):
            where = f"rank {rank} step {i}"
            if s.op not in OP_CODE:
                raise ScheduleError(f"{where}: unknown op {s.op!r}; expected one of {OPS}")
            if not 0 <= s.chunk < nchunks:
                raise ScheduleError(f"{where}: chunk {s.chunk} out of range [0, {nchunks})")
            if not 0 <= s.peer < schedule.nranks or s.peer == rank:
                raise ScheduleError(f"{where}: peer {s.peer} is not another rank")
            if not 0 <= s.tree < schedule.ntrees:
                raise ScheduleError(f"{where}: tree {s.tree} out of range [0, {schedule.ntrees})")
            for d in s.deps:
                if not 0 <= d < i:
                    raise ScheduleError(f"{where}: dependency {d} does not point to an earlier step")
            if len(set(s.deps)) != len(s.deps):
                raise ScheduleError(f"{where}: a dependency is listed twice in {list(s.deps)}")


def match_transfers(schedule) -> list:
    """Match SENDs with RECVs: the k-th SEND of chunk c from u to v in u's list with the k-th RECV_* of
    chunk c from u in v's list.

    A (sender, receiver, chunk) triple may occur several times (a ring sends
    a chunk over a link in reduce-scatter and again in all-gather); its SENDs
    and RECVs must be equally many, and its SENDs at the sender ordered by
    dependencies (its RECVs, writes of the chunk, are ordered by the
    determinism rule), so that list order is the order they run in.

    Returns
    -------
    list of list of int
        ``match[r][i]``: the index, in the peer's list, of the step matched with rank ``r``'s step ``i``.
    """
    sends, recvs = {}, {}
    for rank, steps in enumerate(schedule.steps):
        for i, s in enumerate(steps):
            if s.op == "SEND":
                sends.setdefault((rank, s.peer, s.chunk), []).append(i)
            else:
                recvs.setdefault((s.peer, rank, s.chunk), []).append(i)
    for key in sends.keys() - recvs.keys():
        raise ScheduleError(f"chunk {key[2]} sent {key[0]}->{key[1]} but never received")
    for key in recvs.keys() - sends.keys():
        raise ScheduleError(f"chunk {key[2]} received {key[0]}->{key[1]} but never sent")
    match = [[-1] * len(steps) for steps in schedule.steps]
    reach = {}
    for key, send_list in sends.items():
        sender, receiver, chunk = key
        recv_list = recvs[key]
        if len(send_list) != len(recv_list):
            raise ScheduleError(f"chunk {chunk} is sent {sender}->{receiver} {len(send_list)} time(s) "
                                f"(steps {send_list[:4]}) but received {len(recv_list)} time(s) "
                                f"(steps {recv_list[:4]} of rank {receiver})")
        for a, b in zip(send_list, send_list[1:]):
            if sender not in reach:
                reach[sender] = _Reach(schedule.steps[sender])
            if not reach[sender](a, b):
                raise ScheduleError(f"rank {sender}: steps {a} and {b} both send chunk {chunk} to rank {receiver} "
                                    f"but step {b} does not depend on step {a}; repeated sends of a chunk over "
                                    f"one link must be ordered")
        for a, b in zip(send_list, recv_list):
            match[sender][a] = b
            match[receiver][b] = a
    return match


class _Reach:
    """Whether step ``a`` is a transitive dependency of step ``b`` in one rank's list (a depth-first
    search over the dependencies of ``b`` that are later than ``a``; memory linear in the steps)."""

    def __init__(self, steps):
        self.steps = steps

    def __call__(self, a: int, b: int) -> bool:
        deps = self.steps[b].deps
        if a in deps:
            return True
        seen, stack = {b}, [b]
        while stack:
            for d in self.steps[stack.pop()].deps:
                if d == a:
                    return True
                if d > a and d not in seen:
                    seen.add(d)
                    stack.append(d)
        return False


def check_determinism(schedule) -> list:
    """Steps of a rank touching the same chunk are ordered by dependencies unless both are SENDs.

    Returns
    -------
    list of dict
        Per rank, ``{index of a SEND of the accumulator: index of the rank's next write of that chunk}``:
        the write must wait until the SEND's receiver has read the value (value semantics; a SEND
        before the rank's first write of the chunk sends its input, which nothing overwrites).
    """
    guards = []
    for rank, steps in enumerate(schedule.steps):
        reach = _Reach(steps)
        last_write = {}  # chunk -> index of last non-SEND step
        sends_since = {}  # chunk -> SENDs after last_write
        waits = {}
        for i, s in enumerate(steps):
            pending = sends_since.get(s.chunk, [])
            must_follow = pending if s.op != "SEND" and pending else []
            if not must_follow and s.chunk in last_write:
                must_follow = [last_write[s.chunk]]
            for j in must_follow:
                if not reach(j, i):
                    raise ScheduleError(
                        f"rank {rank}: steps {j} and {i} both touch chunk {s.chunk} but "
                        f"step {i} does not depend on step {j}; the result would depend on "
                        f"execution order")
            if s.op == "SEND":
                sends_since.setdefault(s.chunk, []).append(i)
            else:
                if s.chunk in last_write:
                    waits.update((j, i) for j in pending)
                last_write[s.chunk] = i
                sends_since[s.chunk] = []
        guards.append(waits)
    return guards


def _shard_of_chunks(schedule) -> list:
    """Per chunk, the shard (the rank) it lies in: reduce_scatter and allgather only."""
    shard = schedule.count // schedule.nranks
    return [offset // shard for offset, _ in schedule.chunks]


def symbolic_run(schedule, match: list, guards: list) -> None:
    """Order the steps as an executor may run them, execute them on sets of contributing ranks, and
    check the final state.

    A step may run once its dependencies are done, a RECV once its matching
    SEND is done, and a write of a chunk once the receivers of the rank's
    earlier SENDs of the chunk's accumulator value have read it (``guards``
    of :func:`check_determinism`). No order satisfying all of these means a
    deadlock. Otherwise the steps run in such an order (by the determinism
    rule any such order gives the same sets): each accumulator chunk is the
    set of ranks whose input it contains, or UNDEFINED (the empty set here:
    allgather's chunks outside the rank's own shard before a RECV_COPY
    writes them); a RECV gets the set its SEND had when it ran. Sending an
    UNDEFINED chunk, reducing into one, or a RECV_REDUCE of overlapping sets
    (a contribution counted twice) is an error. At the end the collective's
    final state is checked (``docs/schedule_format.md``). ``match`` is the
    matching of :func:`match_transfers`.
    """
    steps = schedule.steps
    n = schedule.nranks
    base = [0] * (n + 1)  # steps are numbered across ranks: rank r's step i is base[r] + i
    for r in range(n):
        base[r + 1] = base[r] + len(steps[r])
    succs = [[] for _ in range(base[n])]
    indeg = [0] * base[n]
    for r, rank_steps in enumerate(steps):
        b = base[r]
        for i, s in enumerate(rank_steps):
            indeg[b + i] = len(s.deps) + (s.op != "SEND")
            for d in s.deps:
                succs[b + d].append(b + i)
            if s.op == "SEND":
                succs[b + i].append(base[s.peer] + match[r][i])
        for send, write in guards[r].items():
            indeg[b + write] += 1
            peer = rank_steps[send].peer
            succs[base[peer] + match[r][send]].append(b + write)
    order = [g for g in range(base[n]) if indeg[g] == 0]
    for g in order:  # grows while it is walked
        for h in succs[g]:
            indeg[h] -= 1
            if indeg[h] == 0:
                order.append(h)
    if len(order) != base[n]:
        stuck = [f"rank {r} step {i} ({s.op} chunk {s.chunk} peer {s.peer})"
                 for r in range(n) for i, s in enumerate(steps[r]) if indeg[base[r] + i] > 0][:4]
        raise ScheduleError("schedule deadlocks: the dependencies, the SEND->RECV matching and the rule "
                            "that a sent chunk is not overwritten before its receiver read it form a "
                            "cycle; stuck steps include " + "; ".join(stuck))
    rank_of = [r for r in range(n) for _ in steps[r]]
    nchunks = len(schedule.chunks)
    coll = schedule.collective
    shard_of = _shard_of_chunks(schedule) if coll in ("reduce_scatter", "allgather") else None
    if coll == "allgather":  # 0: UNDEFINED
        acc = [[(1 << r) if shard_of[c] == r else 0 for c in range(nchunks)] for r in range(n)]
    else:
        acc = [[1 << r] * nchunks for r in range(n)]
    sent_value = {}
    for g in order:
        r = rank_of[g]
        i = g - base[r]
        s = steps[r][i]
        if s.op == "SEND":
            if not acc[r][s.chunk]:
                raise ScheduleError(f"rank {r} step {i}: sends chunk {s.chunk} to rank {s.peer}, but the chunk "
                                    f"is UNDEFINED there (nothing wrote it yet)")
            sent_value[g] = acc[r][s.chunk]
            continue
        value = sent_value[base[s.peer] + match[r][i]]
        if s.op == "RECV_REDUCE":
            if not acc[r][s.chunk]:
                raise ScheduleError(f"rank {r} step {i}: reduces chunk {s.chunk} from rank {s.peer} into an "
                                    f"UNDEFINED chunk (nothing wrote it yet; a RECV_COPY defines it)")
            overlap = acc[r][s.chunk] & value
            if overlap:
                raise ScheduleError(
                    f"rank {r} step {i}: chunk {s.chunk} from rank {s.peer} "
                    f"counts rank(s) {_ranks(overlap)} twice")
            acc[r][s.chunk] |= value
        else:
            acc[r][s.chunk] = value
    full = (1 << n) - 1
    for r in range(n):
        if coll == "reduce" and r != schedule.root:
            continue
        for c, value in enumerate(acc[r]):
            if coll == "broadcast":
                want = 1 << schedule.root
            elif coll == "allgather":
                want = 1 << shard_of[c]
            elif coll == "reduce_scatter":
                if shard_of[c] != r:
                    continue
                want = full
            else:
                want = full
            if value != want:
                got = "UNDEFINED" if not value else f"= sum over ranks {_ranks(value)}"
                raise ScheduleError(
                    f"{coll}: rank {r} ends with chunk {c} {got}, expected ranks {_ranks(want)}")


def check_routes(schedule) -> None:
    """The routes a schedule carries, if any, join the ends of each of its transfers.

    ``schedule.routes[t]`` lists node paths of tree ``t``: each starts and ends
    at two different ranks and passes only through switch nodes (ids from
    ``nranks`` up); every SEND of tree ``t`` between two ranks has a path
    joining them (in either direction).
    """
    if not schedule.routes:
        return
    n = schedule.nranks
    if len(schedule.routes) != schedule.ntrees:
        raise ScheduleError(f"routes lists {len(schedule.routes)} trees, ntrees is {schedule.ntrees}")
    ends = []
    for t, paths in enumerate(schedule.routes):
        pairs = set()
        for path in paths:
            if (len(path) < 2 or not 0 <= path[0] < n or not 0 <= path[-1] < n or path[0] == path[-1]
                    or any(x < n for x in path[1:-1])):
                raise ScheduleError(f"tree {t}: route {list(path)} does not join two ranks through switches")
            pairs.add((path[0], path[-1]))
        ends.append(pairs)
    for sender, receiver, chunk, tree in schedule.transfers():
        if (sender, receiver) not in ends[tree] and (receiver, sender) not in ends[tree]:
            raise ScheduleError(f"tree {tree} sends chunk {chunk} {sender}->{receiver}, "
                                f"but its routes join no such pair")


def _ranks(mask: int) -> list:
    return [r for r in range(mask.bit_length()) if mask >> r & 1]
