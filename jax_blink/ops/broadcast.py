"""``broadcast``: every device gets the root's value, along Blink's broadcast trees."""

from __future__ import annotations

import numbers

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from jax_blink.ops import hierarchical
from jax_blink.ops.axes import axes_tuple, axis_size
from jax_blink.ops.collective import run

__all__ = ["broadcast"]

_LAX_PSUM = lax.psum  # as imported (not a drop-in a user swapped into jax.lax)


def broadcast(x, axis_name, *, root=0, topology=None, min_bytes=None, timeout_s=None,
              chunks=None):
    """Every device of ``axis_name`` gets the value ``x`` has on device ``root``.

    Runs the planner's broadcast trees from ``root`` (arborescences packed to
    the root's max-flow bound, Edmonds) through the custom call. lax has no
    broadcast collective; its equivalent is
    ``lax.psum(jnp.where(lax.axis_index(axis_name) == root, x, 0), axis_name)``,
    which moves the data of an allreduce. Over devices of several processes
    (the layouts of :func:`psum`) it is that equivalent with jax_blink's
    hierarchical allreduce: the root's value exactly (NaN and inf included),
    except that a -0.0 arrives as 0.0, as from the lax equivalent.

    Parameters
    ----------
    x : pytree of arrays
        The dtypes of :func:`psum` (bool and the small integer types keep
        their dtype).
    axis_name : hashable or tuple of hashables
        The mesh axis (or axes; the root is then a linear index over them,
        row-major).
    root : int
        The device (index along ``axis_name``) whose value everyone gets.
    topology, min_bytes, timeout_s, chunks
        As in :func:`psum`.

    Returns
    -------
    pytree
        The root's ``x`` on every device, invariant over ``axis_name``. Its
        transpose gives the root the sum of the cotangents (a reduce to the
        root along the same trees without ``check_vma``) and the others zeros.
    """
    axes = axes_tuple(axis_name)
    leaves, treedef = jax.tree.flatten(x)
    if not leaves:
        return x
    n = axis_size(axes, "broadcast")
    if isinstance(root, bool) or not isinstance(root, (numbers.Integral, np.integer)) \
            or not 0 <= root < n:
        raise ValueError(f"jax_blink.broadcast: root must be a device index in 0..{n - 1} along "
                         f"{axes}, got {root!r}")
    root = int(root)

    def masked(blocks):
        mine = lax.axis_index(axes) == root
        return [jnp.where(mine, b, jnp.zeros_like(b)) for b in blocks]

    def fallback(blocks, mode):
        return _LAX_PSUM(masked(blocks), axes)

    shapes = [np.shape(leaf) for leaf in leaves]
    blocks = [jnp.reshape(leaf, (1, -1)) for leaf in leaves]
    keywords = dict(topology=topology, min_bytes=min_bytes, timeout_s=timeout_s, chunks=chunks)
    span = hierarchical.path("broadcast", axes, None, leaves, "lax.psum of the root's value",
                             topology=topology, chunks=chunks)
    if isinstance(span, str):
        return treedef.unflatten([o.reshape(s) for o, s in zip(fallback(blocks, None), shapes)])
    if span is not None:  # across processes: the hierarchical allreduce of the root's value
        out = hierarchical.allreduce(masked(blocks), axes, span, name="broadcast", op="sum", **keywords)
        out = [o.astype(b.dtype) for o, b in zip(out, blocks)]
    else:
        out = run(blocks, axes, name="broadcast", collective="broadcast", root=root, fallback=fallback,
                  **keywords)
    return treedef.unflatten([o.reshape(s) for o, s in zip(out, shapes)])
