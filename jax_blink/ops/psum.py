"""``psum``, ``pmean``, ``pmax``, ``pmin`` and ``explain``: drop-ins for the lax
allreduce collectives, on :func:`jax_blink.ops.collective.run`.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from jax_blink import settings
from jax_blink.ops import buckets as _buckets, hierarchical
from jax_blink.choice import decide as _decide
from jax_blink.choice import log
from jax_blink.ops.axes import axes_tuple, axis_size, canonical_groups
from jax_blink.ops.collective import carried_as, run

__all__ = ["psum", "pmean", "pmax", "pmin", "explain"]

_LAX_REDUCE = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}
_NAME = {"sum": "psum", "max": "pmax", "min": "pmin"}


def _allreduce(x, axis_name, op, *, axis_index_groups, topology, min_bytes, timeout_s, chunks,
               bucket_bytes=None, slow_ranks=None):
    name = _NAME[op]
    axes = axes_tuple(axis_name)
    leaves, treedef = jax.tree.flatten(x)
    if not leaves:
        return x
    if not any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
        # Constants (Python numbers, numpy arrays) hold the same value on every
        # device: as lax does, psum multiplies them by the number of devices
        # (weak types kept) and pmax/pmin return them; no collective.
        n = axis_size(axes, name)
        groups = canonical_groups(axis_index_groups, n, name, equal_sizes=False)
        size = len(groups[0]) if groups else n
        arrays = [jnp.asarray(leaf) for leaf in leaves]
        if op != "sum":
            return treedef.unflatten(arrays)
        log.record(f"psum over {axes}: constants, multiplied by {size} as lax.psum does")
        return treedef.unflatten([(a.astype(np.int32) if a.dtype == np.bool_ else a) * size
                                  for a in arrays])

    keywords = dict(topology=topology, min_bytes=min_bytes, timeout_s=timeout_s, chunks=chunks)
    buckets = [list(range(len(leaves)))]
    if op == "sum" and len(leaves) > 1:
        nbytes = [int(np.size(leaf)) * np.dtype(jnp.result_type(leaf)).itemsize for leaf in leaves]
        size, why = _decide.bucket_size(bucket_bytes, jax.default_backend(), sum(nbytes))
        buckets = _buckets.split(nbytes, size)
        log.record(f"{name} over {axes}: {len(leaves)} leaves ({sum(nbytes)} B per device) in "
                       f"{len(buckets)} bucket(s), last leaf first ("
                       + (f"bucket_bytes {size} from {why})" if size is not None else f"{why})"))
    elif bucket_bytes is not None:
        settings.bucket_bytes(bucket_bytes)  # checked even where it changes nothing
    out = [None] * len(leaves)
    for idx in buckets:
        for i, r in zip(idx, _reduce([leaves[i] for i in idx], axes, op, axis_index_groups,
                                     keywords, slow_ranks)):
            out[i] = r
    return treedef.unflatten(out)


def _reduce(leaves, axes, op, axis_index_groups, keywords, slow_ranks=None):
    """One collective (per dtype group) over ``leaves``: their reduced values."""
    name = _NAME[op]

    def fallback(blocks, mode):
        return _LAX_REDUCE[op](blocks, axes, axis_index_groups=axis_index_groups)

    shapes = [np.shape(leaf) for leaf in leaves]
    blocks = [jnp.reshape(leaf, (1, -1)) for leaf in leaves]
    span = hierarchical.path(name, axes, axis_index_groups, leaves, f"lax.p{op}", op=op,
                             topology=keywords["topology"], chunks=keywords["chunks"])
    if isinstance(span, str):
        return _LAX_REDUCE[op](leaves, axes, axis_index_groups=axis_index_groups)
    if span is not None:
        if slow_ranks is not None:
            log.record(f"{name} over {axes}: slow_ranks ignored: the devices span processes, whose "
                              "in-process phases are a reduce-scatter and an all-gather (no tree leaves)")
        out = hierarchical.allreduce(blocks, axes, span, name=name, op=op, **keywords)
    else:
        out = run(blocks, axes, name=name, collective="allreduce", op=op,
                  axis_index_groups=axis_index_groups, fallback=fallback,
                  unreduced_op=op, slow_ranks=slow_ranks, **keywords)
    return [o.reshape(s) for o, s in zip(out, shapes)]


_KEYWORDS_DOC = """
    axis_index_groups : sequence of sequences of int, optional
        As in lax: reduce within each group of axis indices (equal-sized
        groups covering the axis). Each group is planned as a partial
        allocation of the topology (``topology.subset(group)``).
    topology : Topology, str or None
        The link topology of the reduced devices (a :class:`Topology` or a
        preset name). Default: ``$JAX_BLINK_TOPOLOGY`` (a preset name or a
        topology JSON file), else on GPUs the detected allocation, else
        ``shm:N`` (devices sharing host memory).
    min_bytes : int or None
        Per-device bytes (per dtype) below which the lax collective is used.
        Default: ``$JAX_BLINK_MIN_BYTES``, else 0 (only empty values).
    timeout_s : float or None
        How long a device waits for its peers before failing with an error
        naming the ranks that never arrived. Default: ``$JAX_BLINK_TIMEOUT_S``,
        else 60.
    chunks : int or None
        Pipeline chunks per tree, overriding the planner's alpha-beta model.
        Default: ``$JAX_BLINK_CHUNKS``, else the model's choice.
    slow_ranks : sequence of int or None
        Ranks (linear indices over the reduced axes) that often arrive late
        (:func:`jax_blink.slow_ranks` reads them off :func:`jax_blink.stats`):
        the plan makes them leaves of its trees wherever the packing reaches the
        same rate, so that a late rank delays only its own last hop
        (``plan(slow_ranks=...)``; explain() says where it could not), and
        every parent reduces them after its other children. On CPU devices
        this gains nothing yet: no rank starts before all have joined
        (docs/sharp_bits.md, "Slow ranks"). Not with ``axis_index_groups``.
