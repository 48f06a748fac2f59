"""What a correct sum may return: the per-element bound of a reduction in another order.

One checker for the tests, the benchmarks and ``bench --devices``/``--steps``:
a sum of ``n`` values computed in any order by floating-point additions
(each rounded to the accumulator type) lies within ``(n - 1) * eps_acc *
sum_r |x_r|`` of the exact sum, per element (the standard bound for
recursive summation, with ``eps`` the machine epsilon, which is twice the
unit roundoff, so it also covers the first-order terms); rounding the result
once to the output type adds ``eps_out * |sum|``. jax_blink accumulates
float16 and bfloat16 in float32 and rounds once; XLA's CPU psum accumulates
bfloat16 in float32 and float16 in float16 (``accumulator``). Integers are
exact, modulo ``2^bits`` as the dtype wraps. The bound is per element: a
result that drops one rank's contribution, or is a neighbour's, fails it
wherever that contribution is not tiny next to the bound.

Pure numpy: never imports jax.
"""

from __future__ import annotations

import numpy as np

__all__ = ["sum_bound", "wrong_elements", "accumulator"]


def _float_dtype(dtype) -> np.dtype:
    """numpy dtype of ``dtype``, with bfloat16 from ml_dtypes where named so."""
    if str(dtype) == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def _eps(dtype) -> float:
    dtype = _float_dtype(dtype)
    if dtype.name == "bfloat16":
        return 2.0 ** -7
    return float(np.finfo(dtype).eps)


def accumulator(dtype, library: str = "jax_blink") -> str:
    """The type ``library`` (``"jax_blink"`` or ``"lax"``, XLA on CPU) adds ``dtype`` values in."""
    name = _float_dtype(dtype).name
    if name == "bfloat16" or (name == "float16" and library == "jax_blink"):
        return "float32"
    return name


def sum_bound(parts, dtype=None, accumulate=None) -> np.ndarray:
    """Per element, the largest distance from the exact sum of ``parts``
    (axis 0: one row per rank) that a sum in another order may have.

    Parameters
    ----------
    parts : array of shape (n, ...)
        The summands; complex values bound their real and imaginary parts
        (as the two sums they travel as).
    dtype : dtype, optional
        The result's type (default: ``parts``' dtype).
    accumulate : dtype, optional
        The type additions round to (default: :func:`accumulator` of jax_blink).

    Returns
    -------
    numpy.ndarray of float64, zero for integer dtypes.

    Examples
    --------
    >>> x = np.array([[1.0, 3.0], [2.0, -3.0]], np.float32)
    >>> bound = sum_bound(x)
    >>> bool(bound[0] > 0) and bool(bound[0] < 1e-5)
    True
    """
    parts = np.asarray(parts)
    dtype = _float_dtype(parts.dtype if dtype is None else dtype)
    if dtype.kind in "iub":
        return np.zeros(parts.shape[1:])
    if dtype.kind == "c":
        real = np.dtype(dtype.char.lower())
        re, im = (sum_bound(f(parts).astype(real), real, accumulate) for f in (np.real, np.imag))
        return np.maximum(re, im)
    acc = accumulator(dtype) if accumulate is None else accumulate
    wide = parts.astype(np.float64)
    n = wide.shape[0]
    return (max(n - 1, 0) * _eps(acc) * np.abs(wide).sum(axis=0)
            + _eps(dtype) * np.abs(wide.sum(axis=0)))


def wrong_elements(result, parts, dtype=None, accumulate=None) -> int:
    """Elements of ``result`` (one rank's sum of ``parts``, or several ranks'
    stacked on axis 0) farther from the exact sum than :func:`sum_bound`
    allows; integers must equal it (wrapping). NaN and inf must match the
    exact sum's.

    Examples
    --------
    >>> x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7  # rank 0 holds a zero in column 0
    >>> wrong_elements(x.sum(0), x), wrong_elements(x[1:].sum(0), x), wrong_elements(np.zeros(4), x)
    (0, 3, 4)
    """
    parts = np.asarray(parts)
    dtype = _float_dtype(parts.dtype if dtype is None else dtype)
    result = np.asarray(result)
    if dtype.kind in "iub":
        exact = parts.astype(dtype).sum(axis=0, dtype=dtype)
        return int(np.sum(result != np.broadcast_to(exact, result.shape)))
    if dtype.kind == "c":
        real = np.dtype(dtype.char.lower())
        return sum(wrong_elements(f(result), f(parts).astype(real), real, accumulate)
                   for f in (np.real, np.imag))
    exact = parts.astype(np.float64).sum(axis=0)
    bound = sum_bound(parts, dtype, accumulate)
    got = result.astype(np.float64)
    exact, bound = np.broadcast_to(exact, got.shape), np.broadcast_to(bound, got.shape)
    finite = np.isfinite(exact)
    with np.errstate(invalid="ignore"):
        off = np.abs(got - exact) > bound
    nonfinite_wrong = ~finite & ~((got == exact) | (np.isnan(got) & np.isnan(exact)))
    return int(np.sum(np.where(finite, off, nonfinite_wrong)))
