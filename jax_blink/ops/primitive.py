"""The ``blink_psum`` primitive: abstract evaluation, jvp, transpose, batching and
its lowering to the ``jax_blink_collective`` XLA FFI custom call.

Its parameters carry everything lowering needs: the encoded schedule
(:class:`~jax_blink.ops.decide.EncodedSchedule`) and the request it was planned
from (:class:`~jax_blink.ops.decide.PlanRequest`, used only when batching
changes the element count). Rank and group are int32 operands computed from
``lax.axis_index``. Op ids are numbered per lowered module, in lowering order,
so the same program gets the same ids in every process.
"""

from __future__ import annotations

import functools
import itertools
import weakref

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jax_blink import _ffi
from jax_blink.ops.decide import schedule_for

__all__ = ["blink_psum_p", "bind_collective"]

blink_psum_p = Primitive("blink_psum")


_sites = itertools.count()


def bind_collective(flat, rank, group, *, axes, request, timeout_ms, varying, schedule=None):
    """Binds the primitive on a 1-D value (planning it when ``schedule`` is None).

    Each bind is its own call site (``site``): jax would otherwise lower two
    identical binds once and call the result twice, giving two collectives
    one op id.
    """
    if schedule is None:
        _, _, schedule = schedule_for(request, int(flat.size), np.dtype(flat.dtype).name)
    return blink_psum_p.bind(flat, rank, group, axes=axes, request=request, schedule=schedule,
                             timeout_ms=timeout_ms, varying=varying, site=next(_sites))


def _rebind(x, rank, group, **params):
    """Binds again (jvp, transpose) as a new call site."""
    params["site"] = next(_sites)
    return blink_psum_p.bind(x, rank, group, **params)


def _abstract_eval(x, rank, group, *, axes, varying, **params):
    mat = x.manual_axis_type
    if mat.varying & set(axes):
        return x.update(manual_axis_type=mat.update(varying=mat.varying - set(axes)))
    return x


def _impl(*args, **params):
    raise RuntimeError(
        "jax_blink.psum is a collective: call it inside jax.shard_map or jax.pmap")


def _jvp(primals, tangents, **params):
    x, rank, group = primals
    out = _rebind(x, rank, group, **params)
    tx = tangents[0]
    if type(tx) is ad.Zero:
        return out, ad.Zero.from_primal_value(out)
    return out, _rebind(tx, rank, group, **params)


def _transpose(ct, x, rank, group, *, axes, varying, **params):
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval), None, None]
    if varying:
        # check_vma=True: the result is invariant over `axes`, so the
        # cotangent of each rank's input is the (invariant) cotangent itself.
        return [lax.pcast(ct, axes, to="varying"), None, None]
    # check_vma=False and pmap: psum's transpose is psum, as for lax.psum.
    return [_rebind(ct, rank, group, axes=axes, varying=varying, **params), None, None]


def _batch(args, dims, *, schedule, request, site, **params):
    x, rank, group = args
    bx, brank, bgroup = dims
    if brank is not None or bgroup is not None:  # None: not mapped
        raise NotImplementedError("jax_blink.psum: rank and group cannot be batched")
    x = jnp.moveaxis(x, bx, 0)
    out = bind_collective(x.reshape(-1), rank, group, request=request, **params)
    return out.reshape(x.shape), 0


# Not side-effecting: every device runs the same program, so XLA merges or
# drops a collective on all of them alike. (Marking it side-effecting cost
# about 60 us per call on CPU.) A function called several times runs one op
# id several times; XLA runs them in program order on every device, which the
# per-rank generation counter relies on (tests/ops/test_psum.py checks it).
_ffi_rule = jax.ffi.ffi_lowering(_ffi.TARGET)
_op_ids = weakref.WeakKeyDictionary()  # lowered module -> its op id counter


def _lowering(ctx, x, rank, group, *, platform, schedule, timeout_ms, site, **params):
    _ffi.ensure_registered(platform)
    module = ctx.module_context.module
    if module not in _op_ids:
        _op_ids[module] = itertools.count(1)
    # one id per call site in the module; a call site inside a loop is told
    # apart by the executor's per-rank generation counter
    # collective and reduce_op: header words 4 and 7 of the (format version 2) schedule; the
    # handler checks them against the schedule it decodes
    return _ffi_rule(ctx, x, rank, group, schedule=schedule.words,
                     op_id=np.int64(next(_op_ids[module])), collective=np.int64(schedule.words[4]),
                     reduce_op=np.int64(schedule.words[7]), timeout_ms=np.int64(timeout_ms))


blink_psum_p.def_abstract_eval(_abstract_eval)
blink_psum_p.def_impl(_impl)
ad.primitive_jvps[blink_psum_p] = _jvp
ad.primitive_transposes[blink_psum_p] = _transpose
batching.primitive_batchers[blink_psum_p] = _batch
for _platform in ("cpu", "cuda"):
    mlir.register_lowering(blink_psum_p, functools.partial(_lowering, platform=_platform),
                           platform=_platform)
