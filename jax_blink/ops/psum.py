"""``psum``, ``pmean`` and ``explain``: drop-ins for ``jax.lax.psum`` / ``pmean``.

``psum`` packs a pytree into one value per dtype, asks
:func:`~jax_blink.ops.decide.decide` what each should do (the planned
collective, or ``lax.psum`` and why), records the decision for ``explain`` and
binds the primitive (:mod:`jax_blink.ops.primitive`).
"""

from __future__ import annotations

import collections

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from jax_blink import settings
from jax_blink.ops import decide as _decide
from jax_blink.ops.primitive import bind_collective

__all__ = ["psum", "pmean", "explain"]


def _axes_tuple(axis_name):
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


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
        preset name). Default: ``$JAX_BLINK_TOPOLOGY`` (a preset name or a
        topology JSON file), else on GPUs the detected allocation, else
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
    timeout_ms = settings.timeout_ms(timeout_s)
    arrays = []
    for leaf in leaves:
        a = jnp.asarray(leaf)
        if a.dtype == np.bool_:
            a = a.astype(np.int32)
        if np.dtype(a.dtype).name not in _decide.SUPPORTED_DTYPES:
            raise TypeError(
                f"jax_blink.psum does not support dtype {a.dtype}; supported dtypes are "
                f"{', '.join(_decide.SUPPORTED_DTYPES)} and bool. Use lax.psum for this value.")
        arrays.append(a)

    try:
        nranks = lax.axis_size(axes)
    except NameError as e:
        raise NameError(f"Found an unbound axis name in {axes}: {e}. jax_blink.psum is a "
                        "collective: call it under `jax.shard_map` (or `jax.pmap`) with "
                        "these axis names.") from None
    if not any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
        # Constants (Python numbers, numpy arrays) hold the same value on every
        # device: as lax.psum does, multiply by the number of devices (weak
        # types kept; no collective).
        _decide.record(f"psum over {axes}: constants, multiplied by {nranks} as lax.psum does")
        return treedef.unflatten([a * nranks for a in arrays])
    reason = _decide.environment_reason(axes)
    if reason is not None:
        _decide.record(f"psum over {axes}: lax.psum ({reason})")
        return treedef.unflatten(lax.psum(arrays, axes))

    rank = group = None
    out = list(arrays)
    by_type = collections.defaultdict(list)
    for i, a in enumerate(arrays):
        missing = tuple(ax for ax in axes if ax not in jax.typeof(a).manual_axis_type.varying)
        if missing:  # as lax.psum: a value not varying over an axis counts once per device
            a = lax.pcast(a, missing, to="varying")
        arrays[i] = a
        aval = jax.typeof(a)  # weak-typed leaves stay apart so that they stay weak, as in lax
        by_type[(a.dtype, aval.weak_type, aval.manual_axis_type.varying)].append(i)
    for (dtype, _, vma), idx in by_type.items():
        count = sum(arrays[i].size for i in idx)
        decision = _decide.decide(count, np.dtype(dtype).name, nranks, topology=topology,
                                  min_bytes=min_bytes, chunks=chunks)
        _decide.record(f"psum over {axes}: {decision.text}")
        if not decision.uses_blink:
            for i, r in zip(idx, lax.psum([arrays[i] for i in idx], axes)):
                out[i] = r
            continue
        if rank is None:
            rank = lax.axis_index(axes)
            mesh = jax.sharding.get_abstract_mesh()
            others = tuple(a for a in mesh.axis_names
                           if a in set(mesh.manual_axes) and a not in axes)
            group = lax.axis_index(others) if others else jnp.int32(0)
        flat = (arrays[idx[0]].reshape(-1) if len(idx) == 1
                else jnp.concatenate([arrays[i].reshape(-1) for i in idx]))
        summed = bind_collective(flat, rank, group, axes=axes, request=decision.request,
                                 schedule=decision.schedule, timeout_ms=timeout_ms,
                                 varying=set(axes) <= set(vma))
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


def explain(x=None, axis_size=None, *, topology=None, min_bytes=None, chunks=None):
    """Say which plan ``jax_blink.psum`` uses, or why it falls back.

    With no arguments, returns what the most recent psum traces decided
    (one line each). With ``x`` (an array or ``jax.ShapeDtypeStruct``: one
    device's value) and ``axis_size`` (devices reduced over), describes the
    decision for that call without running anything (the same decision
    psum makes; only the mesh and backend checks need a trace).

    Set ``JAX_BLINK_DEBUG=1`` to log every decision (and, in C++, every
    call) as it happens.
    """
    if x is None:
        return "\n".join(_decide.recent()) or "no jax_blink.psum has been traced yet"
    if axis_size is None:
        raise TypeError("explain(x, axis_size): give the number of devices reduced over")
    dtype = np.dtype(x.dtype)
    if dtype == np.bool_:
        dtype = np.dtype(np.int32)
    return _decide.decide(int(np.prod(x.shape)), dtype.name, axis_size, topology=topology,
                          min_bytes=min_bytes, chunks=chunks).text
