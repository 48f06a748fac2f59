"""The measurements behind `bench --devices` and `bench --steps` check what they time: a
wrong sum (imaginary parts included) is counted, a right one is not."""

import numpy as np
import pytest

import jax.numpy as jnp
from jax import lax

from jax_blink.measure import timing as measure


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "complex64"])
def test_devices_rows_count_no_wrong_element_of_a_right_sum(dtype):
    rows, devices = measure.run_devices([4096], dtype, iters=1)
    assert "8 x cpu" in devices
    assert all(r["wrong"] == 0 for _, by in rows for r in by.values())


@pytest.mark.parametrize("broken", ["zeros", "real part only", "one rank dropped"])
def test_devices_rows_count_the_wrong_elements_of_a_wrong_sum(monkeypatch, broken):
    def bad_psum(v, axis, **kwargs):
        if broken == "zeros":
            return jnp.zeros_like(v)
        if broken == "real part only":
            return lax.psum(jnp.real(v).astype(v.dtype), axis)
        return lax.psum(jnp.where(lax.axis_index(axis) == 3, jnp.zeros_like(v), v), axis)

    monkeypatch.setattr(measure, "psum", bad_psum)
    rows, _ = measure.run_devices([4096], "complex64", iters=1)
    wrong = rows[0][1]["jax_blink.psum"]["wrong"]
    assert wrong > 0.9 * 8 * 512  # 4096 bytes of complex64 on 8 devices
    assert rows[0][1]["lax.psum"]["wrong"] == 0


def test_step_rows_check_the_summed_gradients(monkeypatch):
    rows, _ = measure.run_steps([(2, 16)], batch=4, rounds=1, reps=1)
    assert {r["variant"] for r in rows} == set(measure.STEP_VARIANTS)
    assert all(r["wrong"] == 0 for r in rows)
    # a sum that drops one device's gradients is caught
    real = measure._summer

    def broken(variant, axis):
        if variant == "jax_blink":
            return lambda g: lax.psum(jax_tree_zero_one(g, axis), axis)
        return real(variant, axis)

    def jax_tree_zero_one(g, axis):
        import jax
        return jax.tree.map(lambda t: jnp.where(lax.axis_index(axis) == 0, jnp.zeros_like(t), t), g)

    monkeypatch.setattr(measure, "_summer", broken)
    rows, _ = measure.run_steps([(2, 16)], batch=4, rounds=1, reps=1, variants=("none", "lax.psum",
                                                                                    "jax_blink"))
    by = {r["variant"]: r["wrong"] for r in rows}
    assert by["lax.psum"] == 0 and by["jax_blink"] > 0
    # checking some variants (calibrate's steps): the others go unchecked
    rows, _ = measure.run_steps([(2, 16)], batch=4, rounds=1, reps=1, variants=("none", "lax.psum",
                                                                                    "jax_blink"), check=("jax_blink",))
    by = {r["variant"]: r["wrong"] for r in rows}
    assert by["lax.psum"] is None and by["jax_blink"] > 0
    assert measure.wrong_gradient_sums(2, 16, "jax_blink", batch=4) == by["jax_blink"]
    assert measure.wrong_gradient_sums(2, 16, "lax.psum", batch=4) == 0


def test_the_per_leaf_step_makes_one_call_per_leaf_and_sums_right(monkeypatch):
    monkeypatch.setenv("JAX_BLINK_ALGO", "blink")  # every leaf on the plan, whatever its size
    rows, _ = measure.run_steps([(3, 16)], batch=4, rounds=1, reps=1,
                                variants=("none", "lax.psum", measure.PER_LEAF, "jax_blink one bucket"))
    by = {r["variant"]: r for r in rows}
    assert by[measure.PER_LEAF]["collectives"] == 6  # 3 weights and 3 biases
    assert by["jax_blink one bucket"]["collectives"] == 1
    assert all(r["wrong"] == 0 for r in rows)
