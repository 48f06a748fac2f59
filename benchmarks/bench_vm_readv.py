"""Why the host transport copies through shared memory instead of reading peers in place.

Single-copy reads between processes (``process_vm_readv``) would let a rank read another
process's input where it lies instead of that process copying it into its shared arena
first. This times, on this machine, reading 16 MB of a forked child's memory with
``process_vm_readv`` (whole, and in 64 KiB blocks into a buffer that stays in cache)
against ``memcpy`` of the same bytes inside one process; medians of 20. On the 2-core
AMD EPYC VM: memcpy 0.65-0.71 ms, process_vm_readv whole 2.3 ms (in blocks 3.0-3.2 ms,
a ctypes call per block included), so the copy it would save costs less than the read
(docs/multihost.md).

Usage: ``python benchmarks/bench_vm_readv.py [--mbytes 16] [--reps 20]``. Linux only.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import statistics
import time

import numpy as np


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mbytes", type=int, default=16)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    n = args.mbytes << 20
    src = np.ones(n, np.uint8)
    dst = np.zeros(n, np.uint8)
    block = np.zeros(64 << 10, np.uint8)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.process_vm_readv.restype = ctypes.c_ssize_t
    child = os.fork()
    if child == 0:  # holds the same memory at the same address until killed
        signal.pause()
        os._exit(0)
    try:
        def read(to, to_len, frm, length):
            local, remote = _IoVec(to, to_len), _IoVec(frm, length)
            got = libc.process_vm_readv(child, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
            if got != length:
                raise OSError(ctypes.get_errno(), f"process_vm_readv: {os.strerror(ctypes.get_errno())}")

        def whole():
            read(dst.ctypes.data, n, src.ctypes.data, n)

        def blocks():
            for off in range(0, n, block.size):
                read(block.ctypes.data, block.size, src.ctypes.data + off, block.size)

        def timed(f):
            f()
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                f()
                times.append(time.perf_counter() - t0)
            return statistics.median(times) * 1e3

        rows = {"memcpy": timed(lambda: np.copyto(dst, src)),
                "process_vm_readv whole": timed(whole),
                "process_vm_readv 64 KiB blocks": timed(blocks)}
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    for name, ms in rows.items():
        print(f"{name:>32}: {ms:.2f} ms for {args.mbytes} MB ({args.mbytes / ms:.1f} GB/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
