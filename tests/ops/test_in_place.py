"""On CPU an allreduce or broadcast runs in place (its output aliases its input) where its
input is computed in the same function, and out of place where the input is the function's
argument, which XLA would otherwise copy first (ops/primitive.py): the lowering says which,
and the caller's array is never changed."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_blink

N = 8


@pytest.fixture(autouse=True)
def run_the_plan(monkeypatch):
    monkeypatch.setenv("JAX_BLINK_ALGO", "blink")  # small values: not lax.psum by the CPU model


def mesh():
    return jax.sharding.Mesh(np.asarray(jax.devices()[:N]), ("d",))


def lowered(body, x):
    f = jax.jit(jax.shard_map(body, mesh=mesh(), in_specs=P("d"), out_specs=P("d")))
    return f, f.lower(x).as_text()


def aliased(text):
    calls = [line for line in text.splitlines() if "stablehlo.custom_call" in line and "jax_blink" in line]
    assert calls, "no jax_blink custom call in the lowering"
    return ["output_operand_aliases" in c for c in calls]


@pytest.mark.parametrize("body, in_place", [
    (lambda v: jax_blink.psum(v, "d"), False),                      # the argument itself
    (lambda v: jax_blink.psum(v.reshape(-1, 4), "d").reshape(v.shape), False),  # through a reshape
    (lambda v: jax_blink.psum(v * 2.0, "d"), True),                 # computed here
    (lambda v: jax_blink.pmax(v + 1.0, "d"), True),
    (lambda v: jax_blink.broadcast(v, "d", root=3), False),
    (lambda v: jax_blink.broadcast(jnp.sin(v), "d", root=3), True),
])
def test_in_place_only_for_values_computed_here(body, in_place):
    x = jax.device_put(jnp.arange(N * 64, dtype=jnp.float32).reshape(N, 64) % 5,
                       NamedSharding(mesh(), P("d")))
    before = np.asarray(x)
    f, text = lowered(body, x)
    assert aliased(text) == [in_place]
    reference = jax.jit(jax.shard_map(
        _lax_body(body), mesh=mesh(), in_specs=P("d"), out_specs=P("d")))
    np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(reference(x)))
    np.testing.assert_array_equal(np.asarray(x), before)  # the caller's array is unchanged


def _lax_body(body):
    """``body`` with jax_blink's ops swapped for lax's equivalents."""
    def swapped(v):
        saved = jax_blink.psum, jax_blink.pmax, jax_blink.broadcast
        jax_blink.psum, jax_blink.pmax = lax.psum, lax.pmax
        jax_blink.broadcast = lambda y, a, root: lax.psum(jnp.where(lax.axis_index(a) == root, y, 0), a)
        try:
            return body(v)
        finally:
            jax_blink.psum, jax_blink.pmax, jax_blink.broadcast = saved
    return swapped


def test_gradients_are_summed_in_place():
    """A training step's gradients are computed in the step: their buckets run in place."""
    w = jnp.ones((64, 64), jnp.float32)
    x = jax.device_put(jnp.ones((N * 4, 64), jnp.float32), NamedSharding(mesh(), P("d")))

    def step(w, xs):
        g = jax.grad(lambda w: jnp.sum(jnp.tanh(xs @ jax_blink.pvary(w, "d"))))(w)
        return g

    f = jax.jit(jax.shard_map(step, mesh=mesh(), in_specs=(P(), P("d")), out_specs=P()))
    assert all(aliased(f.lower(w, x).as_text()))
    expected = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
    np.testing.assert_allclose(np.asarray(f(w, x)), np.asarray(expected), rtol=1e-5)
