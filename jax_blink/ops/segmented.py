"""The ``blink_allreduce_segments`` primitive: one bucket's leaves summed by one custom call,
each where XLA keeps it.

A bucket of several leaves is one collective over the concatenation of its leaves. Built
as ``jnp.concatenate`` around :data:`~jax_blink.ops.primitive.blink_collective_p`, XLA
copies every leaf into one buffer first and the sums back out after (on 2 CPU cores the
copy alone cost a 4x1024 MLP's step more than lax's whole all-reduce:
docs/design_notes.md). This primitive instead passes the leaves (1-D, one
dtype) as separate operands of the ``jax_blink_collective_segments`` custom call, whose
CPU handler runs the same schedule with the vector in several buffers (``ExecArgs::nsegs``,
cc/cpu/executor_cpu.h) and writes each sum into its own result.

Allreduce only, among the devices of one process or over the host transport (the
processes of one host, in shared memory), without ``axis_index_groups`` (:func:`applies`).
On GPUs the primitive lowers to the concatenation around the one-vector collective. Its jvp, transpose and batching follow the
allreduce's in :mod:`jax_blink.ops.primitive`; ``settings.segmented`` (``JAX_BLINK_SEGMENTED=0``)
turns it off for comparisons.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jax_blink import _ffi, settings
from jax_blink.ops.primitive import bind_collective, lowering_attributes, result_aval
from jax_blink.processes.layout import check_lowered_mesh
from jax_blink.choice.requests import schedule_for

__all__ = ["blink_allreduce_segments_p", "bind_segments", "applies"]

blink_allreduce_segments_p = Primitive("blink_allreduce_segments")
blink_allreduce_segments_p.multiple_results = True

_sites = itertools.count()


def applies(collective: str, parts: list, groups) -> bool:
    """Whether a bucket of these 2-D ``parts`` goes to the executor as separate operands: an
    allreduce of several non-empty parts, without ``axis_index_groups`` (whose groups may
    run different schedules), unless ``JAX_BLINK_SEGMENTED=0``. (Either transport takes
    them: the ranks of one process, or the processes of one host.)"""
    return (collective == "allreduce" and len(parts) > 1 and groups is None
            and all(int(np.prod(p.shape)) > 0 for p in parts) and settings.segmented())


def bind_segments(flats, rank, group, *, axes, request, timeout_ms, mode, schedule=None,
                  transport=0):
    """The allreduce of ``request`` over the concatenation of the 1-D values ``flats`` (one
    dtype), each one's sum in its own result; ``schedule``: the plan of the whole vector
    (planned here when None); ``transport`` as
    :func:`~jax_blink.ops.primitive.bind_collective`'s. A call site of its own, as that
    function's."""
    if schedule is None:
        count = sum(int(f.size) for f in flats)
        _, _, schedule = schedule_for(request, count, np.dtype(flats[0].dtype).name)
    return blink_allreduce_segments_p.bind(rank, group, *flats, axes=axes, request=request,
                                           schedule=schedule, timeout_ms=timeout_ms, mode=mode,
                                           transport=transport, site=next(_sites))


def _abstract_eval(rank, group, *xs, axes, request, mode, **params):
    return [result_aval(x, axes=axes, request=request, mode=mode) for x in xs]


def _impl(*args, **params):
    raise RuntimeError("jax_blink collectives run inside jax.shard_map or jax.pmap; call them there")


def _jvp(primals, tangents, *, schedule, site, **params):
    rank, group, *xs = primals
    out = bind_segments(xs, rank, group, schedule=schedule, **params)
    if all(type(t) is ad.Zero for t in tangents[2:]):
        return out, [ad.Zero.from_primal_value(o) for o in out]
    ts = [ad.instantiate_zeros(t) for t in tangents[2:]]
    return out, bind_segments(ts, rank, group, schedule=schedule, **params)


def _transpose(cts, rank, group, *xs, axes, mode, schedule, site, **params):
    """As the allreduce's transpose: a varying value's cotangent is every rank's (cast back
    to varying), an unreduced one's reduced; untyped (check_vma=False, pmap) the cotangents
    are summed again."""
    if mode in ("varying", "unreduced"):
        to = "varying" if mode == "varying" else "reduced"
        return [None, None, *(None if type(c) is ad.Zero else lax.pcast(c, axes, to=to) for c in cts)]
    cts = [ad.instantiate_zeros(c) for c in cts]
    return [None, None, *bind_segments(cts, rank, group, axes=axes, mode=mode, schedule=schedule, **params)]


def _batch(args, dims, *, request, schedule, site, **params):
    """The sum is elementwise: each operand's batch folds into its vector (a new plan for
    the longer whole); an unbatched operand is broadcast to the batch."""
    rank, group, *xs = args
    if dims[0] is not None or dims[1] is not None:
        raise NotImplementedError("jax_blink collectives: rank and group cannot be batched")
    size = next(x.shape[d] for x, d in zip(xs, dims[2:]) if d is not None)
    moved = [jnp.broadcast_to(x, (size, *x.shape)) if d is None else jnp.moveaxis(x, d, 0)
             for x, d in zip(xs, dims[2:])]
    out = bind_segments([m.reshape(-1) for m in moved], rank, group, request=request, **params)
    return [o.reshape(m.shape) for o, m in zip(out, moved)], [0] * len(out)


_ffi_rule = jax.ffi.ffi_lowering(_ffi.SEGMENTS_TARGET)


def _lowering_cpu(ctx, rank, group, *xs, request, schedule, timeout_ms, transport, **params):
    _ffi.ensure_registered("cpu")
    check_lowered_mesh(getattr(ctx.module_context, "axis_context", None))
    return _ffi_rule(ctx, rank, group, *xs, **lowering_attributes(ctx, request, schedule, timeout_ms),
                     transport=np.int64(transport))


def _concatenated(rank, group, *xs, axes, request, schedule, timeout_ms, mode, transport, site):
    """The same allreduce as one vector: concatenated, summed by the one-vector collective,
    sliced back (the GPUs' lowering; one that asks for the host transport fails there as
    the one-vector collective's does)."""
    out = bind_collective(jnp.concatenate(xs), rank, group, axes=axes, request=request,
                          schedule=schedule, timeout_ms=timeout_ms, mode=mode, transport=transport)
    bounds = np.cumsum([0, *(x.shape[0] for x in xs)])
    return [out[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


blink_allreduce_segments_p.def_abstract_eval(_abstract_eval)
blink_allreduce_segments_p.def_impl(_impl)
ad.primitive_jvps[blink_allreduce_segments_p] = _jvp
ad.primitive_transposes[blink_allreduce_segments_p] = _transpose
batching.primitive_batchers[blink_allreduce_segments_p] = _batch
mlir.register_lowering(blink_allreduce_segments_p, _lowering_cpu, platform="cpu", cacheable=False)
mlir.register_lowering(blink_allreduce_segments_p, mlir.lower_fun(_concatenated, multiple_results=True),
                       platform="cuda")
