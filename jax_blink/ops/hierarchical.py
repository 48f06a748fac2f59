"""Collectives over devices that span processes: Blink's multi-server protocol.

The allreduce:

1. reduce-scatter inside each process, along Blink trees planned on that
   process's devices (:func:`jax_blink.ops.collective.run`, in-process groups);
2. allreduce of each device's shard across processes with XLA's own
   collective (``lax.psum``/``pmax``/``pmin`` over the cross-process axes;
   for one axis split among processes, ``lax.psum_scatter`` and
   ``lax.all_gather`` over the groups of equal position): gloo on CPU, NCCL
   on GPU;
3. all-gather inside each process along Blink trees, typed invariant over
   the axes as ``lax.psum``'s result is.

The reduce-scatter is steps 1 and 2 with ``lax.psum_scatter`` across
processes; the all-gather is ``lax.all_gather`` across processes, then step
3 (typed varying, as lax's). Their blocks are reordered so that each
device's in-process shard holds the blocks of the ranks that share its
in-process position.

Every process traces the same steps (the layout comes from
:func:`jax_blink.processes.layout.layout`, which reads no per-process state),
so every process lowers the same plans, schedules and op ids.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from jax_blink import settings
from jax_blink.choice import decide as _decide
from jax_blink.choice import log
from jax_blink.ops.collective import run
from jax_blink.processes.layout import HostLocal, Spanning, layout

__all__ = ["span_for", "path", "allreduce", "reduce_scatter", "all_gather"]

# the lax collectives, as imported (not drop-ins a user swapped into jax.lax)
_LAX = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}
_LAX_PSUM_SCATTER, _LAX_ALL_GATHER = lax.psum_scatter, lax.all_gather


def span_for(axes: tuple, axis_index_groups, leaves, op: str = "sum"):
    """None (the in-process path: one process, or each group inside one), a
    :class:`Spanning` layout this module serves, or why the call goes to lax
    (its devices span processes in a way this module does not serve)."""
    if axis_index_groups is not None or _decide.environment_reason(axes) is not None:
        return None  # run() checks these (groups spanning processes go to lax there)
    span = layout(axes)
    if isinstance(span, HostLocal):
        return None  # one host: run() takes it, over shared memory
    if not isinstance(span, Spanning):
        return span
    if settings.algo() == "lax":
        return "JAX_BLINK_ALGO=lax"
    if any(set(axes) & set(jax.typeof(leaf).manual_axis_type.unreduced) for leaf in leaves):
        return "an unreduced value over devices of several processes"
    if span.groups is not None and op != "sum":
        return (f"p{op} over one axis split among processes: XLA has no grouped p{op} inside "
                "shard_map to reduce the shards across processes")
    return span


def path(name: str, axes: tuple, axis_index_groups, leaves, lax_text: str, *, op: str = "sum",
         collective: str = "allreduce", topology=None, chunks=None):
    """Which path a call over ``axes`` takes: None (in-process: :func:`run`), a
    :class:`Spanning` layout (this module's phases), or the recorded decision that
    ``lax_text`` (the lax collective) runs it instead. Over a spanning layout the chooser decides
    (:func:`jax_blink.choice.decide.across`, for ``collective`` of ``leaves``; ``topology``
    and ``chunks``: the op's keywords)."""
    span = span_for(axes, axis_index_groups, leaves, op)
    if isinstance(span, Spanning):
        groups = {}
        for leaf in leaves:  # one collective per dtype group, as run() makes them
            dtype = np.dtype(jnp.result_type(leaf)).name
            groups[dtype] = groups.get(dtype, 0) + int(np.size(leaf))
        d = _decide.across(name, axes, lax_text, collective, groups, span.nprocesses, span.per_process,
                           topology=topology, chunks=chunks)
        if not d.phases:
            return d.text
    elif isinstance(span, str):
        log.record(f"{name} over {axes}: {lax_text} ({span})")
    return span


def allreduce(blocks: list, axes: tuple, span: Spanning, *, name: str, op: str,
              **keywords) -> list:
    """The allreduce of ``(1, m)`` ``blocks`` over ``axes`` (see the module
    docstring); ``keywords`` are the op's (topology, min_bytes, timeout_s,
    chunks), used for the in-process phases."""
    k = span.per_process
    hosts = span.nprocesses
    local = span.local_axes if span.local_axes is not None else axes
    groups = span.groups
    cross = (f"lax.p{op}{_where(span)}" if span.groups is None else
             f"lax.psum_scatter + lax.all_gather{_where(span)}")
    log.record(f"{name} over {axes}: hierarchical ({span.describe()}; across {span.units} "
                   f"{cross})")
    # each shard splits again across processes in the one-axis layout
    multiple = k * (hosts if groups is not None else 1)
    sizes = [b.shape[1] for b in blocks]
    padded = []
    for b, m in zip(blocks, sizes):
        flat = b.reshape(-1)
        pad = -m % multiple
        if pad:
            flat = jnp.concatenate([flat, jnp.zeros((pad,), flat.dtype)])
        padded.append(flat.reshape(k, -1))

    def rs_fallback(bs, mode):
        if op == "sum":
            return [_LAX_PSUM_SCATTER(b, local, axis_index_groups=groups, tiled=False)
                    .reshape(1, -1) for b in bs]
        # no lax reduce-scatter for max/min: reduce, keep this device's row
        rank = lax.axis_index(local)
        return [lax.dynamic_index_in_dim(_LAX[op](b, local), rank, keepdims=True) for b in bs]

    shards = run(padded, local, name=name, collective="reduce_scatter", op=op,
                 axis_index_groups=groups, fallback=rs_fallback, **keywords)
    if groups is None:
        shards = _LAX[op](shards, span.cross_axes)
    else:
        shards = [_LAX_ALL_GATHER(_LAX_PSUM_SCATTER(s.reshape(-1), axes,
                                                   axis_index_groups=span.cross_groups,
                                                   tiled=True),
                                 axes, axis_index_groups=span.cross_groups, tiled=True)
                  .reshape(1, -1) for s in shards]

    def ag_fallback(bs, mode):
        if groups is None:
            return [_LAX_ALL_GATHER(b[0], local, to="invarying" if mode == "invariant"
                                    else "varying") for b in bs]
        # no grouped invariant all-gather in lax: gather the whole axis and
        # keep the first process's shards (every process holds the same)
        first = jnp.asarray(groups[0])
        return [_LAX_ALL_GATHER(b[0], axes, to="invarying" if mode == "invariant"
                                else "varying")[first] for b in bs]

    full = run(shards, local, name=name, collective="allgather",
               axis_index_groups=groups, fallback=ag_fallback, invariant=True, **keywords)
    return [f.reshape(1, -1)[:, :m] for f, m in zip(full, sizes)]


def _rank_order(axes, span):
    """``(shape, perm)``: the ranks over ``axes`` (row-major) viewed as
    ``shape`` and transposed by ``perm`` into (in-process position,
    cross-process position) order, each row-major."""
    if span.groups is not None:  # one axis in contiguous runs: rank = process * k + position
        return (span.nprocesses, span.per_process), (1, 0)
    sizes = [lax.axis_size(a) for a in axes]
    order = [axes.index(a) for a in span.local_axes + span.cross_axes]
    return tuple(sizes), tuple(order)


def reduce_scatter(blocks: list, axes: tuple, span: Spanning, *, name: str, **keywords) -> list:
    """The reduce-scatter of ``(n, w)`` ``blocks`` (row r: rank r's block) over
    ``axes``: a ``(1, w)`` block per device (see the module docstring)."""
    k, hosts = span.per_process, span.nprocesses
    local = span.local_axes if span.local_axes is not None else axes
    cross = span.cross_axes if span.cross_axes is not None else axes
    cross_groups = span.cross_groups
    log.record(f"{name} over {axes}: hierarchical ({span.describe()}; across {span.units} "
                   f"lax.psum_scatter{_where(span)})")
    shape, perm = _rank_order(axes, span)
    # row j of the in-process input: the blocks of the ranks at position j
    ordered = [jnp.transpose(b.reshape(shape + (-1,)), perm + (len(shape),)).reshape(k, -1)
               for b in blocks]

    def rs_fallback(bs, mode):
        return [_LAX_PSUM_SCATTER(b, local, axis_index_groups=span.groups, tiled=False)
                .reshape(1, -1) for b in bs]

    shards = run(ordered, local, name=name, collective="reduce_scatter",
                 axis_index_groups=span.groups, fallback=rs_fallback, **keywords)
    return [_LAX_PSUM_SCATTER(s.reshape(hosts, -1), cross, axis_index_groups=cross_groups,
                              tiled=False).reshape(1, -1) for s in shards]


def all_gather(blocks: list, axes: tuple, span: Spanning, *, name: str, **keywords) -> list:
    """The all-gather of ``(1, w)`` ``blocks`` over ``axes``: ``(n, w)`` per
    device, row r from rank r (see the module docstring)."""
    local = span.local_axes if span.local_axes is not None else axes
    cross = span.cross_axes if span.cross_axes is not None else axes
    log.record(f"{name} over {axes}: hierarchical ({span.describe()}; across {span.units} "
                   f"lax.all_gather{_where(span)})")
    across = [_LAX_ALL_GATHER(b[0], cross, axis_index_groups=span.cross_groups, tiled=True)
              .reshape(1, -1) for b in blocks]

    def ag_fallback(bs, mode):
        return [_LAX_ALL_GATHER(b[0], local, axis_index_groups=span.groups) for b in bs]

    full = run(across, local, name=name, collective="allgather", axis_index_groups=span.groups,
               fallback=ag_fallback, **keywords)
    shape, perm = _rank_order(axes, span)
    moved = tuple(shape[i] for i in perm)
    inverse = tuple(int(i) for i in np.argsort(perm))
    n = int(np.prod(shape))
    return [jnp.transpose(f.reshape(moved + (-1,)), inverse + (len(shape),)).reshape(n, -1)
            for f in full]


def _where(span):
    if span.groups is None:
        return f" over {span.cross_axes}"
    return f" in groups {[list(g) for g in span.cross_groups]}"
