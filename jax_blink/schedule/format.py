"""The schedule format: :class:`Schedule` and :class:`Step`, their JSON and flat ``int64`` encoding.

A :class:`Schedule` lists, for every rank, the ordered steps (send, receive-and-
reduce, receive-and-copy of one chunk) that together perform one collective;
it is the contract between the planner and the executors.
``docs/schedule_format.md`` is the specification; this module and
``cc/core/schedule.cc`` both implement it. Validation lives in
:mod:`jax_blink.schedule.validate`, lowering trees into schedules in
:mod:`jax_blink.schedule.lower`.

Pure Python: never imports jax.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from .._jsonio import read_document
from . import validate as _validate
from .constants import (COLLECTIVE_CODE, COLLECTIVES, DTYPE_BY_CODE, DTYPES, FORMAT_VERSION, HEADER_WORDS,
                        HEADER_WORDS_V1, MAGIC, OP_CODE, OPS, READ_VERSIONS, REDUCE_OP_CODE, REDUCE_OPS, ScheduleError,
                        dtype_name, io_counts)

__all__ = ["Step", "Schedule"]


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
        """The step as a JSON object."""
        return {"op": self.op, "chunk": self.chunk, "peer": self.peer,
                "tree": self.tree, "deps": list(self.deps)}


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Per-rank ordered steps performing one collective on ``count`` elements.

    Attributes
    ----------
    nranks : int
    count : int
        Number of elements of the accumulator: the full vector (for
        reduce_scatter the input, for allgather the output; see
        :attr:`in_count` and :attr:`out_count`).
    collective : str
        ``"allreduce"``, ``"broadcast"``, ``"reduce"``, ``"reduce_scatter"``
        or ``"allgather"``.
    root : int
        Root rank for broadcast/reduce, ``-1`` for the others.
    dtype : str
        Canonical dtype name (see :data:`DTYPES`).
    ntrees : int
    chunks : tuple of (offset, length)
        Contiguous partition of ``[0, count)`` in ascending order.
    steps : tuple of tuple of Step
        ``steps[r]`` is rank ``r``'s ordered step list.
    routes : tuple of tuple of tuple of int
        Optional: per tree, the node path of each of its edges (ranks at the
        ends, switch nodes in between), as the planner routed them; the
        simulator sends each transfer along the route of its tree and pair.
        Empty when the schedule carries none (data then takes the default
        route of :meth:`jax_blink.topo.LinkGraph.route`). Not part of the flat
        encoding: the executors do not need it.
    op : str
        The elementwise operation of ``RECV_REDUCE``: ``"sum"`` (default),
        ``"max"`` or ``"min"``.
    """

    nranks: int
    count: int
    collective: str
    root: int
    dtype: str
    ntrees: int
    chunks: tuple
    steps: tuple
    routes: tuple = ()
    op: str = "sum"

    # ------------------------------------------------------------------ info
    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype][1]

    @property
    def size_bytes(self) -> int:
        return self.count * self.itemsize

    @property
    def in_count(self) -> int:
        """Elements of each rank's input: ``count / nranks`` for allgather, else ``count``."""
        return io_counts(self.collective, self.count, self.nranks)[0]

    @property
    def out_count(self) -> int:
        """Elements of each rank's output: ``count / nranks`` for reduce_scatter, else ``count``."""
        return io_counts(self.collective, self.count, self.nranks)[1]

    def shard(self, rank: int) -> tuple:
        """``(lo, hi)``: the elements ``[lo, hi)`` of shard ``rank``, ``[rank * count / nranks, (rank + 1) * count / nranks)``
        (reduce_scatter keeps it, allgather starts from it; integer division for the other collectives)."""
        return rank * self.count // self.nranks, (rank + 1) * self.count // self.nranks

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

        Checks the limits of ``docs/schedule_format.md`` and the structure
        (chunk partition, indices in range, dependencies distinct and
        pointing backwards, one-to-one SEND/RECV matching), the determinism
        rule (steps of a rank touching the same chunk are ordered by
        dependencies unless both are SENDs), the routes if any, then that the
        steps can all run as the executors run them (a step once its
        dependencies are done, a RECV once its SEND is done, a write of a
        chunk once the receivers of the accumulator value sent before it have
        read it) and executes them symbolically in such an order. Each
        accumulator chunk is UNDEFINED (allgather: the chunks outside the
        rank's own shard, until a RECV_COPY defines them) or the set of ranks
        whose input it contains; sending an UNDEFINED chunk or reducing into
        one is an error, and a ``RECV_REDUCE`` of overlapping sets means a
        contribution counted twice. A (sender, receiver, chunk) triple may
        repeat: the k-th SEND matches the k-th RECV, and the SENDs of one
        triple must be ordered by dependencies. At the end the final state of
        the collective is checked (``docs/schedule_format.md``). The phases are the functions of
        :mod:`jax_blink.schedule.validate`; the C++ decoder accepts exactly
        the same schedules.

        Raises
        ------
        ScheduleError
            Naming the first violation found.
        """
        _validate.validate(self)
        return self

    # -------------------------------------------------------------- encoding
    def encode(self) -> np.ndarray:
        """The flat ``int64`` array the custom call receives (see the doc), in format version 2."""
        try:
            in_count, out_count = io_counts(self.collective, self.count, self.nranks)
        except (ScheduleError, ZeroDivisionError):  # an invalid schedule still encodes (validators refuse it)
            in_count = out_count = self.count
        words = [MAGIC, FORMAT_VERSION, self.nranks, self.count,
                 COLLECTIVE_CODE[self.collective], self.root, DTYPES[self.dtype][0],
                 REDUCE_OP_CODE[self.op], in_count, out_count, len(self.chunks), self.ntrees]
        for offset, length in self.chunks:
            words += (offset, length)
        words += [len(s) for s in self.steps]
        for steps in self.steps:
            for s in steps:
                words += (OP_CODE[s.op], s.chunk, s.peer, s.tree, len(s.deps))
                words += s.deps
        return np.asarray(words, dtype=np.int64)

    @classmethod
    def decode(cls, array) -> "Schedule":
        """Read back an array produced by :meth:`encode` (structure only;
        call :meth:`validate` for the proof of correctness). The result
        carries no routes: the encoding has none.

        ``array`` is a 1-D int64 array (as for the C++ decoder: no other
        type can hold the magic word); one longer than the words limit of
        ``docs/schedule_format.md`` is refused before it is read. Format
        versions 1 and 2 are read: a version 1 array is a ``"sum"`` schedule
        whose buffers all have ``count`` elements."""
        a = np.asarray(array)
        if a.ndim != 1 or a.dtype != np.int64:
            raise ScheduleError(f"expected a 1-D int64 array, got {a.dtype} with shape {a.shape}")
        _validate.check_words(len(a))
        if len(a) < 2:
            raise ScheduleError(f"array of {len(a)} words is shorter than the header")
        magic, version = a[:2].tolist()
        if magic != MAGIC:
            raise ScheduleError(f"bad magic {magic:#x}: not a jax_blink schedule")
        if version not in READ_VERSIONS:
            raise ScheduleError(f"schedule format version {version}; this jax_blink reads versions "
                                f"{' and '.join(map(str, READ_VERSIONS))}")
        header_words = HEADER_WORDS if version == 2 else HEADER_WORDS_V1
        if len(a) < header_words:
            raise ScheduleError(f"array of {len(a)} words is shorter than the {header_words}-word header "
                                f"of format version {version}")
        if version == 2:
            (nranks, count, coll, root, dtype_code, op_code, in_count, out_count, nchunks,
             ntrees) = a[2:HEADER_WORDS].tolist()
        else:
            nranks, count, coll, root, dtype_code, nchunks, ntrees = a[2:HEADER_WORDS_V1].tolist()
            op_code, in_count, out_count = 0, count, count
        if not 0 <= coll < len(COLLECTIVES):
            raise ScheduleError(f"unknown collective code {coll}")
        if dtype_code not in DTYPE_BY_CODE:
            raise ScheduleError(f"unknown dtype code {dtype_code}")
        if not 0 <= op_code < len(REDUCE_OPS):
            raise ScheduleError(f"unknown reduce-op code {op_code}")
        _validate.check_header(nranks, count, nchunks, ntrees)
        _validate.check_io_counts(COLLECTIVES[coll], count, nranks, in_count, out_count)
        w = a.tolist()  # after the header's checks: a large array that is no schedule is not read
        pos = header_words

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
        return cls(nranks, count, COLLECTIVES[coll], root, DTYPE_BY_CODE[dtype_code],
                   ntrees, chunks, tuple(steps), (), REDUCE_OPS[op_code])

    def to_dict(self) -> dict:
        """The JSON object of :meth:`to_json` (``"routes"`` only when the schedule carries them)."""
        data = {
            "format": "jax_blink.schedule", "version": FORMAT_VERSION,
            "nranks": self.nranks, "count": self.count, "collective": self.collective,
            "root": self.root, "dtype": self.dtype, "op": self.op, "ntrees": self.ntrees,
            "chunks": [list(c) for c in self.chunks],
            "steps": [[s.to_dict() for s in steps] for steps in self.steps],
        }
        if self.routes:
            data["routes"] = [[list(path) for path in paths] for paths in self.routes]
        return data

    def to_json(self, indent=None) -> str:
        """JSON text that :meth:`from_json` reads back."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text) -> "Schedule":
        """Load a schedule from JSON text, a dict, or a path to a JSON file (format version 1 or 2;
        ``"op"`` is ``"sum"`` when absent)."""
        d = read_document(text, fmt="jax_blink.schedule", version=READ_VERSIONS,
                          error=ScheduleError, what="schedule")
        try:
            steps = tuple(
                tuple(Step(s["op"], int(s["chunk"]), int(s["peer"]), int(s.get("tree", 0)),
                           tuple(int(x) for x in s.get("deps", ()))) for s in rank_steps)
                for rank_steps in d["steps"])
            routes = tuple(tuple(tuple(int(x) for x in path) for path in paths)
                           for paths in d.get("routes", ()))
            op = d.get("op", "sum")
            if op not in REDUCE_OPS:
                raise ScheduleError(f"unknown reduce op {op!r:.40} in schedule JSON; expected one of {REDUCE_OPS}")
            return cls(int(d["nranks"]), int(d["count"]), d["collective"], int(d["root"]),
                       dtype_name(d["dtype"]), int(d["ntrees"]),
                       tuple((int(o), int(n)) for o, n in d["chunks"]), steps, routes, op)
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, ScheduleError):
                raise
            raise ScheduleError(f"malformed schedule JSON: {type(e).__name__}: {e}") from None
