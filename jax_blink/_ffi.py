"""Loads the C++ extension and registers its XLA FFI targets with jax.

The extension ``jax_blink._blink_ext`` holds the typed FFI handlers of the
``jax_blink_collective`` custom call (instantiate + execute stages), the FFI
state type of its decoded schedule, the C++ schedule validator and a test
harness (``run_ranks``). Registration happens once per process, on the first
call of :func:`ensure_registered` (the ops module calls it before lowering).
"""

import threading

TARGET = "jax_blink_collective"

_BUILD_HINT = (
    "jax_blink's C++ extension (jax_blink._blink_ext) is not built or cannot "
    "be loaded. Build it from the repository root with `pip install -e .` "
    "(or `pip install .`); see docs/building.md."
)

_lock = threading.Lock()
_registered = False


def load_extension():
    """Returns the extension module, or raises ImportError with build advice."""
    try:
        from jax_blink import _blink_ext
    except ImportError as e:
        raise ImportError(f"{_BUILD_HINT} ({e})") from e
    return _blink_ext


def ensure_registered():
    """Registers the FFI state type and targets for the CPU platform, once."""
    global _registered
    if _registered:
        return
    with _lock:
        if _registered:
            return
        import jax

        ext = load_extension()
        # jaxlib 0.10 replays registrations made before the CPU client
        # exists in the wrong order (handlers before their state types) and
        # then fails to start the backend. Start it first; this is why
        # ensure_registered() must run lazily (at lowering), not at import,
        # so that user settings such as jax_num_cpu_devices still apply.
        try:
            jax.devices("cpu")
        except RuntimeError:
            pass
        for name, registration in ext.type_registrations().items():
            jax.ffi.register_ffi_type(name, registration, platform="cpu")
        for name, stages in ext.registrations().items():
            jax.ffi.register_ffi_target(name, stages, platform="cpu")
        _registered = True


def has_cuda_support():
    """Whether the extension was built with CUDA: ``jax_blink._blink_cuda``
    (built when a CUDA compiler was found, docs/building.md) is importable.

    The CUDA executor is not yet registered as an XLA FFI target; for now the
    module is a single-GPU harness (tests/test_cuda.py), and whether a GPU is
    visible is ``jax_blink._blink_cuda.device_count() > 0``. Returns False
    (never raises) when the module is not built.
    """
    try:
        from jax_blink import _blink_cuda
    except ImportError:
        return False
    return bool(_blink_cuda.has_cuda())
