"""Loads the C++ extension modules and registers their XLA FFI targets with jax.

``jax_blink._blink_ext`` holds the typed FFI handlers of the
``jax_blink_collective`` custom call (instantiate + execute stages), the FFI
state type of its decoded schedule, the C++ schedule validator and the CPU
executor's settings (``configure``); ``jax_blink._blink_cuda`` (built where
nvcc is found) holds the same custom call for CUDA. Registration happens once
per process and platform, on the first call of :func:`ensure_registered` (the
ops module calls it before lowering). The test-only modules
``jax_blink._blink_testing`` (CPU executor harness, stream emulator) and
``jax_blink._blink_cuda_testing`` (single-GPU harness) come from
:func:`load_testing` and :func:`load_cuda_testing`.
"""

import threading

TARGET = "jax_blink_collective"
SEGMENTS_TARGET = "jax_blink_collective_segments"  # CPU: an allreduce of several operands

_BUILD_HINT = (
    "jax_blink's C++ extension (jax_blink._blink_ext) is not built or cannot "
    "be loaded. Build it from the repository root with `pip install -e .` "
    "(or `pip install .`); see docs/building.md."
)

_lock = threading.Lock()
_registered = set()  # platforms done


def load_extension():
    """Returns the extension module, or raises ImportError with build advice."""
    try:
        from jax_blink import _blink_ext
    except ImportError as e:
        raise ImportError(f"{_BUILD_HINT} ({e})") from e
    return _blink_ext


def _load_cuda_extension():
    try:
        from jax_blink import _blink_cuda
    except ImportError as e:
        raise ImportError(
            "jax_blink's CUDA module (jax_blink._blink_cuda) is not built: it is compiled "
            f"when a CUDA compiler is found at build time; see docs/building.md ({e})") from e
    return _blink_cuda


def load_testing():
    """Returns the test-only module ``jax_blink._blink_testing`` (``run_ranks``,
    ``emulate_streams``, ``rendezvous_stats``), or raises ImportError with build
    advice. Its ``run_ranks`` runs ``_blink_ext``'s CPU executor, so both must
    come from the same build."""
    try:
        from jax_blink import _blink_testing
    except ImportError as e:
        raise ImportError(
            "jax_blink's test harness module (jax_blink._blink_testing) is not built or "
            "cannot be loaded: `pip install -e .` builds it with jax_blink._blink_ext "
            f"(unless -DJAX_BLINK_TESTING=OFF); see docs/building.md ({e})") from e
    return _blink_testing


def load_cuda_testing():
    """Returns the test-only module ``jax_blink._blink_cuda_testing``
    (``run_schedule``, ``time_schedule``, ``time_kernel``), or raises ImportError
    with build advice."""
    try:
        from jax_blink import _blink_cuda_testing
    except ImportError as e:
        raise ImportError(
            "jax_blink's CUDA test harness module (jax_blink._blink_cuda_testing) is not "
            "built: it is compiled with jax_blink._blink_cuda when a CUDA compiler is "
            "found at build time (unless -DJAX_BLINK_TESTING=OFF); see docs/building.md "
            f"({e})") from e
    return _blink_cuda_testing


def configure_cpu(ext=None):
    """Hands the CPU executor the settings of the environment (``JAX_BLINK_SPIN`` and the
    others, validated by :func:`jax_blink.settings.executor`); ``ext``: the extension
    (default: :func:`load_extension`'s). The first lowering does this once; harnesses that
    run the executor without jax call it themselves."""
    from jax_blink import settings

    ext = load_extension() if ext is None else ext
    cfg = settings.executor()
    ext.configure(spin=cfg.spin, yield_us=cfg.yield_us, push=cfg.push, nt_bytes=cfg.nt_bytes,
                  hugepage_bytes=cfg.hugepage_bytes, debug=cfg.debug, barrier=cfg.barrier)


def ensure_registered(platform="cpu"):
    """Registers the FFI state type and targets for ``platform`` ("cpu" or "cuda"), once."""
    if platform in _registered:
        return
    with _lock:
        if platform in _registered:
            return
        import jax

        ext = load_extension() if platform == "cpu" else _load_cuda_extension()
        xla_platform = "cpu" if platform == "cpu" else "CUDA"
        # jaxlib 0.10 replays registrations made before the CPU client
        # exists in the wrong order (handlers before their state types) and
        # then fails to start the backend. Start it first; this is why
        # ensure_registered() must run lazily (at lowering), not at import,
        # so that user settings such as jax_num_cpu_devices still apply.
        try:
            jax.devices("cpu" if platform == "cpu" else "gpu")
        except RuntimeError:
            pass
        # The executors' settings: from the environment, validated in one
        # place (jax_blink.settings), handed to C++ once.
        if platform == "cpu":
            configure_cpu(ext)
        else:
            from jax_blink import settings

            cfg = settings.executor()
            ext.configure(debug=cfg.debug, executor=cfg.cuda_executor)
        for name, registration in ext.type_registrations().items():
            jax.ffi.register_ffi_type(name, registration, platform=xla_platform)
        for name, stages in ext.registrations().items():
            jax.ffi.register_ffi_target(name, stages, platform=xla_platform)
        _registered.add(platform)


def has_cuda_support():
    """Whether the extension was built with CUDA: ``jax_blink._blink_cuda``
    (built when a CUDA compiler was found, docs/building.md) is importable.

    The module holds the CUDA FFI handlers (its single-GPU harness,
    tests/executor/test_cuda.py, is ``jax_blink._blink_cuda_testing``); whether
    a GPU is visible is
    ``jax_blink._blink_cuda.device_count() > 0``. ``psum`` uses the handlers
    on NVIDIA GPUs unless ``JAX_BLINK_CUDA=0`` (:func:`jax_blink.settings.cuda_enabled`).
    Returns False (never raises) when the module is not built.
    """
    try:
        from jax_blink import _blink_cuda
    except ImportError:
        return False
    return bool(_blink_cuda.has_cuda())


def cuda_pci_bus_ids(ordinals):
    """The PCI bus id of each CUDA device ordinal, from the CUDA runtime, or
    None without the CUDA module."""
    if not has_cuda_support():
        return None
    from jax_blink import _blink_cuda

    try:
        return [_blink_cuda.pci_bus_id(int(o)) for o in ordinals]
    except RuntimeError:
        return None
