"""What every op needs to know about the axes it runs over: their size, how a
value is typed over them, and the rank and group operands of the custom call.

Shared by :mod:`~jax_blink.ops.psum`, :mod:`~jax_blink.ops.scatter_gather`,
:mod:`~jax_blink.ops.broadcast` and :mod:`~jax_blink.ops.pvary`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["axes_tuple", "axis_size", "typed", "unreduced_kind", "check_unreduced_kind",
           "rank_and_group", "canonical_groups"]


def axes_tuple(axis_name) -> tuple:
    """``axis_name`` as a tuple of names; a name given twice is lax's ValueError."""
    axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    if len(set(axes)) != len(axes):
        raise ValueError(f"repeated axis in `source` argument: {axes} (jax_blink, as lax, "
                         "reduces over each axis once)")
    return axes


def axis_size(axes: tuple, name: str) -> int:
    """The number of devices over ``axes``, or lax's error for an unbound name."""
    size = 1
    for ax in axes:
        try:
            size *= lax.axis_size(ax)
        except NameError:
            raise NameError(f"Found an unbound axis name: {ax}. To fix this, please call {name} "
                            f"under `jax.shard_map` (or `jax.pmap`): jax_blink.{name} is a "
                            "collective over these axis names, as lax's is.") from None
    return size


def typed(a, axes: tuple, name: str, *, unreduced_op=None):
    """``(value, mode)``: the value as the primitive takes it and its typing mode
    (:data:`~jax_blink.ops.primitive.MODES`).

    As lax's collectives do, a value that is neither varying nor unreduced over
    ``axes`` (invariant or reduced) is cast to varying first, so that it counts
    once per device. A value must be in one state over all of ``axes``.
    ``unreduced_op``: the reduction ("sum", "max", "min") the collective applies
    to a value unreduced over ``axes``, or None where it takes none (as lax);
    see :func:`check_unreduced_kind`.
    """
    mat = jax.typeof(a).manual_axis_type
    unreduced = [ax for ax in axes if ax in mat.unreduced]
    if unreduced:
        if len(unreduced) != len(axes):
            raise ValueError(
                f"jax_blink.{name}: the value is unreduced over {tuple(unreduced)} but not over "
                f"all of {axes} ({jax.typeof(a).str_short(True)}); reduce over one state at a time, "
                "as lax does")
        check_unreduced_kind(mat, axes, name, unreduced_op)
        return a, "unreduced"
    missing = tuple(ax for ax in axes if ax not in mat.varying)
    if missing:
        a = lax.pcast(a, missing, to="varying")  # a no-op without check_vma
    varying = set(axes) <= set(jax.typeof(a).manual_axis_type.varying)
    return a, "varying" if varying else "untyped"


def unreduced_kind(mat) -> str:
    """How a value typed ``mat`` (a manual axis type) is unreduced: "sum", "max" or
    "min". jax >= 0.11 says so (``mat.unreduced_kind``, a
    ``jax.sharding.UnreducedKind``); before it, every unreduced value was a
    partial sum (the type has no such attribute)."""
    kind = getattr(mat, "unreduced_kind", None)
    return "sum" if kind is None else kind.name


def check_unreduced_kind(mat, axes: tuple, name: str, op) -> None:
    """Raises, as lax does, where a collective that reduces by ``op`` (None: one
    that takes no unreduced value) is given a value unreduced over ``axes`` in
    another way (``lax.psum`` of a value unreduced by max, on jax >= 0.11)."""
    kind = unreduced_kind(mat)
    if op is None:
        raise ValueError(f"jax_blink.{name} does not accept a value unreduced over {axes} "
                         f"(a partial {kind}; neither does lax); reduce it first with "
                         f"jax_blink.p{kind}")
    if kind != op:
        raise ValueError(
            f"jax_blink.{name} cannot accept a value unreduced over {axes} by {kind} (a "
            f"partial {kind}): it reduces values unreduced by {op}, as lax's unreduced_p{op} "
            f"does; reduce it with jax_blink.p{kind}")


def canonical_groups(axis_index_groups, n: int, name: str, equal_sizes: bool = True):
    """``axis_index_groups`` as a tuple of tuples, checked as lax checks them:
    every index of ``range(n)`` exactly once, and (``equal_sizes``: all but
    the allreduces) groups of one size."""
    if axis_index_groups is None:
        return None
    try:
        groups = tuple(tuple(g) for g in axis_index_groups)
    except TypeError:
        raise TypeError(f"jax_blink.{name}: axis_index_groups must be a list of lists of axis "
                        f"indices, got {axis_index_groups!r:.80}") from None
    if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for g in groups for i in g):
        # lax: "axis_index_groups must cover all indices exactly once" (0.5 or "0" are no index)
        raise ValueError(f"jax_blink.{name}: axis_index_groups must cover all indices exactly once; "
                         f"they must be lists of integer axis indices, got {axis_index_groups!r:.80}")
    groups = tuple(tuple(int(i) for i in g) for g in groups)
    if not groups or (equal_sizes and len({len(g) for g in groups}) != 1):
        raise ValueError(f"jax_blink.{name}: axis_index_groups must all have the same size, got "
                         f"{[len(g) for g in groups]}")
    flat = sorted(i for g in groups for i in g)
    if flat != list(range(n)):
        raise ValueError(f"jax_blink.{name}: axis_index_groups must cover all indices exactly once: "
                         f"{[list(g) for g in groups]} must hold every index 0..{n - 1} of the axis "
                         "once")
    return groups


def _linear_index(axes):
    """The device's linear index over ``axes`` (row-major), without the
    constant casts ``lax.axis_index`` of a tuple emits."""
    index = lax.axis_index(axes[0])
    for ax in axes[1:]:
        index = index * lax.axis_size(ax) + lax.axis_index(ax)
    return index


def rank_and_group(axes: tuple, groups=None):
    """The int32 operands: rank = position among the reduced devices (within
    its group, with ``groups``); group = which group of devices runs the same
    collective: the linear index over the other manual axes, times the number
    of ``groups``, plus the device's group."""
    mesh = jax.sharding.get_abstract_mesh()
    manual = set(mesh.manual_axes)
    others = tuple(a for a in mesh.axis_names if a in manual and a not in axes)
    rank = _linear_index(axes)
    group = _linear_index(others) if others else None
    if groups is not None:
        size = len(groups)
        position = np.zeros(sum(len(g) for g in groups), np.int32)
        which = np.zeros_like(position)
        for k, g in enumerate(groups):
            for i, idx in enumerate(g):
                position[idx], which[idx] = i, k
        index = rank
        rank = jnp.asarray(position)[index]
        group = jnp.asarray(which)[index] if group is None else group * size + jnp.asarray(which)[index]
    return rank, jnp.int32(0) if group is None else group
