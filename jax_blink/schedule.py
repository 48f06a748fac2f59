"""Schedules: the contract between the planner and the executors.

A :class:`Schedule` lists, for every rank, the ordered steps (send, receive-and-
reduce, receive-and-copy of one chunk) that together perform one collective.
This module defines the data structure, lowers weighted trees into it
(:func:`lower_trees`), proves schedules correct by symbolic execution
(:meth:`Schedule.validate`), and converts them to and from JSON and the flat
``int64`` array the C++ executors decode. ``docs/schedule_format.md`` is the
specification; this module and ``cc/schedule.cc`` both implement it.

Pure Python: never imports jax.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
from collections import defaultdict
from typing import Iterable, Sequence

import numpy as np

from ._jsonio import read_document

__all__ = [
    "Step",
    "Schedule",
    "ScheduleError",
    "lower_trees",
    "dtype_name",
    "DTYPES",
    "FORMAT_VERSION",
]

FORMAT_VERSION = 1
MAGIC = 0x4B4E494C42  # "BLINK" in ASCII, little-endian
HEADER_WORDS = 9

OPS = ("SEND", "RECV_REDUCE", "RECV_COPY")
_OP_CODE = {name: code for code, name in enumerate(OPS)}
COLLECTIVES = ("allreduce", "broadcast", "reduce")
_COLLECTIVE_CODE = {name: code for code, name in enumerate(COLLECTIVES)}

#: dtype name -> (code in the flat encoding, itemsize in bytes)
DTYPES = {
    "float32": (0, 4),
    "float64": (1, 8),
    "float16": (2, 2),
    "bfloat16": (3, 2),
    "int32": (4, 4),
    "int64": (5, 8),
    "uint32": (6, 4),
}
_DTYPE_BY_CODE = {code: name for name, (code, _) in DTYPES.items()}


class ScheduleError(ValueError):
    """A schedule is malformed or does not compute its collective."""


def dtype_name(dtype) -> str:
    """Canonical name of ``dtype`` (a numpy/jax dtype, type or string).

    Raises
    ------
    ScheduleError
        If the dtype is not one a schedule can carry.
    """
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = str(getattr(dtype, "name", dtype))
    if name not in DTYPES:
        raise ScheduleError(
            f"unsupported dtype {name!r}: schedules carry one of {sorted(DTYPES)}"
        )
    return name


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of one rank.

    Attributes
    ----------
    op : str
        ``"SEND"``, ``"RECV_REDUCE"`` or ``"RECV_COPY"``.
    chunk : int
        Index into :attr:`Schedule.chunks`.
    peer : int
        The rank sent to (``SEND``) or received from (``RECV_*``).
    tree : int
        The tree of the plan this step belongs to (informational).
    deps : tuple of int
        Indices of earlier steps of the same rank that must finish first.
    """

    op: str
    chunk: int
    peer: int
    tree: int = 0
    deps: tuple = ()

    def to_dict(self) -> dict:
        return {"op": self.op, "chunk": self.chunk, "peer": self.peer,
                "tree": self.tree, "deps": list(self.deps)}


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Per-rank ordered steps performing one collective on ``count`` elements.

    Attributes
    ----------
    nranks : int
    count : int
        Number of elements of the vector being reduced/broadcast.
    collective : str
        ``"allreduce"``, ``"broadcast"`` or ``"reduce"``.
    root : int
        Root rank for broadcast/reduce, ``-1`` for allreduce.
    dtype : str
        Canonical dtype name (see :data:`DTYPES`).
    ntrees : int
    chunks : tuple of (offset, length)
        Contiguous partition of ``[0, count)`` in ascending order.
    steps : tuple of tuple of Step
        ``steps[r]`` is rank ``r``'s ordered step list.
    """

    nranks: int
    count: int
    collective: str
    root: int
    dtype: str
    ntrees: int
    chunks: tuple
    steps: tuple

    # ------------------------------------------------------------------ info
    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype][1]

    @property
    def size_bytes(self) -> int:
        return self.count * self.itemsize

    @property
    def num_steps(self) -> int:
        return sum(len(s) for s in self.steps)

    def transfers(self):
        """Yield ``(sender, receiver, chunk, tree)`` for every SEND."""
        for rank, steps in enumerate(self.steps):
            for step in steps:
                if step.op == "SEND":
                    yield rank, step.peer, step.chunk, step.tree

    # ------------------------------------------------------------ validation
    def validate(self) -> "Schedule":
        """Prove the schedule computes its collective; return ``self``.

        Checks the structure (chunk partition, indices in range, dependencies
        pointing backwards, one-to-one SEND/RECV matching), the determinism
        rule of ``docs/schedule_format.md`` (steps of a rank touching the same
        chunk are ordered by dependencies unless both are SENDs), then
        executes the schedule symbolically, each rank running its steps in
        list order and waiting, as the executors do, until receivers have read
        a chunk before overwriting it. Each accumulator is the set of ranks
        whose input it contains; a ``RECV_REDUCE`` of overlapping sets means a
        contribution counted twice. At the end every rank (allreduce), the
        root (reduce), or every rank holding exactly ``{root}`` (broadcast) is
        checked for every chunk.

        Raises
        ------
        ScheduleError
            Naming the first violation found.
        """
        self._check_structure()
        sends, recvs = self._match()
        self._check_determinism()
        self._symbolic_run(sends, recvs)
        return self

    def _check_structure(self):
        if self.nranks < 1:
            raise ScheduleError(f"nranks must be >= 1, got {self.nranks}")
        if self.count < 1:
            raise ScheduleError(f"count must be >= 1, got {self.count}")
        if self.collective not in _COLLECTIVE_CODE:
            raise ScheduleError(f"unknown collective {self.collective!r}; expected one of {COLLECTIVES}")
        if self.collective == "allreduce":
            if self.root != -1:
                raise ScheduleError(f"allreduce has no root (use -1), got {self.root}")
        elif not 0 <= self.root < self.nranks:
            raise ScheduleError(f"root {self.root} out of range for {self.nranks} ranks")
        if self.dtype not in DTYPES:
            raise ScheduleError(f"unsupported dtype {self.dtype!r}")
        if self.ntrees < 1:
            raise ScheduleError(f"ntrees must be >= 1, got {self.ntrees}")
        if not self.chunks:
            raise ScheduleError("a schedule needs at least one chunk")
        expected = 0
        for i, (offset, length) in enumerate(self.chunks):
            if offset != expected or length < 1:
                raise ScheduleError(
                    f"chunk {i} = (offset {offset}, length {length}) breaks the contiguous "
                    f"partition of [0, {self.count}) (expected offset {expected}, length >= 1)")
            expected += length
        if expected != self.count:
            raise ScheduleError(f"chunks cover {expected} elements, count is {self.count}")
        if len(self.steps) != self.nranks:
            raise ScheduleError(f"steps has {len(self.steps)} rank lists, nranks is {self.nranks}")
        nchunks = len(self.chunks)
        for rank, steps in enumerate(self.steps):
            for i, s in enumerate(steps):
                where = f"rank {rank} step {i}"
                if s.op not in _OP_CODE:
                    raise ScheduleError(f"{where}: unknown op {s.op!r}; expected one of {OPS}")
                if not 0 <= s.chunk < nchunks:
                    raise ScheduleError(f"{where}: chunk {s.chunk} out of range [0, {nchunks})")
                if not 0 <= s.peer < self.nranks or s.peer == rank:
                    raise ScheduleError(f"{where}: peer {s.peer} is not another rank")
                if not 0 <= s.tree < self.ntrees:
                    raise ScheduleError(f"{where}: tree {s.tree} out of range [0, {self.ntrees})")
                for d in s.deps:
                    if not 0 <= d < i:
                        raise ScheduleError(f"{where}: dependency {d} does not point to an earlier step")

    def _match(self):
        """Map (sender, receiver, chunk) to the step index at each end."""
        sends, recvs = {}, {}
        for rank, steps in enumerate(self.steps):
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

    def _check_determinism(self):
        for rank, steps in enumerate(self.steps):
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

    def _symbolic_run(self, sends, recvs):
        n = self.nranks
        acc = [[1 << r] * len(self.chunks) for r in range(n)]
        sent_value = {}
        received = set()
        pending_reads = defaultdict(set)  # (rank, chunk) -> receivers still to read
        pos = [0] * n
        total = self.num_steps
        done = 0
        progress = True
        while done < total and progress:
            progress = False
            for r in range(n):
                steps = self.steps[r]
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
                if pos[r] < len(self.steps[r]):
                    s = self.steps[r][pos[r]]
                    stuck.append(f"rank {r} at step {pos[r]} ({s.op} chunk {s.chunk} peer {s.peer})")
            raise ScheduleError("schedule deadlocks: " + "; ".join(stuck))
        full = (1 << n) - 1
        for r in range(n):
            if self.collective == "reduce" and r != self.root:
                continue
            want = (1 << self.root) if self.collective == "broadcast" else full
            for c, value in enumerate(acc[r]):
                if value != want:
                    raise ScheduleError(
                        f"rank {r} ends with chunk {c} = sum over ranks {_ranks(value)}, "
                        f"expected ranks {_ranks(want)}")

    # -------------------------------------------------------------- encoding
    def encode(self) -> np.ndarray:
        """The flat ``int64`` array the custom call receives (see the doc)."""
        words = [MAGIC, FORMAT_VERSION, self.nranks, self.count,
                 _COLLECTIVE_CODE[self.collective], self.root, DTYPES[self.dtype][0],
                 len(self.chunks), self.ntrees]
        for offset, length in self.chunks:
            words += (offset, length)
        words += [len(s) for s in self.steps]
        for steps in self.steps:
            for s in steps:
                words += (_OP_CODE[s.op], s.chunk, s.peer, s.tree, len(s.deps))
                words += s.deps
        return np.asarray(words, dtype=np.int64)

    @classmethod
    def decode(cls, array) -> "Schedule":
        """Read back an array produced by :meth:`encode` (structure only;
        call :meth:`validate` for the proof of correctness)."""
        a = np.asarray(array)
        if a.ndim != 1 or a.dtype != np.int64:
            raise ScheduleError(f"expected a 1-D int64 array, got {a.dtype} with shape {a.shape}")
        w = a.tolist()
        if len(w) < HEADER_WORDS:
            raise ScheduleError(f"array of {len(w)} words is shorter than the {HEADER_WORDS}-word header")
        magic, version, nranks, count, coll, root, dtype_code, nchunks, ntrees = w[:HEADER_WORDS]
        if magic != MAGIC:
            raise ScheduleError(f"bad magic {magic:#x}: not a jax_blink schedule")
        if version != FORMAT_VERSION:
            raise ScheduleError(f"schedule format version {version}; this jax_blink reads {FORMAT_VERSION}")
        if not 0 <= coll < len(COLLECTIVES):
            raise ScheduleError(f"unknown collective code {coll}")
        if dtype_code not in _DTYPE_BY_CODE:
            raise ScheduleError(f"unknown dtype code {dtype_code}")
        if nranks < 1 or nchunks < 1:
            raise ScheduleError(f"nranks {nranks} and nchunks {nchunks} must be >= 1")
        pos = HEADER_WORDS

        def take(k):
            nonlocal pos
            if pos + k > len(w):
                raise ScheduleError(f"array ends at word {len(w)}, needed {pos + k}")
            out = w[pos:pos + k]
            pos += k
            return out

        flat = take(2 * nchunks)
        chunks = tuple(zip(flat[0::2], flat[1::2]))
        counts = take(nranks)
        steps = []
        for nsteps in counts:
            if nsteps < 0:
                raise ScheduleError(f"negative step count {nsteps}")
            rank_steps = []
            for _ in range(nsteps):
                op, chunk, peer, tree, ndeps = take(5)
                if not 0 <= op < len(OPS) or ndeps < 0:
                    raise ScheduleError(f"bad step at word {pos - 5}: op {op}, ndeps {ndeps}")
                rank_steps.append(Step(OPS[op], chunk, peer, tree, tuple(take(ndeps))))
            steps.append(tuple(rank_steps))
        if pos != len(w):
            raise ScheduleError(f"{len(w) - pos} trailing words after the last step")
        return cls(nranks, count, COLLECTIVES[coll], root, _DTYPE_BY_CODE[dtype_code],
                   ntrees, chunks, tuple(steps))

    def to_dict(self) -> dict:
        return {
            "format": "jax_blink.schedule", "version": FORMAT_VERSION,
            "nranks": self.nranks, "count": self.count, "collective": self.collective,
            "root": self.root, "dtype": self.dtype, "ntrees": self.ntrees,
            "chunks": [list(c) for c in self.chunks],
            "steps": [[s.to_dict() for s in steps] for steps in self.steps],
        }

    def to_json(self, indent=None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text) -> "Schedule":
        """Load a schedule from JSON text, a dict, or a path to a JSON file."""
        d = read_document(text, fmt="jax_blink.schedule", version=FORMAT_VERSION,
                          error=ScheduleError, what="schedule")
        try:
            steps = tuple(
                tuple(Step(s["op"], int(s["chunk"]), int(s["peer"]), int(s.get("tree", 0)),
                           tuple(int(x) for x in s.get("deps", ()))) for s in rank_steps)
                for rank_steps in d["steps"])
            return cls(int(d["nranks"]), int(d["count"]), d["collective"], int(d["root"]),
                       dtype_name(d["dtype"]), int(d["ntrees"]),
                       tuple((int(o), int(n)) for o, n in d["chunks"]), steps)
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, ScheduleError):
                raise
            raise ScheduleError(f"malformed schedule JSON: {type(e).__name__}: {e}") from None


def _ranks(mask: int) -> list:
    return [r for r in range(mask.bit_length()) if mask >> r & 1]


# ---------------------------------------------------------------- lowering
def split_proportional(total: int, weights: Sequence[float]) -> list:
    """Split ``total`` units into integers proportional to ``weights``
    (largest-remainder rounding; sums exactly to ``total``)."""
    wsum = float(sum(weights))
    if wsum <= 0:
        raise ScheduleError("tree weights must sum to a positive value")
    exact = [total * w / wsum for w in weights]
    parts = [int(e) for e in exact]
    order = sorted(range(len(weights)), key=lambda i: (parts[i] - exact[i], i))
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


def _children(edges, nranks, root):
    """Children lists of a rooted tree given (parent, child) edges; checks it spans."""
    children = defaultdict(list)
    parent = {}
    for p, c in edges:
        if c in parent or c == root:
            raise ScheduleError(f"tree rooted at {root}: rank {c} has two parents")
        parent[c] = p
        children[p].append(c)
    seen, stack = {root}, [root]
    while stack:
        for c in children[stack.pop()]:
            seen.add(c)
            stack.append(c)
    if len(seen) != nranks or len(parent) != nranks - 1:
        missing = sorted(set(range(nranks)) - seen)
        raise ScheduleError(f"tree rooted at {root} does not span the ranks: unreachable {missing}")
    return {p: sorted(cs) for p, cs in children.items()}, parent


def lower_trees(trees: Iterable, *, nranks: int, collective: str, root: int = -1,
                count: int, dtype, chunks=1, align_bytes: int = 64) -> Schedule:
    """Lower weighted spanning trees into a pipelined :class:`Schedule`.

    ``[0, count)`` is split among the trees in proportion to their weights
    (bandwidth shares), each tree's segment into ``chunks`` pieces. For each
    piece an allreduce reduces up the tree (children's partial sums into their
    parent, children in ascending rank order) and broadcasts the root's result
    down it; a reduce does only the first phase, a broadcast only the second.
    Each rank's steps are ordered by their earliest possible time in the
    dependency graph, so that in-order execution pipelines the pieces of all
    trees.

    Parameters
    ----------
    trees : iterable
        Objects with ``root`` (int), ``edges`` (``(parent, child)`` pairs in
        broadcast direction) and ``weight`` (float > 0).
    nranks, collective, root, count, dtype
        As in :class:`Schedule`; ``root`` is ignored for allreduce (each tree
        has its own) and must equal every tree's root otherwise.
    chunks : int or sequence of int
        Pipeline chunks per tree (clamped to what the segment can hold).
    align_bytes : int
        Chunk boundaries fall on multiples of this many bytes where possible.

    Examples
    --------
    >>> from types import SimpleNamespace as T
    >>> star = T(root=0, edges=[(0, 1), (0, 2)], weight=1.0)
    >>> s = lower_trees([star], nranks=3, collective="allreduce", count=100,
    ...                 dtype="float32", chunks=2).validate()
    >>> len(s.chunks), s.num_steps
    (2, 16)
    """
    trees = list(trees)
    dtype = dtype_name(dtype)
    if collective not in _COLLECTIVE_CODE:
        raise ScheduleError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")
    if count < 1:
        raise ScheduleError(f"count must be >= 1, got {count}")
    if not trees:
        raise ScheduleError("lower_trees needs at least one tree")
    if collective == "allreduce":
        root = -1
    elif any(t.root != root for t in trees):
        raise ScheduleError(f"every {collective} tree must be rooted at {root}")
    per_tree_chunks = [chunks] * len(trees) if isinstance(chunks, (int, np.integer)) else list(chunks)
    if len(per_tree_chunks) != len(trees) or min(per_tree_chunks) < 1:
        raise ScheduleError(f"chunks must be a positive int or one positive int per tree, got {chunks!r}")

    align = max(1, align_bytes // DTYPES[dtype][1])
    units = -(-count // align)  # aligned blocks; the last may be short
    shares = split_proportional(units, [t.weight for t in trees])

    chunk_table = []
    work = []  # (tree index in schedule, tree, chunk ids)
    start_unit = 0
    for tree, share, k in zip(trees, shares, per_tree_chunks):
        if share == 0:
            continue
        ids = []
        for piece in split_proportional(share, [1.0] * min(k, share)):
            lo = start_unit * align
            start_unit += piece
            hi = min(start_unit * align, count)
            ids.append(len(chunk_table))
            chunk_table.append((lo, hi - lo))
        work.append((len(work), tree, ids))

    # Each rank's steps in semantic order per (rank, chunk), before sorting.
    raw = [[] for _ in range(nranks)]  # (op, chunk, peer, tree)
    for tindex, tree, ids in work:
        children, parent = _children(tree.edges, nranks, tree.root)
        order = _postorder(tree.root, children)
        for c in ids:
            if collective != "broadcast":
                for v in order:  # children before parents
                    for ch in children.get(v, ()):
                        raw[v].append(("RECV_REDUCE", c, ch, tindex))
                    if v != tree.root:
                        raw[v].append(("SEND", c, parent[v], tindex))
            if collective != "reduce":
                for v in reversed(order):  # parents before children
                    if v != tree.root:
                        raw[v].append(("RECV_COPY", c, parent[v], tindex))
                    for ch in children.get(v, ()):
                        raw[v].append(("SEND", c, ch, tindex))
    steps = _order_steps(raw)
    return Schedule(nranks, count, collective, root, dtype, len(work),
                    tuple(chunk_table), steps)


def _postorder(root, children):
    out, stack = [], [(root, False)]
    while stack:
        v, expanded = stack.pop()
        if expanded:
            out.append(v)
        else:
            stack.append((v, True))
            stack.extend((c, False) for c in reversed(children.get(v, ())))
    return out


def _order_steps(raw):
    """Add chain dependencies and sort each rank's steps by earliest start.

    Within a (rank, chunk), each step depends on the previous non-SEND step
    and a non-SEND step also on the SENDs since then (the determinism rule).
    Steps are then levelled by longest path in the graph of those
    dependencies, SEND->RECV matches, and the executors' "receiver has read
    it before the sender overwrites it" waits (a chain of RECV_REDUCEs of one
    chunk counts as one level), and each rank's list is sorted by (level,
    semantic position): in-order execution is deadlock-free and pipelined.
    """
    local_deps = []
    for steps in raw:
        deps = []
        last_write, sends_since = {}, defaultdict(list)
        for i, (op, chunk, _, _) in enumerate(steps):
            d = [last_write[chunk]] if chunk in last_write else []
            if op != "SEND":
                d += sends_since[chunk]
                last_write[chunk] = i
                sends_since[chunk] = []
            else:
                sends_since[chunk].append(i)
            deps.append(d)
        local_deps.append(deps)

    # Global graph over (rank, index) nodes.
    node = {}
    for r, steps in enumerate(raw):
        for i in range(len(steps)):
            node[(r, i)] = len(node)
    preds = [[] for _ in node]  # (predecessor, level increment)
    send_at = {}
    for r, steps in enumerate(raw):
        for i, (op, chunk, peer, _) in enumerate(steps):
            deps = local_deps[r][i]
            # consecutive RECV_REDUCEs of a chunk share a level, so they stay
            # adjacent and an executor can fuse them into one pass
            chained = op == "RECV_REDUCE" and len(deps) == 1 and steps[deps[0]][0] == op
            preds[node[(r, i)]].extend((node[(r, d)], 0 if chained else 1) for d in deps)
            if op == "SEND":
                send_at[(r, peer, chunk)] = i
    for r, steps in enumerate(raw):
        for i, (op, chunk, peer, _) in enumerate(steps):
            if op != "SEND":
                j = send_at[(peer, r, chunk)]
                preds[node[(r, i)]].append((node[(peer, j)], 1))
                # the sender's next write of this chunk waits for this read
                for k in range(j + 1, len(raw[peer])):
                    if raw[peer][k][1] == chunk and raw[peer][k][0] != "SEND":
                        preds[node[(peer, k)]].append((node[(r, i)], 1))
                        break
    succs = [[] for _ in node]
    indeg = [len(p) for p in preds]
    for v, ps in enumerate(preds):
        for p, inc in ps:
            succs[p].append((v, inc))
    level = [0] * len(node)
    ready = [v for v in range(len(node)) if indeg[v] == 0]
    heapq.heapify(ready)
    seen = 0
    while ready:
        v = heapq.heappop(ready)
        seen += 1
        for s, inc in succs[v]:
            level[s] = max(level[s], level[v] + inc)
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, s)
    if seen != len(node):
        raise ScheduleError("internal error: lowered steps form a dependency cycle")

    out = []
    for r, steps in enumerate(raw):
        order = sorted(range(len(steps)), key=lambda i: (level[node[(r, i)]], i))
        new_index = {old: new for new, old in enumerate(order)}
        out.append(tuple(
            Step(steps[i][0], steps[i][1], steps[i][2], steps[i][3],
                 tuple(sorted(new_index[d] for d in local_deps[r][i])))
            for i in order))
    return tuple(out)
