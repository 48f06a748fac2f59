"""Validation of a schedule: the phases of :meth:`Schedule.validate`, one function each.

:func:`validate` checks the structure (chunk partition, indices in range,
dependencies pointing backwards), the one-to-one SEND/RECV matching, the
determinism rule of ``docs/schedule_format.md``, the routes a schedule may
carry, and finally proves by symbolic execution that the schedule computes
its collective. ``cc/`` re-validates the flat encoding the same way.

Pure Python: never imports jax.
"""

from __future__ import annotations

from collections import defaultdict

from .constants import COLLECTIVE_CODE, COLLECTIVES, DTYPES, OP_CODE, OPS, ScheduleError

__all__ = ["validate", "check_structure", "match_transfers", "check_determinism", "check_routes",
           "symbolic_run"]


def validate(schedule) -> None:
    """Run every check on ``schedule``; see :meth:`~jax_blink.schedule.Schedule.validate`.

    Raises
    ------
    ScheduleError
        Naming the first violation found.
    """
    check_structure(schedule)
    match_transfers(schedule)
    check_determinism(schedule)
    check_routes(schedule)
    symbolic_run(schedule)


def check_structure(schedule) -> None:
    """Header fields, the chunk partition, and every step's fields in range; deps point backwards."""
    if schedule.nranks < 1:
        raise ScheduleError(f"nranks must be >= 1, got {schedule.nranks}")
    if schedule.count < 1:
        raise ScheduleError(f"count must be >= 1, got {schedule.count}")
    if schedule.collective not in COLLECTIVE_CODE:
        raise ScheduleError(f"unknown collective {schedule.collective!r}; expected one of {COLLECTIVES}")
    if schedule.collective == "allreduce":
        if schedule.root != -1:
            raise ScheduleError(f"allreduce has no root (use -1), got {schedule.root}")
    elif not 0 <= schedule.root < schedule.nranks:
        raise ScheduleError(f"root {schedule.root} out of range for {schedule.nranks} ranks")
    if schedule.dtype not in DTYPES:
        raise ScheduleError(f"unsupported dtype {schedule.dtype!r}")
    if schedule.ntrees < 1:
        raise ScheduleError(f"ntrees must be >= 1, got {schedule.ntrees}")
    if not schedule.chunks:
        raise ScheduleError("a schedule needs at least one chunk")
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
    nchunks = len(schedule.chunks)
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

def match_transfers(schedule) -> tuple:
    """Match every SEND with its RECV one-to-one.

    Returns
    -------
    (dict, dict)
        ``(sender, receiver, chunk) -> step index`` at the sending and at the receiving end.
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
    return sends, recvs

def check_determinism(schedule) -> None:
    """Steps of a rank touching the same chunk are ordered by dependencies unless both are SENDs."""
    for rank, steps in enumerate(schedule.steps):
        ancestors = [0] * len(steps)  # bitset of transitive dependencies
        last_write = {}  # chunk -> index of last non-SEND step
        sends_since = defaultdict(list)  # chunk -> SENDs after last_write
        for i, s in enumerate(steps):
            anc = 0
            for d in s.deps:
                anc |= ancestors[d] | (1 << d)
            ancestors[i] = anc
            must_follow = []
            if s.chunk in last_write:
                must_follow.append(last_write[s.chunk])
            if s.op != "SEND":
                must_follow.extend(sends_since[s.chunk])
            for j in must_follow:
                if not anc >> j & 1:
                    raise ScheduleError(
                        f"rank {rank}: steps {j} and {i} both touch chunk {s.chunk} but "
                        f"step {i} does not depend on step {j}; the result would depend on "
                        f"execution order")
            if s.op == "SEND":
                sends_since[s.chunk].append(i)
            else:
                last_write[s.chunk] = i
                sends_since[s.chunk] = []

def symbolic_run(schedule) -> None:
    """Execute the steps on sets of contributing ranks and check the final state.

    Each rank runs its steps in list order, waiting, as the executors do,
    until receivers have read a chunk before overwriting it. A RECV_REDUCE of
    overlapping sets counts a contribution twice; at the end every rank
    (allreduce), the root (reduce), or every rank holding exactly ``{root}``
    (broadcast) is checked for every chunk.
    """
    n = schedule.nranks
    acc = [[1 << r] * len(schedule.chunks) for r in range(n)]
    sent_value = {}
    received = set()
    pending_reads = defaultdict(set)  # (rank, chunk) -> receivers still to read
    pos = [0] * n
    total = schedule.num_steps
    done = 0
    progress = True
    while done < total and progress:
        progress = False
        for r in range(n):
            steps = schedule.steps[r]
            while pos[r] < len(steps):
                s = steps[pos[r]]
                if s.op == "SEND":
                    sent_value[(r, s.peer, s.chunk)] = acc[r][s.chunk]
                    pending_reads[(r, s.chunk)].add(s.peer)
                else:
                    key = (s.peer, r, s.chunk)
                    if key not in sent_value or pending_reads[(r, s.chunk)]:
                        break
                    value = sent_value[key]
                    if s.op == "RECV_REDUCE":
                        overlap = acc[r][s.chunk] & value
                        if overlap:
                            raise ScheduleError(
                                f"rank {r} step {pos[r]}: chunk {s.chunk} from rank {s.peer} "
                                f"counts rank(s) {_ranks(overlap)} twice")
                        acc[r][s.chunk] |= value
                    else:
                        acc[r][s.chunk] = value
                    pending_reads[(s.peer, s.chunk)].discard(r)
                    received.add(key)
                pos[r] += 1
                done += 1
                progress = True
    if done < total:
        stuck = []
        for r in range(n):
            if pos[r] < len(schedule.steps[r]):
                s = schedule.steps[r][pos[r]]
                stuck.append(f"rank {r} at step {pos[r]} ({s.op} chunk {s.chunk} peer {s.peer})")
        raise ScheduleError("schedule deadlocks: " + "; ".join(stuck))
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
