"""The README's and the docstrings' claims about results, each checked on 8 CPU devices
against lax (issue 30, item 5)."""

import numpy as np
import pytest

import jax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_blink

N = 8


def both(op, column):
    """``(jax_blink's, lax's)`` result of ``op`` over one float32 value per device."""
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:N]), ("i",))
    x = np.asarray(column, np.float32).reshape(N, 1)

    def run(fn):
        f = jax.jit(jax.shard_map(lambda v: fn(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                                  check_vma=False))
        return np.asarray(f(jax.device_put(x, NamedSharding(mesh, P("i")))))[0, 0]

    return run(getattr(jax_blink, op)), run(getattr(lax, op))


def bits(v):
    return np.float32(v).view(np.uint32)


@pytest.mark.parametrize("op", ["pmax", "pmin"])
def test_a_nan_never_wins_and_an_all_nan_column_is_an_infinity(op):
    ours, ref = both(op, [np.nan] + [1.0] * 7)
    assert ours == ref == 1.0
    ours, ref = both(op, [np.nan] * 8)
    want = -np.inf if op == "pmax" else np.inf
    assert ours == ref == want


@pytest.mark.parametrize("op, column, ours_want, lax_want", [
    ("pmin", [-1e-40] + [1.0] * 7, -1e-40, -0.0),  # a denormal wins: lax flushes it to -0
    ("pmax", [1e-40] + [-1.0] * 7, 1e-40, 0.0),
    ("pmax", [1e-40] * 8, 0.0, 0.0),  # every device holds the same denormal: both +0
    ("pmin", [1e-40] * 8, 0.0, 0.0),
])
def test_denormals_as_the_sharp_bits_say(op, column, ours_want, lax_want):
    ours, ref = both(op, column)
    assert bits(ours) == bits(ours_want) and bits(ref) == bits(lax_want)


@pytest.mark.parametrize("column", [[0.0, -0.0] * 4, [-0.0, 0.0] * 4])
def test_zeros_of_both_signs_are_plus_zero_for_max_and_minus_zero_for_min(column):
    """lax keeps the lowest device's zero; jax_blink gives +0 (max) and -0 (min)."""
    for op, want in (("pmax", 0.0), ("pmin", -0.0)):
        ours, ref = both(op, column)
        assert bits(ours) == bits(want)
        assert bits(ref) == bits(column[0])
