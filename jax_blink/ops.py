"""``psum`` and ``pmean``: drop-ins for ``jax.lax.psum``/``pmean``.

This module holds the ``blink_psum`` primitive (abstract evaluation, jvp,
transpose, batching and lowering to the ``jax_blink_collective`` XLA FFI
custom call) and the user-facing functions that pack pytrees, choose between
the planned schedule and ``lax.psum``, and record why (:func:`explain`).

Planning happens here at trace time (cached by the planner), the schedule is
embedded in the compiled program as an attribute, and the C++ executor runs it.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import math
import os
import types

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jax_blink import _ffi
from jax_blink.plan import CUDA_LAUNCH_SECONDS, plan
from jax_blink.schedule import DTYPES, lower_trees
from jax_blink.topo import Topology, TopologyError

__all__ = ["psum", "pmean", "explain"]

logger = logging.getLogger("jax_blink")
if os.environ.get("JAX_BLINK_DEBUG", "") not in ("", "0"):
    logging.basicConfig()
    logger.setLevel(logging.DEBUG)

#: Default per-device size (bytes, per dtype group) below which psum calls
#: lax.psum. On 8 CPU devices jax_blink is faster at every size measured,
#: down to one element (benchmarks/bench_psum_cpu.py), so only empty values
#: fall back by default. Raise it to leave many tiny psums to XLA, which can
#: combine them into one all-reduce.
DEFAULT_MIN_BYTES = 0
DEFAULT_TIMEOUT_S = 60.0

_SUPPORTED = tuple(DTYPES)
_DECISIONS = collections.deque(maxlen=64)
_TOPOLOGIES: dict = {}  # fingerprint -> Topology (primitive params must be hashable)
_op_ids = itertools.count(1)


# --------------------------------------------------------------- settings
def _min_bytes(value):
    if value is not None:
        return int(value)
    env = os.environ.get("JAX_BLINK_MIN_BYTES")
    if env is None:
        return DEFAULT_MIN_BYTES
    try:
        return int(float(env))
    except ValueError:
        raise ValueError(f"JAX_BLINK_MIN_BYTES={env!r} is not a number of bytes") from None


def _timeout_ms(value):
    if value is None:
        env = os.environ.get("JAX_BLINK_TIMEOUT_S")
        try:
            value = DEFAULT_TIMEOUT_S if env is None else float(env)
        except ValueError:
            raise ValueError(f"JAX_BLINK_TIMEOUT_S={env!r} is not a number of seconds") from None
    if not value > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {value}")
    return int(math.ceil(value * 1000))


@functools.lru_cache(maxsize=8)
def _detected_allocation(nranks):
    """``(topology, None)`` of this process's GPUs in ``jax.local_devices()``
    order (rank i = local GPU i, as in a mesh over ``jax.devices()``), or
    ``(None, why not)``."""
    from jax_blink.topo.detect import detect_allocation  # runs nvidia-smi once

    gpus = [d for d in jax.local_devices() if d.platform == "gpu"]
    if len(gpus) != nranks:
        return None, (f"the reduced axes have {nranks} devices but this process has "
                      f"{len(gpus)} GPUs, so which GPU is which rank is unknown")
    ordinals = [d.local_hardware_id for d in gpus]
    try:
        topo = detect_allocation(ordinals, bus_ids=_ffi.cuda_pci_bus_ids(ordinals),
                                 visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
    except TopologyError as e:
        return None, f"the GPU topology could not be detected: {e}"
    if topo is None:
        return None, "nvidia-smi is not available"
    return topo, None


def _topology(value, nranks):
    if value is None:
        path = os.environ.get("JAX_BLINK_TOPOLOGY")
        if path:
            value = Topology.from_json(path)
        elif jax.default_backend() == "gpu":
            value, why = _detected_allocation(nranks)
            if value is None:
                value = Topology.preset(f"shm:{nranks}")
                _record(f"topology: shm:{nranks} ({why}; pass topology= or set "
                        "JAX_BLINK_TOPOLOGY)")
        else:
            value = Topology.preset(f"shm:{nranks}")
    elif isinstance(value, str):
        value = Topology.preset(value)
    if value.n != nranks:
        raise ValueError(
            f"topology {value.name!r} has {value.n} ranks but the reduced axes have {nranks} "
            f"devices; pass a topology of {nranks} ranks (e.g. topology.subset([...]))")
    key = value.fingerprint()
    _TOPOLOGIES.setdefault(key, value)
    return key


def _chunks(value):
    if value is None:
        env = os.environ.get("JAX_BLINK_CHUNKS")
        if not env:
            return None
        try:
            value = int(env)
        except ValueError:
            raise ValueError(f"JAX_BLINK_CHUNKS={env!r} is not a whole number of chunks") from None
    if int(value) < 1:
        raise ValueError(f"chunks must be >= 1 per tree, got {value}")
    return int(value)


def _launch_s(platform):
    """Host cost per pipeline step of the platform's executor (the chunk model's
    launch term): CUDA API calls on GPUs; nothing extra on CPU."""
    return CUDA_LAUNCH_SECONDS if platform in ("cuda", "gpu") else 0.0


@functools.lru_cache(maxsize=256)
def _plan_and_schedule(topology_key, count, dtype, chunks, launch_s=0.0):
    """The plan and the encoded schedule for ``count`` elements (cached).

    One rank needs no plan (None): its schedule has no steps and the custom
    call copies the input. psum itself leaves single devices to lax.psum;
    tests bind the primitive directly to check the handler on one device.
    """
    topology = _TOPOLOGIES[topology_key]
    if topology.n == 1:
        alone = types.SimpleNamespace(root=0, edges=(), weight=1.0)
        schedule = lower_trees([alone], nranks=1, collective="allreduce", count=count,
                               dtype=dtype)
        return None, schedule, schedule.encode()
    p = plan(topology, "allreduce")
    schedule = p.lower(count * DTYPES[dtype][1], dtype, chunks=chunks, launch_s=launch_s)
    return p, schedule, schedule.encode()


# -------------------------------------------------------------- primitive
blink_psum_p = Primitive("blink_psum")


def _abstract_eval(x, rank, group, *, axes, topology, chunks, timeout_ms, varying):
    mat = x.manual_axis_type
    if mat.varying & set(axes):
        return x.update(manual_axis_type=mat.update(varying=mat.varying - set(axes)))
    return x


def _impl(*args, **params):
    raise RuntimeError(
        "jax_blink.psum is a collective: call it inside jax.shard_map or jax.pmap")


def _jvp(primals, tangents, **params):
    x, rank, group = primals
    out = blink_psum_p.bind(x, rank, group, **params)
    tx = tangents[0]
    if type(tx) is ad.Zero:
        return out, ad.Zero.from_primal_value(out)
    return out, blink_psum_p.bind(tx, rank, group, **params)


def _transpose(ct, x, rank, group, *, axes, varying, **params):
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval), None, None]
    if varying:
        # check_vma=True: the result is invariant over `axes`, so the
        # cotangent of each rank's input is the (invariant) cotangent itself.
        return [lax.pcast(ct, axes, to="varying"), None, None]
    # check_vma=False and pmap: psum's transpose is psum, as for lax.psum.
    return [blink_psum_p.bind(ct, rank, group, axes=axes, varying=varying, **params), None, None]


def _batch(args, dims, **params):
    x, rank, group = args
    bx, brank, bgroup = dims
    if brank is not None or bgroup is not None:  # None: not mapped
        raise NotImplementedError("jax_blink.psum: rank and group cannot be batched")
    x = jnp.moveaxis(x, bx, 0)
    out = blink_psum_p.bind(x.reshape(-1), rank, group, **params)
    return out.reshape(x.shape), 0


_ffi_rule = jax.ffi.ffi_lowering(_ffi.TARGET)


def _lowering(ctx, x, rank, group, *, platform, axes, topology, chunks, timeout_ms, varying):
    _ffi.ensure_registered(platform)
    aval = ctx.avals_in[0]
    _, _, encoded = _plan_and_schedule(topology, int(np.prod(aval.shape)),
                                       np.dtype(aval.dtype).name, chunks, _launch_s(platform))
    # one id per call site in the module; a call site inside a loop is told
    # apart by the executor's per-rank generation counter
    return _ffi_rule(ctx, x, rank, group, schedule=encoded, op_id=np.int64(next(_op_ids)),
                     timeout_ms=np.int64(timeout_ms))


blink_psum_p.def_abstract_eval(_abstract_eval)
blink_psum_p.def_impl(_impl)
ad.primitive_jvps[blink_psum_p] = _jvp
ad.primitive_transposes[blink_psum_p] = _transpose
batching.primitive_batchers[blink_psum_p] = _batch
for _platform in ("cpu", "cuda"):
    mlir.register_lowering(blink_psum_p, functools.partial(_lowering, platform=_platform),
                           platform=_platform)


# ---------------------------------------------------------- user functions
def _axes_tuple(axis_name):
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _record(text):
    _DECISIONS.append(text)
    logger.debug(text)


def _fallback_reason(axes):
    """Why these axes cannot use the custom call here, or None."""
    mesh = jax.sharding.get_abstract_mesh()
    manual = set(getattr(mesh, "manual_axes", ()) or ())
    for ax in axes:
        if ax not in manual:
            return f"axis {ax!r} is not a manual device axis of shard_map/pmap (a vmap axis?)"
    backend = jax.default_backend()
    if backend == "cpu":
        return None
    if backend == "gpu" and "rocm" not in jax.devices()[0].client.platform_version.lower():
        if not _ffi.has_cuda_support():
            return ("this build of jax_blink has no CUDA executor (nvcc was not found when it "
                    "was built; docs/building.md)")
        if not _ffi.cuda_enabled():
            return "JAX_BLINK_CUDA=0 keeps psum off the CUDA executor"
        return None
    return f"no jax_blink executor for backend {backend!r}"


def psum(x, axis_name, *, axis_index_groups=None, topology=None, min_bytes=None,
         timeout_s=None, chunks=None):
    """Sum ``x`` over the devices of ``axis_name``; a drop-in for ``lax.psum``.

    Runs a topology-planned, pipelined tree allreduce through a C++ XLA
    custom call. Call it inside ``jax.shard_map`` or ``jax.pmap``, under jit,
    grad, jvp, vmap and scan, exactly like ``lax.psum``.

    Parameters
    ----------
    x : pytree of arrays
        Leaves of one dtype are packed into one collective. Supported dtypes:
        float32, float64, float16, bfloat16, int32, int64, uint32, and bool
        (summed as int32, as ``lax.psum`` does).
    axis_name : hashable or tuple of hashables
        The mesh axis (or axes) to reduce over.
    axis_index_groups : None
        Not supported; raises NotImplementedError.
    topology : Topology, str or None
        The link topology of the reduced devices (a :class:`Topology` or a
        preset name). Default: ``$JAX_BLINK_TOPOLOGY`` (a JSON file), else
        ``shm:N`` (devices sharing host memory).
    min_bytes : int or None
        Per-device bytes (per dtype) below which ``lax.psum`` is used.
        Default: ``$JAX_BLINK_MIN_BYTES``, else 0 (only empty values).
    timeout_s : float or None
        How long a device waits for its peers before failing with an error
        naming the ranks that never arrived. Default: ``$JAX_BLINK_TIMEOUT_S``,
        else 60.
    chunks : int or None
        Pipeline chunks per tree, overriding the planner's alpha-beta model.
        Default: ``$JAX_BLINK_CHUNKS``, else the model's choice.

    Returns
    -------
    pytree
        Like ``lax.psum``: same structure, invariant over ``axis_name``.
    """
    if axis_index_groups is not None:
        raise NotImplementedError(
            "jax_blink.psum does not support axis_index_groups; use a mesh axis per group "
            "(jax.shard_map over a 2-D mesh) or lax.psum")
    axes = _axes_tuple(axis_name)
    leaves, treedef = jax.tree.flatten(x)
    if not leaves:
        return x
    threshold = _min_bytes(min_bytes)
    timeout_ms = _timeout_ms(timeout_s)
    chunks = _chunks(chunks)
    arrays = []
    for leaf in leaves:
        a = jnp.asarray(leaf)
        if a.dtype == np.bool_:
            a = a.astype(np.int32)
        if np.dtype(a.dtype).name not in _SUPPORTED:
            raise TypeError(
                f"jax_blink.psum does not support dtype {a.dtype}; supported dtypes are "
                f"{', '.join(_SUPPORTED)} and bool. Use lax.psum for this value.")
        arrays.append(a)

    reason = _fallback_reason(axes)
    nranks = lax.axis_size(axes)
    if reason is None and nranks == 1:
        reason = "the reduced axes have a single device"
    if reason is not None:
        _record(f"psum over {axes}: lax.psum ({reason})")
        return treedef.unflatten(lax.psum(arrays, axes))

    topo_key = _topology(topology, nranks)
    rank = lax.axis_index(axes)
    mesh = jax.sharding.get_abstract_mesh()
    others = tuple(a for a in mesh.axis_names if a in set(mesh.manual_axes) and a not in axes)
    group = lax.axis_index(others) if others else jnp.int32(0)

    out = list(arrays)
    by_type = collections.defaultdict(list)
    for i, a in enumerate(arrays):
        missing = tuple(ax for ax in axes if ax not in jax.typeof(a).manual_axis_type.varying)
        if missing:  # as lax.psum: a value not varying over an axis counts once per device
            a = lax.pcast(a, missing, to="varying")
        arrays[i] = a
        by_type[(a.dtype, jax.typeof(a).manual_axis_type.varying)].append(i)
    for (dtype, vma), idx in by_type.items():
        count = sum(arrays[i].size for i in idx)
        nbytes = count * np.dtype(dtype).itemsize
        if count == 0 or nbytes < threshold:
            _record(f"psum over {axes}: {dtype} x {count}: lax.psum "
                    f"({nbytes} B per device < min_bytes {threshold})")
            for i, r in zip(idx, lax.psum([arrays[i] for i in idx], axes)):
                out[i] = r
            continue
        p, schedule, _ = _plan_and_schedule(topo_key, count, np.dtype(dtype).name, chunks,
                                            _launch_s(jax.default_backend()))
        _record(f"psum over {axes}: {dtype} x {count} ({nbytes} B per device): "
                f"{_describe(p, schedule)}")
        flat = (arrays[idx[0]].reshape(-1) if len(idx) == 1
                else jnp.concatenate([arrays[i].reshape(-1) for i in idx]))
        varying = set(axes) <= set(vma)
        summed = blink_psum_p.bind(flat, rank, group, axes=axes, topology=topo_key,
                                   chunks=chunks, timeout_ms=timeout_ms, varying=varying)
        offset = 0
        for i in idx:
            n = arrays[i].size
            out[i] = summed[offset:offset + n].reshape(arrays[i].shape)
            offset += n
    return treedef.unflatten(out)


def pmean(x, axis_name, **kwargs):
    """Mean of ``x`` over ``axis_name``; a drop-in for ``lax.pmean``.

    Takes the same keyword arguments as :func:`psum`.
    """
    n = lax.axis_size(_axes_tuple(axis_name))
    return jax.tree.map(lambda v: v / n, psum(x, axis_name, **kwargs))


def _describe(p, schedule):
    used = (f"{len(p.trees)} tree(s)" if schedule.ntrees == len(p.trees)
            else f"{schedule.ntrees} of {len(p.trees)} trees (the value is too small for more)")
    return (f"{p.family} plan on {p.topology.name}: {used}, "
            f"rate {p.rate_gbps:.3g} GB/s (bound {p.bound_gbps:.3g}, ring {p.ring_rate_gbps:.3g}), "
            f"{len(schedule.chunks)} chunk(s), {schedule.num_steps} steps")


def explain(x=None, axis_size=None, *, topology=None, min_bytes=None, chunks=None):
    """Say which plan ``jax_blink.psum`` uses, or why it falls back.

    With no arguments, returns what the most recent psum traces decided
    (one line each). With ``x`` (an array or ``jax.ShapeDtypeStruct``: one
    device's value) and ``axis_size`` (devices reduced over), describes the
    decision for that call without running anything.

    Set ``JAX_BLINK_DEBUG=1`` to log every decision (and, in C++, every
    call) as it happens.
    """
    if x is None:
        return "\n".join(_DECISIONS) or "no jax_blink.psum has been traced yet"
    if axis_size is None:
        raise TypeError("explain(x, axis_size): give the number of devices reduced over")
    dtype = np.dtype(x.dtype)
    if dtype == np.bool_:
        dtype = np.dtype(np.int32)
    if dtype.name not in _SUPPORTED:
        return f"unsupported dtype {dtype.name}: jax_blink.psum raises TypeError"
    count = int(np.prod(x.shape))
    nbytes = count * dtype.itemsize
    threshold = _min_bytes(min_bytes)
    if axis_size == 1:
        return "lax.psum (the reduced axes have a single device)"
    if count == 0 or nbytes < threshold:
        return f"lax.psum ({nbytes} B per device < min_bytes {threshold}, or empty)"
    p, schedule, _ = _plan_and_schedule(_topology(topology, axis_size), count, dtype.name,
                                        _chunks(chunks), _launch_s(jax.default_backend()))
    return _describe(p, schedule)
