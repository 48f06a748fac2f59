"""``pvary``: mark replicated values as varying, with :func:`jax_blink.psum` as
the transpose.

Inside ``shard_map`` with ``check_vma=True``, using a replicated (invariant)
value in per-device (varying) arithmetic casts it to varying implicitly
(``lax.pcast(..., to="varying")``), and the transpose of that cast is JAX's
own psum: the gradients of replicated parameters are reduced by XLA, not by
jax_blink. ``jax_blink.pvary(params, "data")`` makes the cast explicit with a
transpose that is ``jax_blink.psum``: ``jax.grad`` then reduces the
gradients along Blink's trees, in buckets (``psum``'s ``bucket_bytes``) that
start while the backward pass still computes the others.
"""

from __future__ import annotations

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jax_blink.ops.axes import axes_tuple, axis_size

__all__ = ["pvary", "blink_pvary_p"]

blink_pvary_p = Primitive("blink_pvary")
blink_pvary_p.multiple_results = True


def pvary(x, axis_name, *, topology=None, min_bytes=None, timeout_s=None, chunks=None,
          bucket_bytes=None):
    """Cast ``x`` (a pytree of values replicated over ``axis_name``) to
    varying, like ``lax.pcast(x, axis_name, to="varying")``; its transpose is
    :func:`jax_blink.psum` with the given keywords (those of :func:`psum`).

    Use it on replicated parameters inside ``jax.shard_map`` so that
    ``jax.grad`` sums their gradients with jax_blink::

        def loss(params, batch):
            params = jax_blink.pvary(params, "data")
            ...
        grads = jax.grad(loss)(params, batch)  # invariant: summed over "data"

    The forward pass moves no data. With ``check_vma=False`` and in ``pmap``
    (where nothing is typed) the value is unchanged and the transpose still
    sums, as it does with ``check_vma=True``.

    Raises
    ------
    ValueError
        If a leaf is already varying over one of the axes (as ``lax.pcast``).
    """
    axes = axes_tuple(axis_name)
    leaves, treedef = jax.tree.flatten(x)
    if not leaves:
        return x
    axis_size(axes, "pvary")  # lax's error for an unbound axis name
    leaves = [jax.numpy.asarray(leaf) for leaf in leaves]
    for leaf in leaves:
        mat = jax.typeof(leaf).manual_axis_type
        if mat.varying & set(axes) or mat.unreduced & set(axes):
            raise ValueError(
                f"jax_blink.pvary: the value is already varying or unreduced over "
                f"{tuple(sorted(set(axes) & (mat.varying | mat.unreduced)))} "
                f"({jax.typeof(leaf).str_short(True)}); pvary casts replicated values")
    typed = bool(jax.config.check_vma)  # shard_map's check_vma of the current trace
    psum_kwargs = (("topology", topology), ("min_bytes", min_bytes), ("timeout_s", timeout_s),
                   ("chunks", chunks), ("bucket_bytes", bucket_bytes))
    out = blink_pvary_p.bind(*leaves, axes=axes, typed=typed, psum_kwargs=psum_kwargs)
    return treedef.unflatten(out)


def _abstract_eval(*avals, axes, typed, psum_kwargs):
    if not typed:
        return list(avals)
    return [a.update(manual_axis_type=a.manual_axis_type.update(
        varying=a.manual_axis_type.varying | set(axes))) for a in avals]


def _jvp(primals, tangents, **params):
    out = blink_pvary_p.bind(*primals, **params)
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return out, blink_pvary_p.bind(*tangents, **params)


def _transpose(cts, *args, axes, typed, psum_kwargs):
    from jax_blink.ops.psum import psum  # psum's module does not import this one

    live = [i for i, ct in enumerate(cts) if type(ct) is not ad.Zero]
    out = [ad.Zero(a.aval) if ad.is_undefined_primal(a) else None for a in args]
    if live:
        summed = psum([cts[i] for i in live], axes, **dict(psum_kwargs))
        for i, s in zip(live, summed):
            out[i] = s
    return out


def _batch(args, dims, **params):
    return blink_pvary_p.bind(*args, **params), list(dims)


blink_pvary_p.def_abstract_eval(_abstract_eval)
blink_pvary_p.def_impl(lambda *args, **params: list(args))
ad.primitive_jvps[blink_pvary_p] = _jvp
ad.primitive_transposes[blink_pvary_p] = _transpose
batching.primitive_batchers[blink_pvary_p] = _batch
mlir.register_lowering(blink_pvary_p, lambda ctx, *args, **params: list(args))
