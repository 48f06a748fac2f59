"""The one summation-order checker (jax_blink.numerics) and the test helpers built on it
reject wrong sums for every dtype: all zeros, one rank dropped, a neighbour's shard,
negated, and an error just above the bound; and accept right ones: the same values summed
in another order, in the accumulator each library uses (issue 32, item 1)."""

import importlib.util
import os

import ml_dtypes
import numpy as np
import pytest

from jax_blink import numerics

N = 8
DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint32", "complex64"]
HERE = os.path.dirname(os.path.abspath(__file__))


def np_dtype(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def parts(dtype, shape=(N, 2, N * 4), seed=0):
    """One row per rank, of magnitudes that do not cancel to nothing."""
    rng = np.random.default_rng(seed)
    if dtype.startswith(("int", "uint")):
        return rng.integers(1, 1000, shape).astype(dtype)
    if dtype == "complex64":
        return (rng.uniform(0.5, 2, shape) + 1j * rng.uniform(0.5, 2, shape)).astype(dtype)
    return rng.uniform(0.5, 2, shape).astype(np_dtype(dtype))


def ordered_sum(x, order, dtype):
    """The sum of x's rows in ``order``, accumulated as jax_blink does (float16 and bfloat16
    in float32, rounded once; complex parts apart)."""
    floating = np_dtype(dtype).kind == "f" or dtype == "bfloat16"
    acc = np.dtype(numerics.accumulator(dtype)) if floating else np_dtype(dtype)
    total = x[order[0]].astype(acc)
    for r in order[1:]:
        total = total + x[r].astype(acc)
    return total.astype(np_dtype(dtype))


def wrong_results(x, dtype):
    """Known-wrong sums of x's rows (axis 0), named."""
    right = ordered_sum(x, list(range(N)), dtype)
    shard = right.shape[-1] // N
    neighbour = np.roll(right.reshape(right.shape[:-1] + (N, shard)), 1, axis=-2).reshape(right.shape)
    out = {"zeros": np.zeros_like(right), "one rank dropped": ordered_sum(x, list(range(1, N)), dtype),
           "neighbour's shard": neighbour}
    if np_dtype(dtype).kind != "u":
        out["negated"] = (-right.astype(np.float64 if np_dtype(dtype).kind == "f" else right.dtype)
                          ).astype(right.dtype) if np_dtype(dtype).kind != "c" else -right
    if np_dtype(dtype).kind in "iu":
        out["off by one"] = right + np.asarray(1, right.dtype)
    else:  # just above the bound: 1.5 bounds away from the exact sum
        exact = x.astype(np.complex128 if np_dtype(dtype).kind == "c" else np.float64).sum(0)
        bound = numerics.sum_bound(x, dtype)
        out["1.5 bounds off"] = (exact + 1.5 * bound).astype(right.dtype)
    return right, out


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_exact_checker_accepts_any_order_and_rejects_wrong_sums(dtype):
    x = parts(dtype)
    rng = np.random.default_rng(1)
    for _ in range(5):
        assert numerics.wrong_elements(ordered_sum(x, list(rng.permutation(N)), dtype), x) == 0
    _, wrong = wrong_results(x, dtype)
    for name, result in wrong.items():
        assert numerics.wrong_elements(result, x) > 0.5 * result.size, name


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_reference_checker_accepts_any_order_and_rejects_wrong_sums(dtype):
    x = parts(dtype)
    reference = ordered_sum(x, list(range(N))[::-1], dtype)  # lax's, in another order
    magnitude = np.abs(x.astype(np.complex128)).sum(0) if np_dtype(dtype).kind == "c" else \
        np.abs(x.astype(np.float64)).sum(0)
    right, wrong = wrong_results(x, dtype)
    assert numerics.wrong_vs_reference(right, reference, magnitude, N) == 0
    for name, result in wrong.items():
        if name == "1.5 bounds off":  # the reference's own bound adds to the slack
            result = (reference.astype(np.float64 if np_dtype(dtype).kind == "f" else np.complex128)
                      + 3 * N * numerics.sum_bound(x, dtype)).astype(right.dtype)
        assert numerics.wrong_vs_reference(result, reference, magnitude, N) > 0.5 * result.size, name


def test_float16_as_xla_adds_it_fits_the_lax_bound():
    """XLA's CPU psum adds float16 in float16: within sum_bound(accumulate="float16")."""
    x = parts("float16")
    total = x[0]
    for r in range(1, N):
        total = (total + x[r]).astype(np.float16)
    assert numerics.wrong_elements(total, x, accumulate=numerics.accumulator("float16", "lax")) == 0


def test_nan_and_inf_must_match():
    x = np.ones((N, 4), np.float32)
    x[0, 0], x[1, 1] = np.nan, np.inf
    good = x.astype(np.float64).sum(0).astype(np.float32)
    assert numerics.wrong_elements(good, x) == 0
    bad = good.copy()
    bad[0], bad[1] = 8.0, np.nan
    assert numerics.wrong_elements(bad, x) == 2


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_the_ops_tests_helpers_reject_wrong_sums(dtype):
    """test_psum.py's and test_scatter_gather.py's checks are the numerics checker, per
    element: each fails on every wrong result."""
    import sys
    sys.path.insert(0, os.path.join(HERE, "ops"))
    try:
        psum_tests = load(os.path.join(HERE, "ops", "test_psum.py"), "psum_tests")
        scatter_tests = load(os.path.join(HERE, "ops", "test_scatter_gather.py"), "scatter_tests")
    finally:
        sys.path.pop(0)
    x = parts(dtype)
    reference = ordered_sum(x, list(range(N))[::-1], dtype)
    magnitude = np.abs(x.astype(np.float64)).sum(0)
    right, wrong = wrong_results(x, dtype)
    psum_tests.assert_close_to_lax(right, reference, x, dtype)
    scatter_tests.assert_sum_close(right, reference, magnitude, dtype)
    for name, result in wrong.items():
        if name == "1.5 bounds off":
            continue  # a shade over one bound passes the two-bound comparison (by design)
        with pytest.raises(AssertionError):
            psum_tests.assert_close_to_lax(result, reference, x, dtype)
        with pytest.raises(AssertionError):
            scatter_tests.assert_sum_close(result, reference, magnitude, dtype)


def test_the_checker_counts_across_its_column_blocks_and_takes_empty_values():
    """wrong_elements checks large values in column blocks: a wrong element in the last
    block, or on one of several stacked ranks, still counts; empty values have none."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3, numerics._BLOCK_ELEMENTS + 5)).astype(np.float32)
    total = x.sum(axis=0, dtype=np.float64).astype(np.float32)
    stacked = np.stack([total, total])
    assert numerics.wrong_elements(total, x) == 0 and numerics.wrong_elements(stacked, x) == 0
    stacked[1, 2, -1] += 1.0  # the last column of the last block, on the second rank
    assert numerics.wrong_elements(stacked, x) == 1
    assert numerics.wrong_elements(np.zeros_like(total), x) == total.size
    assert numerics.wrong_elements(np.zeros((0,), np.float32), np.zeros((3, 0), np.float32)) == 0
    assert numerics.wrong_elements(np.zeros((2, 0), np.float32), np.zeros((3, 0), np.float32)) == 0


def test_a_nan_or_infinity_counts_where_the_exact_sum_is_finite():
    """A NaN result is wrong where the exact sum is a number, in every block; an infinite or NaN
    exact sum must be matched (the same infinity, or NaN)."""
    x = np.ones((4, 3 * numerics._BLOCK_ELEMENTS), np.float32)
    total = x.sum(axis=0)
    assert numerics.wrong_elements(total, x) == 0
    bad = total.copy()
    bad[[0, -1]] = np.nan
    bad[5] = np.inf
    assert numerics.wrong_elements(bad, x) == 3
    x[1, 7], x[2, 8] = np.inf, np.nan
    right = total.copy()
    right[7], right[8] = np.inf, np.nan
    assert numerics.wrong_elements(right, x) == 0
    right[7], right[8] = -np.inf, 4.0
    assert numerics.wrong_elements(right, x) == 2
