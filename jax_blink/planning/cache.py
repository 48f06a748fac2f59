"""The plan cache: plans kept in process and on disk, keyed by topology and options.

The disk cache lives in ``$JAX_BLINK_CACHE_DIR``, else
``$XDG_CACHE_HOME/jax_blink``, else ``~/.cache/jax_blink``. An entry,
``plan-<hash of its key>.json``, is a ``"jax_blink.plan_cache"`` JSON object
holding

* ``"key"``: everything the plan answers (:func:`cache_key`: cache and plan
  format versions, topology fingerprint (per-direction bandwidths
  included), the ``links`` option and the link kinds it plans over,
  collective, root, ``max_trees``, ``tolerance``);
* ``"certificate"``: the packing LPs' arc prices, from which
  :func:`~jax_blink.planning.bounds.certified_bound` recomputes the plan's
  bound (any non-negative prices give a valid bound, so a certificate cannot
  be forged to excuse a slow plan);
* ``"plan"``: the plan's JSON.

An entry is used only if :func:`check_entry` accepts it: the key matches,
the plan passes :meth:`~jax_blink.planning.Plan.check` and answers the key,
its bound is the one the certificate proves and, without ``max_trees``, its
rate reaches that bound (less ``tolerance``). Anything else (a missing,
corrupt, truncated, foreign, other-version, edited or other-options entry, or
a FIFO or device in its place, which is never opened for a blocking read) is
planned afresh and rewritten atomically (a temporary file in the same
directory, then ``os.replace``, so concurrent processes never see a partial
entry). An unwritable directory or a read-only entry only costs planning
time: the plan is not saved, and a warning is logged.

The disk cache is also where the processes of one host agree on a plan.
Planning is not a pure function of its request: the tree-count MILP stops at
a time limit, so a process under load may keep another packing (on
``shm:16 in 4 processes``, a reduce-scatter of 19 trees instead of 18), and
the ranks of a call over several processes must run one schedule. So
:func:`planning` holds a lock (``plan-<hash>.lock``, ``flock``) while a process
plans and stores a request; another process that wants it waits, then finds
the entry and loads it. Processes that do not share the cache directory (or
where it cannot be written) plan apart, and may then disagree: the executor
refuses such a call with an error naming both schedules' fingerprints.

Pure Python: never imports jax.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import stat
import tempfile
import time
from pathlib import Path

import numpy as np

from .. import settings
from .._jsonio import parse_json, read_document, read_text_file
from .bounds import certified_bound
from .errors import PlanError
from .result import FORMAT_VERSION, RATE_RTOL, Plan

__all__ = ["cache_dir", "clear_memory_cache", "lookup", "store", "planning", "cache_key", "check_entry",
           "entry_path", "CACHE_VERSION", "ENTRY_FORMAT", "LOCK_WAIT_S", "disk_store", "files_digest",
           "source_digest", "load_keyed", "store_keyed"]

#: Bumped whenever planning changes its results or the entry format; part of every cache key.
CACHE_VERSION = 6
#: The ``"format"`` of a cache entry.
ENTRY_FORMAT = "jax_blink.plan_cache"
#: How long :func:`planning` waits for another process planning the same request before
#: planning on its own (with a warning): far above any plan's time (``shm:128``: 26 s).
LOCK_WAIT_S = 300.0

logger = logging.getLogger(__name__)

_MEMORY_CACHE: dict = {}


def cache_dir() -> Path:
    """Directory of the on-disk plan cache (:func:`jax_blink.settings.cache_dir`)."""
    return settings.cache_dir()


def clear_memory_cache() -> None:
    """Forget the plans cached in this process (the disk cache stays)."""
    _MEMORY_CACHE.clear()


def cache_key(topology, options: tuple) -> dict:
    """Everything a cached plan for ``topology`` and ``options`` (``collective, root,
    max_trees, tolerance, links`` and, where given, ``slow_ranks``) must answer, as a JSON object."""
    collective, root, max_trees, tolerance, links = options[:5]
    key = {"cache_version": CACHE_VERSION, "plan_format": FORMAT_VERSION, "topology": topology.fingerprint(),
           "links": links, "link_kinds": list(topology.planning_kinds(links)), "collective": collective,
           "root": root, "max_trees": max_trees, "tolerance": tolerance}
    if len(options) > 5 and options[5]:  # plan(slow_ranks=...): sorted rank numbers
        key["slow_ranks"] = list(options[5])
    return key


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


def entry_path(key: dict) -> Path:
    """Where the disk cache keeps the entry for ``key``."""
    return cache_dir() / f"plan-{_digest(key)}.json"


def check_entry(entry, key: dict) -> Plan:
    """The plan of a cache entry, if the entry answers ``key`` and its plan holds up.

    Parameters
    ----------
    entry : dict or str
        The entry (or its JSON text).
    key : dict
        :func:`cache_key` of the request.

    Raises
    ------
    PlanError
        Naming the first check that fails: the format and version, the key,
        the plan's invariants (:meth:`Plan.check`), its collective, root,
        topology, link kinds and tree count, its bound against the
        certificate, and its rate against that bound.
    """
    data = read_document(entry, fmt=ENTRY_FORMAT, version=CACHE_VERSION, error=PlanError,
                         what="plan cache entry")
    found = data.get("key")
    if found != key:
        differ = sorted(k for k in key if k not in found or found[k] != key[k]) if isinstance(found, dict) else []
        raise PlanError("the entry answers other options" + (f" ({', '.join(differ)} differ)" if differ else ""))
    if not isinstance(data.get("plan"), dict):
        raise PlanError("the entry holds no plan object")
    plan = Plan.from_json(data["plan"])  # checks the plan's invariants
    collective, root = key["collective"], key["root"]
    if plan.topology.fingerprint() != key["topology"]:
        raise PlanError("the plan is for another topology")
    if plan.collective != collective or plan.root != root:
        raise PlanError(f"the plan is for {plan.collective} (root {plan.root}), not {collective} (root {root})")
    if list(plan.link_kinds) != key["link_kinds"]:
        raise PlanError(f"the plan uses {'/'.join(plan.link_kinds)} links, not {'/'.join(key['link_kinds'])}")
    if list(plan.slow_ranks) != key.get("slow_ranks", []):
        raise PlanError(f"the plan's slow ranks {list(plan.slow_ranks)} are not {key.get('slow_ranks', [])}")
    if key["max_trees"] is not None and len(plan.trees) > key["max_trees"]:
        raise PlanError(f"the plan has {len(plan.trees)} trees, more than max_trees={key['max_trees']}")
    prices = data.get("certificate")
    graph = plan.topology.link_graph(plan.link_kinds)
    if (not isinstance(prices, list) or not prices
            or not all(isinstance(y, list) and len(y) == len(graph.arcs) for y in prices)):
        raise PlanError(f"the certificate is not a list of {len(graph.arcs)} arc prices per family")
    try:
        prices = [np.asarray(y, dtype=float) for y in prices]
    except (TypeError, ValueError):
        raise PlanError("the certificate's arc prices are not numbers") from None
    if not all(np.isfinite(y).all() for y in prices):
        raise PlanError("the certificate's arc prices are not finite")
    bound = certified_bound(graph, collective, root, prices)
    if not math.isclose(plan.bound_gbps, bound, rel_tol=RATE_RTOL):
        raise PlanError(f"the plan's bound {plan.bound_gbps:.6g} GB/s is not the {bound:.6g} GB/s its "
                        f"certificate proves")
    floor = bound * (1.0 - key["tolerance"]) * (1.0 - RATE_RTOL)
    if key["max_trees"] is None and plan.rate_gbps < floor:
        raise PlanError(f"the plan's rate {plan.rate_gbps:.6g} GB/s is below the certified bound "
                        f"{bound:.6g} GB/s" + (f" less tolerance {key['tolerance']}" if key["tolerance"] else ""))
    return plan


def lookup(topology, options: tuple):
    """The cached plan for ``topology`` and ``options`` (``collective, root, max_trees,
    tolerance, links``), or None; a plan found on disk is kept in memory too.

    A disk entry that :func:`check_entry` refuses is logged (a warning naming
    the reason) and ignored, so that the caller plans afresh and
    :func:`store` replaces it.
    """
    key = cache_key(topology, options)
    digest = _digest(key)
    cached = _MEMORY_CACHE.get(digest)
    if cached is None:
        cached = _disk_load(entry_path(key), key)
        if cached is not None:
            _MEMORY_CACHE[digest] = cached
    return cached


def store(result: Plan, options: tuple, certificate) -> None:
    """Keep ``result``, planned with ``options``, in memory and on disk.

    Parameters
    ----------
    result : Plan
    options : tuple
        ``collective, root, max_trees, tolerance, links``.
    certificate : sequence of array_like
        The arc prices its bound was certified with (one array per family packed).
    """
    key = cache_key(result.topology, options)
    _MEMORY_CACHE[_digest(key)] = result
    entry = {"format": ENTRY_FORMAT, "version": CACHE_VERSION, "key": key,
             "certificate": [[float(p) for p in y] for y in certificate], "plan": result.to_dict()}
    disk_store(entry_path(key), json.dumps(entry))


@contextlib.contextmanager
def planning(topology, options: tuple):
    """Hold the disk cache's lock for ``topology`` and ``options`` while planning them, so
    that the processes sharing the cache directory plan a request once and all load that
    plan (see the module docstring): the caller looks the plan up again inside, and
    stores what it plans before leaving.

    The lock is ``flock`` on ``plan-<hash of the key>.lock`` beside the entry; the
    system drops it when its holder exits, a crash included. Where no lock can be taken
    (an unwritable directory, a file system without locks) or another process holds it
    past :data:`LOCK_WAIT_S`, this plans without it and logs a warning.
    """
    path = entry_path(cache_key(topology, options)).with_suffix(".lock")
    fd = None
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        # read-only: flock needs no write access; created only where the cache may be written
        # (as disk_store decides); O_NONBLOCK: a FIFO in its place must not block the open
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        if not _read_only(os.stat(path.parent), path.parent):
            flags |= os.O_CREAT
        fd = os.open(path, flags, 0o644)
    except (ImportError, OSError) as e:
        logger.warning("jax_blink plan cache: cannot lock %s (%s); planning without the lock, so "
                       "processes planning apart may disagree", path, getattr(e, "strerror", None) or e)
    if fd is None:  # (outside the handler: an error while planning is not chained to this one)
        yield
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            logger.warning("jax_blink plan cache: %s is not a regular file; planning without the lock", path)
        else:
            deadline, pause = time.monotonic() + LOCK_WAIT_S, 0.001
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:  # another process plans this request: wait for its entry
                    if time.monotonic() >= deadline:
                        logger.warning("jax_blink plan cache: %s was held for more than %g s; planning "
                                       "without it", path, LOCK_WAIT_S)
                        break
                    time.sleep(pause)
                    pause = min(2 * pause, 0.05)
                except OSError as e:
                    logger.warning("jax_blink plan cache: cannot lock %s (%s); planning without the lock",
                                   path, e.strerror or e)
                    break
        yield
    finally:
        os.close(fd)  # drops the lock


def _disk_load(path: Path, key: dict):
    """The checked plan at ``path``, or None (missing, or refused with a warning)."""
    try:
        text = read_text_file(path, error=PlanError, what="plan cache entry", missing_ok=True)
        if text is None:
            return None
        return check_entry(parse_json(text, error=PlanError, what="plan cache entry"), key)
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as e:  # PlanError, TopologyError
        logger.warning("jax_blink plan cache: ignoring %s and planning afresh: %s", path, e)
        return None


def files_digest(paths) -> str:
    """A digest of the files at ``paths`` (names and bytes), for the key of a cached
    choice that is not re-checked when loaded (:func:`load_keyed`). Where a file cannot
    be read (a zipped install), a token of this process: its entries are then never
    reused by another."""
    digest = hashlib.sha256()
    try:
        for f in paths:
            digest.update(f.name.encode() + b"\0" + f.read_bytes())
    except OSError:
        return f"process-{os.getpid()}-{os.urandom(8).hex()}"
    return digest.hexdigest()[:32]


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """:func:`files_digest` of the pure-Python packages' sources (``topo``,
    ``planning``, ``schedule``, ``sim``) and the settings, so that an upgrade or an
    edit never reuses a choice the current code would not make."""
    root = Path(__file__).resolve().parent.parent
    return files_digest([root / "settings.py"] + sorted(
        f for package in ("topo", "planning", "schedule", "sim") for f in (root / package).glob("*.py")))


def _keyed_path(prefix: str, key: dict) -> Path:
    return cache_dir() / f"{prefix}-{_digest(key)}.json"


def load_keyed(prefix: str, fmt: str, key: dict):
    """The ``"value"`` of the disk entry ``<prefix>-<hash of key>.json`` written by
    :func:`store_keyed` for exactly ``key``, or None: missing, or (with a warning)
    unreadable, corrupt, or written for another key. The caller checks the value
    fits its use; nothing else re-derives it, so ``key`` must hold everything it
    depends on (:func:`source_digest` for the code)."""
    path = _keyed_path(prefix, key)
    try:
        text = read_text_file(path, error=PlanError, what=f"{prefix} cache entry", missing_ok=True)
        if text is None:
            return None
        entry = parse_json(text, error=PlanError, what=f"{prefix} cache entry")
        if not isinstance(entry, dict) or entry.get("format") != fmt or entry.get("key") != key:
            raise PlanError("it was written for another request or version")
        if "value" not in entry:
            raise PlanError("it holds no value")
        return entry["value"]
    except (ValueError, TypeError, RecursionError) as e:  # PlanError is a ValueError
        logger.warning("jax_blink cache: ignoring %s and computing afresh: %s", path, e)
        return None


def store_keyed(prefix: str, fmt: str, key: dict, value) -> None:
    """Keep ``value`` (JSON) on disk for :func:`load_keyed` (atomically, :func:`disk_store`)."""
    disk_store(_keyed_path(prefix, key), json.dumps({"format": fmt, "key": key, "value": value}))


def _not_saved(path: Path, why: str) -> None:
    logger.warning("jax_blink cache: cannot save %s (%s); it is not cached on disk", path, why)


def _read_only(info: os.stat_result, path: Path) -> bool:
    return not info.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(path, os.W_OK)


def disk_store(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, or log why not (also the tuning cache's writer,
    :func:`jax_blink.sim.tune`)."""
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if _read_only(os.stat(directory), directory):
            return _not_saved(path, "the cache directory is read-only")
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            info = None
    except OSError as e:
        return _not_saved(path, e.strerror or str(e))
    if info is not None and stat.S_ISDIR(info.st_mode):
        return _not_saved(path, "a directory is in its place")
    if info is not None and stat.S_ISREG(info.st_mode) and _read_only(info, path):
        return _not_saved(path, "the entry is read-only")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".plan-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        _not_saved(path, e.strerror or str(e))
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