"""


def psum(x, axis_name, *, axis_index_groups=None, topology=None, min_bytes=None,
         timeout_s=None, chunks=None, bucket_bytes=None, slow_ranks=None):
    """Sum ``x`` over the devices of ``axis_name``; a drop-in for ``lax.psum``.

    Runs a topology-planned, pipelined tree allreduce through a C++ XLA
    custom call. Call it inside ``jax.shard_map`` or ``jax.pmap``, under jit,
    grad, jvp, vmap and scan, exactly like ``lax.psum``. Over devices of
    several processes (``jax.distributed``) it reduce-scatters inside each
    process, sums the shards across processes with ``lax.psum`` and
    all-gathers inside each process (:mod:`jax_blink.ops.hierarchical`), or
    runs ``lax.psum`` where that layout does not apply; ``explain()`` says
    which.

    Parameters
    ----------
    x : pytree of arrays
        Its leaves are summed in buckets, last leaf first (see
        ``bucket_bytes``); the leaves of one dtype in a bucket are packed into
        one collective. Pass the whole pytree: a call per leaf
        (``jax.tree.map``) makes a collective per leaf, which XLA does not
        merge as it merges ``lax.psum``'s (docs/sharp_bits.md). Supported dtypes:
        float32, float64, float16, bfloat16, int32, int64, uint32, complex64
        and complex128 (as pairs of floats), the 8- and 16-bit integers
        (carried as int32), and bool (summed as int32, as ``lax.psum`` does).
        Values typed unreduced over the axes (``P(unreduced=...)``) are summed
        into invariant values, as ``lax.psum`` does.
    axis_name : hashable or tuple of hashables
        The mesh axis (or axes) to reduce over.
    """ + _KEYWORDS_DOC + """    bucket_bytes : int or None
        Per-device bytes of the buckets a pytree's leaves are summed in, one
        collective per bucket, so that the first buckets travel while the
        rest are computed (the gradients of a backward pass). Taken last leaf
        first, a bucket closes once it holds at least this many bytes; a size
        at least the whole pytree gives one bucket. Default:
        ``$JAX_BLINK_BUCKET_BYTES``, else on CPU devices the size this
        machine's profile measured best in the training steps of the model
        nearest the pytree in bytes (``python -m jax_blink calibrate``), else the executor's cost model (on CPU
        devices the size whose fixed per-call cost is at most half of a
        call; on GPUs one bucket, since the CUDA executor runs in the compute
        stream's order). ``explain()`` says how a pytree was bucketed.

    Returns
    -------
    pytree
        Like ``lax.psum``: same structure, invariant over ``axis_name``.
    """
    return _allreduce(x, axis_name, "sum", axis_index_groups=axis_index_groups,
                      topology=topology, min_bytes=min_bytes, timeout_s=timeout_s, chunks=chunks,
                      bucket_bytes=bucket_bytes, slow_ranks=slow_ranks)


def pmean(x, axis_name, *, axis_index_groups=None, **kwargs):
    """Mean of ``x`` over ``axis_name``; a drop-in for ``lax.pmean``.

    Takes the same keyword arguments as :func:`psum`.
    """
    axes = axes_tuple(axis_name)
    # as lax.pmean: the size of the first group, also for groups of different sizes
    groups = canonical_groups(axis_index_groups, axis_size(axes, "pmean"), "pmean",
                              equal_sizes=False)
    n = len(groups[0]) if groups else axis_size(axes, "pmean")
    return jax.tree.map(lambda v: v / n,
                        psum(x, axis_name, axis_index_groups=axis_index_groups, **kwargs))


def pmax(x, axis_name, *, axis_index_groups=None, topology=None, min_bytes=None,
         timeout_s=None, chunks=None, slow_ranks=None):
    """Maximum of ``x`` over ``axis_name``; a drop-in for ``lax.pmax``.

    Runs the same planned trees as :func:`psum` with a max reduction, with
    XLA's CPU rules: a NaN never wins (a device's NaN is passed over) and a
    column that is NaN on every device gives -inf. Takes the same keyword
    arguments as :func:`psum` (but ``bucket_bytes``: the leaves travel
    together); like ``lax.pmax`` it is not differentiable.
    """
    return _allreduce(x, axis_name, "max", axis_index_groups=axis_index_groups,
                      topology=topology, min_bytes=min_bytes, timeout_s=timeout_s, chunks=chunks,
                      slow_ranks=slow_ranks)


def pmin(x, axis_name, *, axis_index_groups=None, topology=None, min_bytes=None,
         timeout_s=None, chunks=None, slow_ranks=None):
    """Minimum of ``x`` over ``axis_name``; a drop-in for ``lax.pmin``.

    As :func:`pmax`, with a min reduction (an all-NaN column gives +inf).
    """
    return _allreduce(x, axis_name, "min", axis_index_groups=axis_index_groups,
                      topology=topology, min_bytes=min_bytes, timeout_s=timeout_s, chunks=chunks,
                      slow_ranks=slow_ranks)


_COLLECTIVE_OF = {"psum": ("allreduce", "sum"), "pmean": ("allreduce", "sum"),
                  "pmax": ("allreduce", "max"), "pmin": ("allreduce", "min"),
                  "psum_scatter": ("reduce_scatter", "sum"), "all_gather": ("allgather", "sum"),
                  "broadcast": ("broadcast", "sum")}


def explain(x=None, axis_size=None, *, op="psum", root=0, topology=None, min_bytes=None,
            chunks=None, slow_ranks=None):
    """Say which plan a jax_blink collective uses, or why it falls back to lax.

    With no arguments, returns what the most recent traces decided (one line
    per dtype group of each call). With ``x`` (an array or
    ``jax.ShapeDtypeStruct``: one device's input) and ``axis_size`` (devices
    reduced over), describes the decision for that call of ``op`` (one of
    ``psum``, ``pmean``, ``pmax``, ``pmin``, ``psum_scatter``, ``all_gather``,
    ``broadcast``) without running anything: the same decision the op makes;
    only the mesh and backend checks need a trace.

    Set ``JAX_BLINK_DEBUG=1`` to log every decision (and, in C++, every
    call) as it happens.
    """
    if x is None:
        return "\n".join(log.recent()) or "no jax_blink collective has been traced yet"
    if axis_size is None:
        raise TypeError("explain(x, axis_size): give the number of devices reduced over")
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(f"explain(x, axis_size): x must be one device's input, an array or a "
                        f"jax.ShapeDtypeStruct, got {x!r:.60}")
    if isinstance(axis_size, bool) or not isinstance(axis_size, (int, np.integer)):
        raise TypeError(f"explain(x, axis_size): axis_size must be a whole number of devices, got "
                        f"{axis_size!r:.60}")
    if axis_size < 1:
        raise ValueError(f"explain(x, axis_size): axis_size must be at least 1 device, got {axis_size}")
    if op not in _COLLECTIVE_OF:
        raise ValueError(f"explain: op must be one of {', '.join(_COLLECTIVE_OF)}, got {op!r}")
    collective, reduce_op = _COLLECTIVE_OF[op]
    dtype, parts = carried_as(x.dtype)
    count = int(np.prod(x.shape)) * parts * (axis_size if collective == "allgather" else 1)
    return _decide.decide(count, dtype, axis_size, collective=collective, op=reduce_op,
                          root=root if collective == "broadcast" else None, topology=topology,
                          min_bytes=min_bytes, chunks=chunks, slow_ranks=slow_ranks).text
