"""Which processes of a job share a host, and the host transport between them.

Processes on one host share memory: a collective whose devices all live on
one host runs as one schedule over all of them, whatever the number of
processes, its ranks meeting in shared memory (``cc/sync/host_rendezvous.h``:
each process's arena is an anonymous memory file that the others map through
``/proc/<pid>/fd/<fd>``; nothing is named in ``/dev/shm``, so nothing is left
behind when the job ends, by a crash included).

:func:`hosts` finds out, once per process and identically on every process:

1. each process computes its host key: the kernel's boot id, its pid
   namespace and its user id (processes with equal keys can open each other's
   ``/proc/<pid>/fd``), and creates its arena;
2. the job gathers every process's key, pid and arena descriptor
   (``multihost_utils.process_allgather``, which every process of a jax job
   calls at the same point of its program: the first trace of a jax_blink
   collective whose devices span processes);
3. each process maps the arenas of the processes with its key, and the job
   gathers who succeeded: a host's transport is ready when all of its
   processes did.

Only processes of one job learn each other's descriptors, so two jobs on one
host never meet. ``process_allgather`` cannot run inside a trace, so the
gathers run on a helper thread (jax's trace state is per thread), bounded by
``JAX_BLINK_TIMEOUT_S``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import os
import threading
from typing import Optional

import numpy as np

import jax

from jax_blink import settings

__all__ = ["Hosts", "hosts", "host_key"]


@dataclasses.dataclass(frozen=True)
class Hosts:
    """The job's processes by host (the same on every process).

    ``host_of[p]``: the host index of process ``p`` (hosts numbered in order
    of their first process); ``ready[h]``: host ``h``'s transport is attached
    in all of its processes; ``reason``: why the transport is unavailable
    where it is not (None when every host with several processes is ready).
    """

    host_of: tuple
    ready: tuple
    reason: Optional[str] = None

    def one_host(self, processes) -> Optional[int]:
        """The host of ``processes`` when they all share one whose transport
        is ready, else None."""
        hs = {self.host_of[p] for p in processes}
        if len(hs) != 1:
            return None
        h = hs.pop()
        return h if self.ready[h] else None


def host_key() -> bytes:
    """16 bytes equal for processes that can map each other's arenas: the
    same kernel boot, pid namespace and user (and ``JAX_BLINK_HOST_KEY``'s
    label, which keeps processes of one machine apart as if on other hosts)."""
    parts = []
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
    except OSError:
        parts.append(f"no boot id: {os.uname().nodename}")
    try:
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        parts.append("no pid namespace")
    parts.append(str(os.getuid()))
    parts.append(settings.host_label())
    return hashlib.sha256("\0".join(parts).encode()).digest()[:16]


_lock = threading.Lock()
_hosts: Optional[Hosts] = None


def hosts() -> Hosts:
    """The job's :class:`Hosts`, found once per process (module docstring).
    A single-process job is one host with nothing to attach."""
    global _hosts
    with _lock:
        if _hosts is None:
            _hosts = _discover()
        return _hosts


def _gather(row: np.ndarray) -> np.ndarray:
    """Every process's ``row`` (int32), in process order, gathered off the
    tracing thread; a process that does not take part within the timeout is
    an error."""
    from jax.experimental import multihost_utils

    timeout_s = settings.timeout_ms(None) / 1000
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jax_blink_hosts")
    try:
        future = pool.submit(lambda: np.asarray(multihost_utils.process_allgather(row)))
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        raise RuntimeError(
            f"jax_blink: finding which processes share a host timed out after {timeout_s:g} s: "
            "some process of the job did not trace the same jax_blink collective (every process "
            "must run the same program)") from None
    except Exception as e:  # noqa: BLE001 (jax's error, whatever its type, said in ours)
        raise RuntimeError(
            "jax_blink: finding which processes share a host failed (every process of the job "
            "must trace the same jax_blink collective; JAX_BLINK_HOST_TRANSPORT=0 skips this "
            f"step): {type(e).__name__}: {e}") from e
    finally:
        pool.shutdown(wait=False)


def _discover() -> Hosts:
    n = jax.process_count()
    if n == 1:
        return Hosts(host_of=(0,), ready=(True,))
    from jax_blink import _ffi

    ext = _ffi.load_extension()
    try:
        pid, fd = ext.host_arena()
    except RuntimeError as e:  # the job still agrees: this process reports no arena
        pid, fd, arena_error = os.getpid(), -1, str(e)
    else:
        arena_error = None
    key = np.frombuffer(host_key(), np.int32)
    rows = _gather(np.concatenate([key, np.asarray([pid, fd], np.int32)]))
    keys = [bytes(r[:4].tobytes()) for r in rows]
    order = list(dict.fromkeys(keys))
    host_of = tuple(order.index(k) for k in keys)
    me = jax.process_index()
    mine = [p for p in range(n) if keys[p] == keys[me]]
    error = arena_error
    if error is None and len(mine) > 1:
        if any(int(rows[p][5]) < 0 for p in mine):
            error = "a process of this host has no arena"
        else:
            try:
                ext.host_attach(mine.index(me), [(int(rows[p][4]), int(rows[p][5])) for p in mine])
            except RuntimeError as e:
                error = str(e)
    ok = _gather(np.asarray([0 if error else 1], np.int32)).reshape(-1)
    ready = tuple(all(ok[p] for p in range(n) if host_of[p] == h) for h in range(len(order)))
    reason = None
    if not all(ready[h] or host_of.count(h) == 1 for h in range(len(order))):
        reason = (error or "a process of this host could not map the others' shared memory "
                  "(see its explain())")
    return Hosts(host_of=host_of, ready=ready, reason=reason)
