"""Run a jax program as several local processes (``jax.distributed`` on
127.0.0.1), the way a multi-host job runs one process per host: to try the
multi-process path on one machine, in the tests, the multi-process benchmark
and ``examples/flax_resnet.py --processes N``.

:func:`run_local` starts ``N`` copies of a command with the coordinator's
address (a free local port), the process id and the device count in the
environment, waits for all of them within a time limit and reaps every one;
:func:`initialize`, called at the top of that program, joins the job
(``jax.distributed.initialize``, with gloo as the CPU collectives).

On real hosts, call ``jax.distributed.initialize(coordinator, num_processes,
process_id)`` yourself (docs/multihost.md).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

from jax_blink.settings import set_xla_cpu_threads

__all__ = ["ProcessResult", "free_port", "run_local", "initialize", "ENV"]

# what run_local tells each process (initialize reads them)
ENV = {"coordinator": "JAX_BLINK_COORDINATOR", "processes": "JAX_BLINK_NUM_PROCESSES",
       "process_id": "JAX_BLINK_PROCESS_ID"}


@dataclasses.dataclass
class ProcessResult:
    process_id: int
    returncode: Optional[int]  # None: killed at the time limit
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_local(argv: Sequence[str], processes: int, *, devices_per_process: int = 4,
              timeout_s: float = 300.0, env: Optional[dict] = None) -> list:
    """Runs ``argv`` as ``processes`` local processes of one jax job, each with
    ``devices_per_process`` CPU devices; returns a :class:`ProcessResult` per
    process. A process still running after ``timeout_s`` is killed (with its
    children) and reported with ``returncode`` None; none is left behind.

    The processes run on jax's CPU platform (``JAX_PLATFORMS=cpu``, whatever
    the environment says): on a machine with a GPU, jax would otherwise start
    its GPU backend in every process too (and make it the default where
    JAX_PLATFORMS names it first or is unset)."""
    if processes < 1:
        raise ValueError(f"run_local: processes must be >= 1, got {processes}")
    base = dict(os.environ if env is None else env)
    base[ENV["coordinator"]] = f"127.0.0.1:{free_port()}"
    base[ENV["processes"]] = str(processes)
    flags = [f for f in base.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    base["XLA_FLAGS"] = " ".join(flags + [
        f"--xla_force_host_platform_device_count={devices_per_process}"])
    base["JAX_PLATFORMS"] = "cpu"
    set_xla_cpu_threads(devices_per_process, env=base)  # a pool that cannot deadlock queued collectives
    procs, files = [], []
    try:
        for pid in range(processes):
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            files.append((out, err))
            procs.append(subprocess.Popen(
                list(argv), env={**base, ENV["process_id"]: str(pid)}, stdout=out, stderr=err,
                start_new_session=True))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.05)
        codes = [p.poll() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    results = []
    for pid, (p, (out, err)) in enumerate(zip(procs, files)):
        out.seek(0), err.seek(0)
        results.append(ProcessResult(pid, codes[pid], out.read(), err.read()))
        out.close(), err.close()
    return results


def initialize() -> int:
    """Joins the job :func:`run_local` started (a no-op outside one); returns
    this process's id. CPU collectives across processes use gloo."""
    import jax

    if ENV["coordinator"] not in os.environ:
        return 0
    pid = int(os.environ[ENV["process_id"]])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(os.environ[ENV["coordinator"]],
                               int(os.environ[ENV["processes"]]), pid)
    return pid


if __name__ == "__main__":  # python -m jax_blink.launch N script.py [args...]
    if len(sys.argv) < 3 or not sys.argv[1].isdigit() or int(sys.argv[1]) < 1:
        sys.exit("usage: python -m jax_blink.launch N script.py [args...]  (N >= 1 local "
                 "processes; the script calls jax_blink.launch.initialize() before it uses jax)")
    n, *command = sys.argv[1:]
    for r in run_local([sys.executable, *command], int(n)):
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        print(f"process {r.process_id}: exit {r.returncode}", file=sys.stderr)
