"""``psum_scatter`` and ``all_gather``: drop-ins for the lax collectives, along
the planner's reduce-scatter and all-gather trees (one tree family per root:
rank r's shard is reduced into, or delivered from, rank r)."""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from jax_blink.choice import log
from jax_blink.ops import hierarchical
from jax_blink.ops.axes import axes_tuple, axis_size, canonical_groups
from jax_blink.ops.collective import run

__all__ = ["psum_scatter", "all_gather"]

# the lax collectives, as imported (the fallbacks must not call a drop-in
# that a user swapped into jax.lax)
_LAX_PSUM_SCATTER, _LAX_ALL_GATHER = lax.psum_scatter, lax.all_gather


def _group_size(axes, axis_index_groups, name):
    """Devices per group: the axes' size, or the size of the (equal) groups."""
    n = axis_size(axes, name)
    groups = canonical_groups(axis_index_groups, n, name)
    return len(groups[0]) if groups else n


def _dimension(d, ndim, name, what):
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or not -ndim <= d < ndim:
        raise ValueError(f"jax_blink.{name}: {what} {d!r} is out of range for a value of rank "
                         f"{ndim}")
    return int(d) % ndim


def psum_scatter(x, axis_name, *, scatter_dimension=0, axis_index_groups=None, tiled=False,
                 topology=None, min_bytes=None, timeout_s=None, chunks=None):
    """Sum ``x`` over ``axis_name`` and give device ``i`` the ``i``-th block of
    the sum along ``scatter_dimension``; a drop-in for ``lax.psum_scatter``.

    With ``tiled=False`` the scattered dimension must have the axis' size and
    is removed; with ``tiled=True`` it must be a multiple of it and shrinks by
    that factor. Keywords after ``tiled`` are those of :func:`psum`. The
    transpose is :func:`all_gather`, as in lax.
    """
    axes = axes_tuple(axis_name)
    leaves, treedef = jax.tree.flatten(x)
    if not leaves:
        return x
    size = _group_size(axes, axis_index_groups, "psum_scatter")
    blocks, shapes = [], []
    for leaf in leaves:
        leaf = jnp.asarray(leaf)
        d = _dimension(scatter_dimension, leaf.ndim, "psum_scatter", "scatter_dimension")
        length = leaf.shape[d]
        if (length % size if tiled else length != size):
            raise ValueError(
                f"jax_blink.psum_scatter: dimension {d} of a value of shape {leaf.shape} must "
                + ("be a multiple of" if tiled else "equal") + f" the number of devices ({size})")
        moved = jnp.moveaxis(leaf, d, 0)
        rest = moved.shape[1:]
        shapes.append(((length // size,) + rest if tiled else rest, d, tiled))
        blocks.append(moved.reshape(size, -1))

    def fallback(bs, mode):
        return [_LAX_PSUM_SCATTER(b, axes, scatter_dimension=0, axis_index_groups=axis_index_groups,
                                 tiled=False).reshape(1, -1) for b in bs]

    keywords = dict(topology=topology, min_bytes=min_bytes, timeout_s=timeout_s, chunks=chunks)
    span = hierarchical.path("psum_scatter", axes, axis_index_groups, leaves, "lax.psum_scatter",
                             collective="reduce_scatter")
    if isinstance(span, str):
        out = fallback(blocks, "untyped")
    elif span is not None:
        out = hierarchical.reduce_scatter(blocks, axes, span, name="psum_scatter", **keywords)
    else:
        out = run(blocks, axes, name="psum_scatter", collective="reduce_scatter",
                  axis_index_groups=axis_index_groups, fallback=fallback, unreduced_op="sum",
                  **keywords)
    results = []
    for o, (shape, d, was_tiled) in zip(out, shapes):
        o = o.reshape(shape)
        results.append(jnp.moveaxis(o, 0, d) if was_tiled else o)
    return treedef.unflatten(results)


def all_gather(x, axis_name, *, axis_index_groups=None, axis=0, tiled=False, to="varying",
               topology=None, min_bytes=None, timeout_s=None, chunks=None):
    """Every device gets every device's ``x``, stacked along ``axis`` (or, with
    ``tiled=True``, concatenated along it); a drop-in for ``lax.all_gather``.

    ``to`` is lax's: ``"varying"`` (the result stays varying over the axes)
    and ``"invarying"`` (typed invariant, as lax's all_gather_invariant; its
    transpose takes each device's block of the cotangent) run jax_blink's
    all-gather; ``"reduced"`` (a typed replicated result) is left to
    ``lax.all_gather``, and ``explain()`` says so. Keywords after ``to`` are
    those of :func:`psum`. The transpose of ``to="varying"`` is
    :func:`psum_scatter`, as in lax.
    """
    axes = axes_tuple(axis_name)
    if to not in ("varying", "invarying") or (to == "invarying" and axis_index_groups is not None):
        # lax's: a typed replicated result, or its errors for an unknown `to`
        # and for grouped invariant gathers
        axis_size(axes, "all_gather")
        log.record(f"all_gather over {axes}: lax.all_gather (to={to!r}: jax_blink gathers "
                       "to='varying' and to='invarying' without groups)")
        return _LAX_ALL_GATHER(x, axis_name, axis_index_groups=axis_index_groups, axis=axis,
                              tiled=tiled, to=to)
    leaves, treedef = jax.tree.flatten(x)
    if not leaves:
        return x
    size = _group_size(axes, axis_index_groups, "all_gather")
    blocks, shapes = [], []
    for leaf in leaves:
        leaf = jnp.asarray(leaf)
        if tiled and leaf.ndim == 0:
            raise ValueError("jax_blink.all_gather: tiled=True needs a value of rank >= 1 "
                             "(as lax.all_gather)")
        a = _dimension(axis, leaf.ndim if tiled else leaf.ndim + 1, "all_gather", "axis")
        shapes.append((leaf.shape, a))
        blocks.append(leaf.reshape(1, -1))

    def fallback(bs, mode):
        return [_LAX_ALL_GATHER(b[0], axes, axis_index_groups=axis_index_groups, axis=0,
                               tiled=False, to=to) for b in bs]

    keywords = dict(topology=topology, min_bytes=min_bytes, timeout_s=timeout_s, chunks=chunks)
    # an invariant gather across processes is left to run(), which gives it to lax
    span = (hierarchical.path("all_gather", axes, axis_index_groups, leaves, "lax.all_gather",
                              collective="allgather") if to == "varying" else None)
    if isinstance(span, str):
        out = fallback(blocks, "untyped")
    elif span is not None:
        out = hierarchical.all_gather(blocks, axes, span, name="all_gather", **keywords)
    else:
        out = run(blocks, axes, name="all_gather", collective="allgather",
                  axis_index_groups=axis_index_groups, fallback=fallback,
                  invariant=to == "invarying", **keywords)
    results = []
    for o, (shape, a) in zip(out, shapes):
        o = jnp.moveaxis(o.reshape((size,) + shape), 0, a)
        if tiled:
            o = o.reshape(shape[:a] + (size * shape[a],) + shape[a + 1:])
        results.append(o)
    return treedef.unflatten(results)
