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
                        ScheduleError)

__all__ = ["validate", "check_header", "check_structure", "check_words", "proof_words", "match_transfers", "check_determinism",
           "check_routes", "symbolic_run"]


def validate(schedule) -> None:
    """Run every check on ``schedule``; see :meth:`~jax_blink.schedule.Schedule.validate`.

    Raises
    ------
    ScheduleError
        Naming the first violation found.
    """
    check_structure(schedule)
    sends = match_transfers(schedule)
    guards = check_determinism(schedule)
    check_routes(schedule)
    symbolic_run(schedule, sends, guards)


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
    if schedule.collective == "allreduce":
        if schedule.root != -1:
            raise ScheduleError(f"allreduce has no root (use -1), got {schedule.root}")
    elif not 0 <= schedule.root < schedule.nranks:
        raise ScheduleError(f"root {schedule.root} out of range for {schedule.nranks} ranks")
    if schedule.dtype not in DTYPES:
        raise ScheduleError(f"unsupported dtype {schedule.dtype!r}")
    expected = 0
    for i, (offset, length) in enumerate(schedule.chunks):
        if offset != expected or length < 1:
            raise ScheduleError(
                f"chunk {i} = (offset {offset}, length {length}) breaks the contiguous "
                f"partition of [0, {schedule.count}) (expected offset {expected}, length >= 1)")
        expected += length
    if expected != schedule.count:
        raise ScheduleError(f"chunks cover {expected} elements, count is {schedule.count}")
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


def match_transfers(schedule) -> dict:
    """Match every SEND with its RECV one-to-one.

    Returns
    -------
    dict
        ``(sender, receiver, chunk) -> (index of the SEND at the sender, index of the RECV at the receiver)``.
    """
    sends, recvs = {}, {}
    for rank, steps in enumerate(schedule.steps):
        for i, s in enumerate(steps):
            key = (rank, s.peer, s.chunk) if s.op == "SEND" else (s.peer, rank, s.chunk)
            table = sends if s.op == "SEND" else recvs
            if key in table:
                raise ScheduleError(
                    f"rank {rank} step {i}: chunk {s.chunk} moves {key[0]}->{key[1]} twice "
                    f"({'sent' if s.op == 'SEND' else 'received'} by steps {table[key]} and {i})")
            table[key] = i
    for key in sends.keys() - recvs.keys():
        raise ScheduleError(f"chunk {key[2]} sent {key[0]}->{key[1]} but never received")
    for key in recvs.keys() - sends.keys():
        raise ScheduleError(f"chunk {key[2]} received {key[0]}->{key[1]} but never sent")
    return {key: (i, recvs[key]) for key, i in sends.items()}


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


def symbolic_run(schedule, sends: dict, guards: list) -> None:
    """Order the steps as an executor may run them, execute them on sets of contributing ranks, and
    check the final state.

    A step may run once its dependencies are done, a RECV once its matching
    SEND is done, and a write of a chunk once the receivers of the rank's
    earlier SENDs of the chunk's accumulator value have read it (``guards``
    of :func:`check_determinism`). No order satisfying all of these means a
    deadlock. Otherwise the steps run in such an order (by the determinism
    rule any such order gives the same sets): each accumulator is the set of
    ranks whose input it contains, a RECV gets the set its SEND had when it
    ran, and a RECV_REDUCE of overlapping sets counts a contribution twice.
    At the end every rank (allreduce), the root (reduce), or every rank
    holding exactly ``{root}`` (broadcast) is checked for every chunk.
    ``sends`` is the matching of :func:`match_transfers`.
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
                succs[b + i].append(base[s.peer] + sends[(r, s.peer, s.chunk)][1])
        for send, write in guards[r].items():
            indeg[b + write] += 1
            peer = rank_steps[send].peer
            succs[base[peer] + sends[(r, peer, rank_steps[send].chunk)][1]].append(b + write)
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
    acc = [[1 << r] * len(schedule.chunks) for r in range(n)]
    sent_value = {}
    for g in order:
        r = rank_of[g]
        i = g - base[r]
        s = steps[r][i]
        if s.op == "SEND":
            sent_value[(r, s.peer, s.chunk)] = acc[r][s.chunk]
            continue
        value = sent_value[(s.peer, r, s.chunk)]
        if s.op == "RECV_REDUCE":
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
        if schedule.collective == "reduce" and r != schedule.root:
            continue
        want = (1 << schedule.root) if schedule.collective == "broadcast" else full
        for c, value in enumerate(acc[r]):
            if value != want:
                raise ScheduleError(
                    f"rank {r} ends with chunk {c} = sum over ranks {_ranks(value)}, "
                    f"expected ranks {_ranks(want)}")


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
