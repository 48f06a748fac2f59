"""This machine's identity and its profile (:mod:`jax_blink.planning.profile`).

:func:`machine_key` is what makes measured costs valid: the CPU model and core count,
the platform and device kind (and, for accelerators, their count: CPU devices are
virtual, their count a setting, and each layout has its own table), jax's and jaxlib's
versions, and the build of the extension that executes the schedules. :func:`profile`
is the profile psum's choices read: ``JAX_BLINK_PROFILE``, else this machine's in the
cache directory, loaded once per file version and process; None (and one note saying
how to make one) where there is none.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Optional

import jax
import jaxlib

from jax_blink import _ffi, settings
from jax_blink.planning import profile as profiles

__all__ = ["machine_key", "profile", "profile_path", "forget"]

logger = logging.getLogger("jax_blink")

_lock = threading.Lock()
_loaded: dict = {}  # (path, mtime_ns, size) -> Profile or None
_noted = set()


@functools.lru_cache(maxsize=1)
def _build_id() -> str:
    """A digest of the extension module that executes the schedules (a rebuild, even of
    the same commit with other flags, measures anew)."""
    path = Path(_ffi.load_extension().__file__)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def machine_key() -> dict:
    """The identity a profile must match to be used here (see the module docstring)."""
    device = jax.local_devices()[0]
    key = {"cpu": profiles.cpu_model(), "cores": os.cpu_count(), "platform": device.platform,
           "device_kind": device.device_kind, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
           "build": _build_id()}
    if device.platform != "cpu":
        key["devices"] = jax.local_device_count()
    return key


def profile_path() -> Path:
    """Where this machine's profile lives in the cache directory (``calibrate`` writes it)."""
    return profiles.path_for(machine_key(), settings.cache_dir())


def profile() -> Optional[profiles.Profile]:
    """The profile psum's choices use: ``JAX_BLINK_PROFILE``'s file, else this machine's;
    None for the recorded defaults (:mod:`jax_blink.planning.cost`), noted once per
    process with the command that measures this machine unless ``JAX_BLINK_PROFILE=defaults``
    asked for them."""
    chosen = settings.profile_file()
    if chosen == settings.PROFILE_DEFAULTS:
        return None
    path = chosen or profile_path()
    try:
        st = path.stat()
        version = (str(path), st.st_mtime_ns, st.st_size)
    except OSError:
        version = (str(path), None, None)
    with _lock:
        if version not in _loaded:
            found = None if version[1] is None else profiles.load(path, machine_key())
            _loaded.clear()
            _loaded[version] = found
        found = _loaded[version]
        if found is None and str(path) not in _noted:
            _noted.add(str(path))
            logger.warning("jax_blink: no machine profile at %s; psum chooses from the costs recorded on "
                           "another machine (planning.cost). `python -m jax_blink calibrate` measures this "
                           "one (about a minute; --quick: under 10 s)", path)
    return found


def forget() -> None:
    """Forget the loaded profile and the notes given (after a calibration, and for tests)."""
    with _lock:
        _loaded.clear()
        _noted.clear()
