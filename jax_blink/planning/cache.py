"""The plan cache: plans kept in process and on disk, keyed by topology and options.

The disk cache lives in ``$JAX_BLINK_CACHE_DIR``, else
``$XDG_CACHE_HOME/jax_blink``, else ``~/.cache/jax_blink``; entries are plan
JSON files, written atomically. A missing, corrupt or foreign entry is
planned afresh and overwritten; an unwritable directory only costs planning
time.

Pure Python: never imports jax.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from .. import settings
from .result import FORMAT_VERSION, Plan

__all__ = ["cache_dir", "clear_memory_cache", "lookup", "store", "CACHE_VERSION"]

#: Bumped whenever planning changes its results; part of every cache key.
CACHE_VERSION = 1

_MEMORY_CACHE: dict = {}


def cache_dir() -> Path:
    """Directory of the on-disk plan cache (:func:`jax_blink.settings.cache_dir`)."""
    return settings.cache_dir()


def clear_memory_cache() -> None:
    """Forget the plans cached in this process (the disk cache stays)."""
    _MEMORY_CACHE.clear()


def _key(fingerprint, collective, root, max_trees, tolerance) -> str:
    options = {"cache_version": CACHE_VERSION, "plan_format": FORMAT_VERSION, "topology": fingerprint,
               "collective": collective, "root": root, "max_trees": max_trees, "tolerance": tolerance}
    return hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:32]


def _disk_load(path: Path, fingerprint: str):
    try:
        cached = Plan.from_json(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None  # missing or corrupt: plan afresh and overwrite
    return cached if cached.topology.fingerprint() == fingerprint else None


def _disk_store(path: Path, result: Plan) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".plan-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(result.to_json())
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs planning time


def lookup(topology, options: tuple):
    """The cached plan for ``topology`` and ``options`` (``collective, root, max_trees,
    tolerance``), or None; a plan found on disk is kept in memory too."""
    fingerprint = topology.fingerprint()
    key = _key(fingerprint, *options)
    cached = _MEMORY_CACHE.get(key) or _disk_load(cache_dir() / f"plan-{key}.json", fingerprint)
    if cached is not None:
        _MEMORY_CACHE[key] = cached
    return cached


def store(result: Plan, options: tuple) -> None:
    """Keep ``result``, planned with ``options``, in memory and on disk."""
    key = _key(result.topology.fingerprint(), *options)
    _MEMORY_CACHE[key] = result
    _disk_store(cache_dir() / f"plan-{key}.json", result)
