"""Fixtures of the executor tests."""

import pytest

from jax_blink import _ffi


@pytest.fixture(scope="module")
def cuda():
    """The single-GPU harness (jax_blink._blink_cuda_testing), where a GPU is; else the
    test skips with the reason (CI has no GPU)."""
    try:
        from jax_blink import _blink_cuda
    except ImportError as e:
        pytest.skip(f"no NVIDIA GPU: the CUDA module jax_blink._blink_cuda is not built ({e})")
    if _blink_cuda.device_count() < 1:
        pytest.skip("no NVIDIA GPU: _blink_cuda is built but sees no CUDA device")
    return _ffi.load_cuda_testing()
