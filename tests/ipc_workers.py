"""Processes that meet through the host rendezvous of the CUDA testing module: shared by
tests/executor/test_cuda_ipc.py and benchmarks/bench_cuda_ipc.py (GPU only)."""

import json
import subprocess
import sys

#: The start of a worker script run by :func:`run_workers` (argv: its rank, then a job
#: directory): it prints the CUDA testing module's host arena, reads the job (every
#: process's arena, and what :func:`run_workers` was given) and attaches to the others.
#: Defines ``cuda``, ``rank``, ``job_dir``, ``job`` and ``np``.
CUDA_WORKER_PREAMBLE = r"""
import json, sys
import numpy as np
from jax_blink import _ffi
cuda = _ffi.load_cuda_testing()
rank, job_dir = int(sys.argv[1]), sys.argv[2]
print(json.dumps(list(cuda.host_arena())), flush=True)
job = json.loads(sys.stdin.readline())
cuda.host_attach(rank, [tuple(p) for p in job["processes"]])
"""


def run_workers(script, nprocs, *args, timeout=240, **job):
    """Starts `script` in `nprocs` processes (argv: its rank, then `args`), hands every one
    the arenas of all (they print theirs first) with `job`, and returns what each printed
    last, as JSON; a process that fails raises AssertionError with its stderr, and every
    process is reaped."""
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), *map(str, args)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(nprocs)]
    try:
        arenas = [json.loads(p.stdout.readline()) for p in procs]
        for p in procs:
            p.stdin.write(json.dumps({"processes": arenas, **job}) + "\n")
            p.stdin.flush()
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, err
            outs.append(json.loads(out.splitlines()[-1]))
        return outs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
