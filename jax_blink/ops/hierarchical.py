"""The allreduce of devices that span processes: Blink's multi-server protocol.

1. reduce-scatter inside each process, along Blink trees planned on that
   process's devices (:func:`jax_blink.ops.collective.run`, in-process groups);
2. allreduce of each device's shard across processes with XLA's own
   collective (``lax.psum``/``pmax``/``pmin`` over the cross-process axes;
   for one axis split among processes, ``lax.psum_scatter`` and
   ``lax.all_gather`` over the groups of equal position): gloo on CPU, NCCL
   on GPU;
3. all-gather inside each process along Blink trees, typed invariant over
   the axes as ``lax.psum``'s result is.

Every process traces the same steps (the layout comes from
:func:`jax_blink.ops.processes.layout`, which reads no per-process state),
so every process lowers the same plans, schedules and op ids.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jax_blink.ops import decide as _decide
from jax_blink.ops.collective import run
from jax_blink.ops.processes import Spanning

__all__ = ["serves", "allreduce"]

# the lax collectives, as imported (not drop-ins a user swapped into jax.lax)
_LAX = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}
_LAX_PSUM_SCATTER, _LAX_ALL_GATHER = lax.psum_scatter, lax.all_gather


def serves(span: Spanning, op: str):
    """None if the hierarchical path serves ``op`` over ``span``, else why not."""
    if span.groups is not None and op != "sum":
        return (f"p{op} over one axis split among processes: XLA has no grouped p{op} inside "
                "shard_map to reduce the shards across processes")
    return None


def allreduce(blocks: list, axes: tuple, span: Spanning, *, name: str, op: str,
              **keywords) -> list:
    """The allreduce of ``(1, m)`` ``blocks`` over ``axes`` (see the module
    docstring); ``keywords`` are the op's (topology, min_bytes, timeout_s,
    chunks), used for the in-process phases."""
    k = span.per_process
    hosts = span.nprocesses
    local = span.local_axes if span.local_axes is not None else axes
    groups = span.groups
    _decide.record(f"{name} over {axes}: hierarchical ({span.describe()}; across processes "
                   f"{_cross_text(span, op)})")
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


def _cross_text(span, op):
    if span.groups is None:
        return f"lax.p{op} over {span.cross_axes}"
    return f"lax.psum_scatter + lax.all_gather in groups {[list(g) for g in span.cross_groups]}"
