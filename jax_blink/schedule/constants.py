"""The schedule format's vocabulary: version, magic word, op/collective/dtype codes, error type.

``docs/schedule_format.md`` is the specification; ``cc/`` reads the same
codes. Pure Python: never imports jax.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FORMAT_VERSION", "READ_VERSIONS", "MAGIC", "HEADER_WORDS", "HEADER_WORDS_V1", "OPS", "OP_CODE",
           "COLLECTIVES", "COLLECTIVE_CODE", "REDUCE_OPS", "REDUCE_OP_CODE", "DTYPES", "DTYPE_BY_CODE", "MAX_RANKS", "MAX_COUNT", "MAX_CHUNKS", "MAX_TREES", "MAX_STEPS_PER_RANK",
           "MAX_WORDS", "MAX_PROOF_WORDS", "LIMITS", "ScheduleError", "dtype_name", "ROOTED", "io_counts"]

FORMAT_VERSION = 2
#: versions the decoders read (a version 1 array is an op=sum schedule with in_count = out_count = count)
READ_VERSIONS = (1, 2)
MAGIC = 0x4B4E494C42  # "BLINK" in ASCII, little-endian
HEADER_WORDS = 12
HEADER_WORDS_V1 = 9

OPS = ("SEND", "RECV_REDUCE", "RECV_COPY")
OP_CODE = {name: code for code, name in enumerate(OPS)}
COLLECTIVES = ("allreduce", "broadcast", "reduce", "reduce_scatter", "allgather")
COLLECTIVE_CODE = {name: code for code, name in enumerate(COLLECTIVES)}
#: collectives with a root rank (the others have root -1)
ROOTED = ("broadcast", "reduce")
#: the elementwise operation of RECV_REDUCE
REDUCE_OPS = ("sum", "max", "min")
REDUCE_OP_CODE = {name: code for code, name in enumerate(REDUCE_OPS)}

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
DTYPE_BY_CODE = {code: name for name, (code, _) in DTYPES.items()}

# The limits of docs/schedule_format.md ("Limits"), the same in cc/core/validate.cc.
# Both validators refuse a schedule beyond one before allocating anything sized by it.
MAX_RANKS = 1 << 16
MAX_COUNT = 1 << 48
MAX_CHUNKS = 1 << 28
MAX_TREES = 1 << 28
MAX_STEPS_PER_RANK = 1 << 28
#: length of the flat encoding (keeps every index into it, and every dependency list, in int32)
MAX_WORDS = 1 << 28
#: words of the symbolic proof's state: (nranks * nchunks + steps) * ceil(nranks / 64)
MAX_PROOF_WORDS = 1 << 24
#: the limits by the name error messages give them
LIMITS = {"ranks": MAX_RANKS, "count": MAX_COUNT, "chunks": MAX_CHUNKS, "trees": MAX_TREES,
          "steps per rank": MAX_STEPS_PER_RANK, "words": MAX_WORDS, "proof state": MAX_PROOF_WORDS}


class ScheduleError(ValueError):
    """A schedule is malformed or does not compute its collective."""


def io_counts(collective: str, count: int, nranks: int) -> tuple:
    """``(in_count, out_count)``: the elements of each rank's input and output buffers.

    ``count`` is the accumulator's length (the full vector). reduce_scatter
    outputs and allgather inputs are one shard, ``count / nranks`` elements.

    Raises
    ------
    ScheduleError
        If ``collective`` is reduce_scatter or allgather and ``count`` is not
        a multiple of ``nranks``.

    Examples
    --------
    >>> io_counts("reduce_scatter", 12, 4), io_counts("allgather", 12, 4), io_counts("allreduce", 10, 4)
    ((12, 3), (3, 12), (10, 10))
    """
    if collective in ("reduce_scatter", "allgather"):
        if count % nranks:
            raise ScheduleError(f"{collective} needs count divisible by nranks, got count {count} "
                                f"and {nranks} ranks")
        shard = count // nranks
        return (count, shard) if collective == "reduce_scatter" else (shard, count)
    return count, count


def dtype_name(dtype) -> str:
    """Canonical name of ``dtype`` (a numpy/jax dtype, type or string).

    Raises
    ------
    ScheduleError
        If the dtype is not one a schedule can carry.

    Examples
    --------
    >>> dtype_name(np.float32), dtype_name("bfloat16")
    ('float32', 'bfloat16')
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
