"""The ``blink_collective`` primitive: abstract evaluation, jvp, transpose,
batching and its lowering to the ``jax_blink_collective`` XLA FFI custom call.

One primitive serves every collective: its ``request``
(:class:`~jax_blink.choice.requests.PlanRequest`) says which (allreduce, broadcast,
reduce, reduce_scatter, allgather), with which reduction and root, and on
which topology; the encoded schedule (:class:`~jax_blink.choice.requests.EncodedSchedule`)
is what lowering embeds. The operand is always a 1-D vector: the whole
vector for allreduce, broadcast, reduce and reduce_scatter (its ``n`` shards
laid out one after another), one shard for allgather. Rank and group are int32
operands (:mod:`jax_blink.ops.axes`). Op ids are numbered per lowered module,
in lowering order, so the same program gets the same ids in every process.

``mode`` says how the value is typed over the reduced axes under
``check_vma``: ``"varying"`` (the usual case), ``"unreduced"`` (a typed partial
sum, allreduce and reduce_scatter only; on jax >= 0.11 also a partial max or
min, allreduce only: :func:`reduced_type`), ``"invariant"`` (allgather only: the
result is typed invariant over the axes, as ``lax.all_gather(to="invarying")``)
or ``"untyped"`` (``check_vma=False`` and ``pmap``: no typing, and transposes
communicate as in lax).
"""

from __future__ import annotations

import dataclasses
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
from jax_blink.choice.requests import schedule_for
from jax_blink.processes.layout import check_lowered_mesh
from jax_blink.schedule.constants import COLLECTIVE_CODE, REDUCE_OP_CODE

__all__ = ["blink_collective_p", "bind_collective", "MODES", "reduced_type", "result_aval", "next_op_id",
           "lowering_attributes"]

blink_collective_p = Primitive("blink_collective")
MODES = ("varying", "unreduced", "invariant", "untyped")

_sites = itertools.count()
_LAX_ALL_GATHER = lax.all_gather  # as imported (not a drop-in a user swapped into jax.lax)


