"""What a correct sum may return: the per-element bound of a reduction in another order.

One checker for the tests, the benchmarks and ``bench --steps``:
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

__all__ = ["sum_bound", "wrong_elements", "wrong_vs_reference", "accumulator"]


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
    shape = np.broadcast_shapes(result.shape, parts.shape[1:])
    columns = int(np.prod(parts.shape[1:], dtype=np.int64))
    if columns == 0 or 0 in shape:
        return 0
    flat = parts.reshape(parts.shape[0], columns)
    got = np.broadcast_to(result, shape).reshape(-1, columns)
    acc = accumulator(dtype) if accumulate is None else accumulate
    scale = (max(flat.shape[0] - 1, 0) * _eps(acc), _eps(dtype))
    # In column blocks, into float64 buffers made once: a fresh temporary per block costs page
    # faults that took 5x the arithmetic (a calibration checks 8 devices' sums of 1e7 elements).
    width = min(columns, max(_BLOCK_ELEMENTS // max(flat.shape[0], got.shape[0]), 256))
    buffers = (np.empty((flat.shape[0], width)), np.empty((got.shape[0], width)), np.empty((3, width)),
               np.empty((got.shape[0], width), bool))
    return sum(_wrong_block(got[:, j:j + width], flat[:, j:j + width], scale, buffers)
               for j in range(0, columns, width))


_BLOCK_ELEMENTS = 1 << 15  # float64 values per buffer: 256 KiB, within a core's L2


def _wrong_block(got, parts, scale, buffers) -> int:
    """:func:`wrong_elements` of a block of float columns: ``got`` (rows of results) against
    ``parts``, ``scale`` the bound's two factors (:func:`sum_bound`)."""
    w = parts.shape[1]
    wide, mine, (exact, bound, tmp), ok = (b[..., :w] for b in buffers)
    np.copyto(wide, parts, casting="unsafe")
    np.sum(wide, axis=0, out=exact)
    np.abs(wide, out=wide)
    np.sum(wide, axis=0, out=bound)
    bound *= scale[0]
    np.abs(exact, out=tmp)
    tmp *= scale[1]
    bound += tmp
    np.copyto(mine, got, casting="unsafe")
    with np.errstate(invalid="ignore"):
        np.subtract(mine, exact, out=mine)
        np.abs(mine, out=mine)
        np.less_equal(mine, bound, out=ok)  # False for NaN: a NaN where the exact sum is finite is wrong
    finite = np.isfinite(exact)
    if finite.all():
        return int(ok.size - np.count_nonzero(ok))
    # an infinite or NaN exact sum: the result must be the same infinity, or NaN
    g = got.astype(np.float64)
    e = parts.astype(np.float64).sum(axis=0)
    nonfinite_ok = (g == e) | (np.isnan(g) & np.isnan(e))
    return int(np.count_nonzero(~np.where(finite, ok, nonfinite_ok)))


def wrong_vs_reference(result, reference, magnitude, n: int, dtype=None, accumulate=None,
                       reference_accumulate=None) -> int:
    """Elements where ``result`` and ``reference`` -- two sums of the same ``n`` values
    per element, in different orders (jax_blink's and lax's) -- differ by more than
    both sums' bounds allow.

    Where the summands themselves are not at hand (a collective's output on one
    device), ``magnitude`` is the sum of their absolute values per element: the
    same reduction applied to ``|x|`` (for ``psum_scatter``, ``lax.psum_scatter`` of
    ``|x|``; for complex values of ``|x|``, which bounds both parts). The bound is
    ``(n - 1) * (eps_acc + eps_ref_acc) * magnitude + eps_out * (|result| + |reference|)``;
    integers must be equal.

    Examples
    --------
    >>> x = np.array([[1.0, 1e-3], [2.0, -1e-3], [3.0, 5.0]], np.float32)
    >>> ref, mag = x.sum(0), np.abs(x).sum(0)
    >>> wrong_vs_reference(x[::-1].sum(0), ref, mag, 3), wrong_vs_reference(x[1:].sum(0), ref, mag, 3)
    (0, 2)
    """
    result, reference = np.asarray(result), np.asarray(reference)
    dtype = _float_dtype(result.dtype if dtype is None else dtype)
    if result.shape != reference.shape:
        return int(max(result.size, reference.size))
    if dtype.kind in "iub":
        return int(np.sum(result != reference))
    if dtype.kind == "c":
        real = np.dtype(dtype.char.lower())
        return sum(wrong_vs_reference(f(result), f(reference), magnitude, n, real, accumulate,
                                      reference_accumulate) for f in (np.real, np.imag))
    acc = accumulator(dtype) if accumulate is None else accumulate
    ref_acc = accumulator(dtype, "lax") if reference_accumulate is None else reference_accumulate
    got, want = result.astype(np.float64), reference.astype(np.float64)
    mag = np.abs(np.asarray(magnitude, np.float64))
    bound = (max(n - 1, 0) * (_eps(acc) + _eps(ref_acc)) * mag
             + _eps(dtype) * (np.abs(got) + np.abs(want)))
    finite = np.isfinite(got) & np.isfinite(want)
    with np.errstate(invalid="ignore"):
        off = np.abs(got - want) > bound
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    return int(np.sum(np.where(finite, off, ~same)))