def bind_collective(flat, rank, group, *, axes, request, timeout_ms, mode, schedule=None,
                    transport=0):
    """Binds the primitive on a 1-D value (planning it when ``schedule`` is None).

    ``flat`` holds the whole vector (one shard for allgather). Each bind is its
    own call site (``site``): jax would otherwise lower two identical binds
    once and call the result twice, giving two collectives one op id.
    ``transport``: 0, the ranks meet in this process; 1, in the shared memory
    of this host's processes (:mod:`jax_blink.processes.transport`; CPU only).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if schedule is None:
        count = int(flat.size) * (request.topology.n if request.collective == "allgather" else 1)
        _, _, schedule = schedule_for(request, count, np.dtype(flat.dtype).name)
    return blink_collective_p.bind(flat, rank, group, axes=axes, request=request,
                                   schedule=schedule, timeout_ms=timeout_ms, mode=mode,
                                   transport=transport, site=next(_sites))


def _rebind(x, rank, group, *, site=None, schedule=None, **params):
    """Binds again (jvp, transpose) as a new call site, with the schedule of
    its request (a transpose changes the collective; schedules are cached)."""
    return bind_collective(x, rank, group, **params)


def _out_size(request, size):
    n = request.topology.n
    if request.collective == "reduce_scatter":
        return size // n
    if request.collective == "allgather":
        return size * n
    return size


def _abstract_eval(x, rank, group, *, axes, request, mode, **params):
    return result_aval(x, axes=axes, request=request, mode=mode)


def result_aval(x, *, axes, request, mode):
    """The abstract value of the collective's result on the 1-D value ``x`` (its shape and how
    it is typed over ``axes``, :data:`MODES`)."""
    out = x.update(shape=(_out_size(request, x.shape[0]),))
    mat = out.manual_axis_type
    axes = set(axes)
    if (mode == "varying" and request.collective in ("allreduce", "broadcast")) or (
            mode == "invariant" and request.collective == "allgather"):
        return out.update(manual_axis_type=mat.update(varying=mat.varying - axes))
    if mode == "unreduced":
        return out.update(manual_axis_type=reduced_type(
            mat, axes, scatter=request.collective == "reduce_scatter"))
    return out  # reduce, reduce_scatter, allgather (varying stays varying), untyped


def reduced_type(mat, axes, *, scatter: bool = False):
    """The manual axis type of a value unreduced over ``axes`` (a typed partial
    sum, max or min) once reduced over them: invariant over them (allreduce,
    as lax's ``unreduced_psum``) or varying (``scatter``: reduce_scatter, as
    ``unreduced_psum_scatter``); still unreduced over the other axes.

    jax >= 0.11 types how a value is unreduced (``unreduced_kind``: sum, max or
    min) and wants no kind on a type unreduced over no axis; jax 0.10's types
    have no kind (every unreduced value is a sum). The capability decides,
    not the version.
    """
    axes = frozenset(axes)
    changes = {"unreduced": mat.unreduced - axes}
    if scatter:
        changes["varying"] = mat.varying | axes
    if hasattr(mat, "unreduced_kind") and not changes["unreduced"]:
        changes["unreduced_kind"] = None  # jax >= 0.11: no unreduced axis, no kind
    return mat.update(**changes)


def _impl(*args, **params):
    raise RuntimeError(
        "jax_blink collectives run inside jax.shard_map or jax.pmap; call them there")


def _jvp(primals, tangents, *, request, **params):
    x, rank, group = primals
    if request.op != "sum":
        raise NotImplementedError(
            f"jax_blink.p{request.op} is not differentiable (nor is lax.p{request.op})")
    out = _rebind(x, rank, group, request=request, **params)
    tx = tangents[0]
    if type(tx) is ad.Zero:
        return out, ad.Zero.from_primal_value(out)
    return out, _rebind(tx, rank, group, request=request, **params)


# The collective that transposes each one (allreduce and broadcast are
# handled by mode below). The ops mask reduce's non-root outputs, so only the
# root's cotangent counts and a broadcast transposes it.
_TRANSPOSE = {"broadcast": "reduce", "reduce": "broadcast", "reduce_scatter": "allgather",
              "allgather": "reduce_scatter"}


def _transpose(ct, x, rank, group, *, axes, request, mode, **params):
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval), None, None]
    collective = request.collective

    def rebind(c, collective):
        return _rebind(c, rank, group, axes=axes, mode=mode,
                       request=dataclasses.replace(request, collective=collective), **params)

    if collective == "allreduce":
        if mode == "varying":  # the invariant cotangent is every rank's
            return [lax.pcast(ct, axes, to="varying"), None, None]
        if mode == "unreduced":  # as lax's unreduced_psum
            return [lax.pcast(ct, axes, to="reduced"), None, None]
        return [rebind(ct, "allreduce"), None, None]
    if collective == "broadcast":  # only the root's input reaches the outputs
        ct = lax.pcast(ct, axes, to="varying") if mode == "varying" else rebind(ct, "reduce")
        return [jnp.where(rank == request.root, ct, jnp.zeros_like(ct)), None, None]
    if collective == "allgather" and mode == "invariant":
        return [_invariant_gather_transpose(ct, rank, axes, request.topology.n), None, None]
    if collective == "reduce_scatter" and mode == "unreduced":
        # as lax's unreduced_psum_scatter: a reduced all-gather
        return [_LAX_ALL_GATHER(ct, axes, tiled=True, to="reduced"), None, None]
    return [rebind(ct, _TRANSPOSE[collective]), None, None]


def _invariant_gather_transpose(ct, rank, axes, n):
    """The transpose of an invariant all-gather of ``n``-device groups: each
    device's block of the (invariant) cotangent, as lax's all_gather_invariant
    transposes. Where the axes hold several groups (the hierarchical path's
    in-process groups, all gathering the same value), the gathered value is
    defined as the groups' mean, so each group's devices get 1/groups of it."""
    total = 1
    for ax in axes:
        total *= lax.axis_size(ax)
    m = ct.shape[0] // n
    own = lax.dynamic_slice_in_dim(lax.pcast(ct, axes, to="varying"), rank * m, m)
    return own if total == n else own / (total // n)


def _batch(args, dims, *, request, site, schedule, **params):
    """Batches by planning the batched vector: shards (reduce_scatter's input,
    allgather's output) stay contiguous per rank."""
    x, rank, group = args
    bx, brank, bgroup = dims
    if brank is not None or bgroup is not None:  # None: not mapped
        raise NotImplementedError("jax_blink collectives: rank and group cannot be batched")
    x = jnp.moveaxis(x, bx, 0)
    b, size = x.shape
    n = request.topology.n
    if request.collective == "reduce_scatter":
        flat = x.reshape(b, n, size // n).swapaxes(0, 1).reshape(-1)
        return bind_collective(flat, rank, group, request=request, **params).reshape(b, -1), 0
    out = bind_collective(x.reshape(-1), rank, group, request=request, **params)
    if request.collective == "allgather":
        return out.reshape(n, b, size).swapaxes(0, 1).reshape(b, n * size), 0
    return out.reshape(b, size), 0


# Not side-effecting: every device runs the same program, so XLA merges or
# drops a collective on all of them alike. (Marking it side-effecting cost
# about 60 us per call on CPU.) A function called several times runs one op
# id several times; XLA runs them in program order on every device, which the
# per-rank generation counter relies on (tests/ops/test_psum.py checks it).
_ffi_rule = jax.ffi.ffi_lowering(_ffi.TARGET)
# On CPU an allreduce's or broadcast's output takes its input's buffer where the input is
# computed in the same function (a gradient, a bucket's concatenation): the executor runs in
# place (no fresh output to fault in, no separate accumulator; cc/cpu/executor_cpu.h,
# CpuInPlace; about 7% of a 4 MB allreduce on 8 CPU devices). Where the input is the
# function's argument (through reshapes), XLA would first copy it (the caller still holds
# it), which costs more than in place saves (70% of the same allreduce): those run out of
# place, as does any input XLA must keep for a later reader (XLA copies it then).
_ffi_rule_in_place = jax.ffi.ffi_lowering(_ffi.TARGET, operand_output_aliases={0: 0})
_IN_PLACE = ("allreduce", "broadcast")
_VIEWS = ("stablehlo.reshape", "stablehlo.bitcast_convert")  # the same buffer, seen again


def _is_argument(value) -> bool:
    """Whether ``value`` (an MLIR value) is a block argument, seen through reshapes: the
    function's (or the ``shard_map`` region's) argument. The lowering is not cached
    (``cacheable=False`` below), so that it sees the caller's value, not a private
    function's argument."""
    while not isinstance(value, mlir.ir.BlockArgument):
        owner = value.owner  # an operation (or its OpView)
        if getattr(owner, "name", None) not in _VIEWS:
            return False
        value = owner.operands[0]
    return True


_op_ids = weakref.WeakKeyDictionary()  # lowered module -> its op id counter


def next_op_id(ctx) -> np.int64:
    """The next call site's op id in the module ``ctx`` lowers (every jax_blink custom call of
    a module draws from one counter, from 1, in lowering order). One id per call site in the
    module; a call site inside a loop is told apart by the executor's per-rank generation
    counter."""
    module = ctx.module_context.module
    if module not in _op_ids:
        _op_ids[module] = itertools.count(1)
    return np.int64(next(_op_ids[module]))


def _lowering(ctx, x, rank, group, *, platform, request, schedule, timeout_ms, transport,
              **params):
    _ffi.ensure_registered(platform)
    check_lowered_mesh(getattr(ctx.module_context, "axis_context", None))
    in_place = platform == "cpu" and request.collective in _IN_PLACE and not _is_argument(x)
    rule = _ffi_rule_in_place if in_place else _ffi_rule
    if platform == "cpu":
        params = {"transport": np.int64(transport)}
    elif transport:
        raise NotImplementedError("jax_blink: the host transport between processes runs on CPU "
                                  "devices only (GPUs: CUDA IPC is not built yet)")
    else:
        params = {}
    return rule(ctx, x, rank, group, **lowering_attributes(ctx, request, schedule, timeout_ms), **params)


def lowering_attributes(ctx, request, schedule, timeout_ms) -> dict:
    """The custom call's attributes but ``transport``: the encoded schedule, the call site's
    op id (:func:`next_op_id`), the timeout and what the handler checks the schedule
    against (collective and reduce_op: header words 4 and 7 of the (format version 2)
    schedule)."""
    return {"schedule": schedule.words, "op_id": next_op_id(ctx), "timeout_ms": np.int64(timeout_ms),
            "collective": np.int64(COLLECTIVE_CODE[request.collective]),
            "reduce_op": np.int64(REDUCE_OP_CODE[request.op])}


blink_collective_p.def_abstract_eval(_abstract_eval)
blink_collective_p.def_impl(_impl)
ad.primitive_jvps[blink_collective_p] = _jvp
ad.primitive_transposes[blink_collective_p] = _transpose
batching.primitive_batchers[blink_collective_p] = _batch
for _platform in ("cpu", "cuda"):
    mlir.register_lowering(blink_collective_p, functools.partial(_lowering, platform=_platform),
                           platform=_platform, cacheable=False)
