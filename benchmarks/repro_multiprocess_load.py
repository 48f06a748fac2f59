"""Issue 44's multi-process segfault: runs the cases of
``tests/multiprocess/test_multiprocess.py::test_collectives_across_processes_match_lax``
(``worker.py cases`` without the host transport, 2 processes x 4 CPU devices and
4 x 2) again and again under CPU load, and reports every process's exit code.

On the GPU image (jax 0.11.2, 16 cores) both cases exited with -11 (SIGSEGV)
after gloo connected while ``pytest -n 14 tests`` ran. This script makes that
load on purpose: ``--burners`` busy processes, and optionally ``--load`` (a
command restarted whenever it ends, e.g. ``pytest -n 12 tests/ops``). Every
process runs with ``PYTHONFAULTHANDLER=1`` (a Python traceback of every thread
on SIGSEGV/SIGABRT, kept from its stderr) and core dumps allowed; with
``--gdb`` each process runs under ``gdb -batch`` instead, which prints the
native backtrace of every thread where it crashes.

    python3 benchmarks/repro_multiprocess_load.py --rounds 20 --burners 16 \\
        --load "python3 -m pytest -q -n 12 -p no:cacheprovider tests/ops" --out /tmp/repro

Prints one line per run (case, seconds, exit codes) and a summary; writes
``summary.json`` and, for every run that failed, each process's stdout/stderr
(and gdb's output) under ``--out``. Exit status: 0 if every run passed, 1 if
any failed, 2 for bad arguments. Run it from the repository root; it starts
only processes it reaps (the burners and the load command are killed at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "multiprocess" / "worker.py"
sys.path.insert(0, str(ROOT))

from jax_blink.launch import run_local  # noqa: E402  (imports no jax)

BURN = "import time\nwhile True:\n    sum(i * i for i in range(100000)); time.sleep(0)\n"
GDB = ["gdb", "-q", "-batch", "-return-child-result", "-ex", "set pagination off",
       "-ex", "handle SIGPIPE nostop noprint", "-ex", "handle SIG32 nostop noprint",
       "-ex", "handle SIG33 nostop noprint", "-ex", "run", "-ex", "bt 40",
       "-ex", "thread apply all bt 25", "--args"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10, help="runs of each case")
    p.add_argument("--cases", default="2x4,4x2",
                   help="PROCESSESxDEVICES, comma-separated (the test's parameters)")
    p.add_argument("--burners", type=int, default=os.cpu_count() or 2,
                   help="busy Python processes running throughout (0: none)")
    p.add_argument("--load", default="", help="a shell command kept running as extra load "
                                               "(restarted when it ends), e.g. a pytest -n K run")
    p.add_argument("--parallel", type=int, default=1,
                   help="jobs of the cases running at once (pytest -n K ran several)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    p.add_argument("--gdb", action="store_true", help="run every process under gdb -batch")
    p.add_argument("--out", default="repro_multiprocess_load", help="directory for the results")
    args = p.parse_args(argv)
    try:
        args.cases = [tuple(int(v) for v in c.split("x")) for c in args.cases.split(",")]
        assert all(len(c) == 2 and min(c) >= 1 for c in args.cases)
    except (ValueError, AssertionError):
        p.error(f"--cases must be like 2x4,4x2, got {args.cases!r}")
    if args.rounds < 1 or args.burners < 0 or args.parallel < 1:
        p.error("--rounds and --parallel must be >= 1, --burners >= 0")
    if args.gdb and shutil.which("gdb") is None:
        p.error("--gdb: gdb is not installed")
    return args


def versions() -> dict:
    code = "import jax, jaxlib; print(jax.__version__, jaxlib.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=120)
    jax_v, jaxlib_v = (out.stdout.split() + ["?", "?"])[:2]
    git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return {"jax": jax_v, "jaxlib": jaxlib_v, "python": platform.python_version(),
            "cpus": os.cpu_count(), "commit": git.stdout.strip() or "?",
            "machine": platform.processor() or platform.machine()}


class Load:
    """The burners and the restarted load command, each in its own session (killed by group)."""

    def __init__(self, burners: int, command: str):
        self.command = command
        self.procs = [subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                      for _ in range(burners)]
        self.load = None
        self.load_runs = 0
        self.poll()

    def poll(self):
        if self.command and (self.load is None or self.load.poll() is not None):
            self.load = subprocess.Popen(self.command, shell=True, cwd=ROOT, start_new_session=True,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.load_runs += 1

    def stop(self):
        for p in self.procs + ([self.load] if self.load else []):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def one_run(processes: int, devices: int, timeout: float, use_gdb: bool):
    env = dict(os.environ, JAX_BLINK_HOST_TRANSPORT="0", PYTHONFAULTHANDLER="1",
               JAX_PLATFORMS="cpu")
    argv = [sys.executable, str(WORKER), "cases"]
    if use_gdb:
        argv = GDB + argv
    start = time.monotonic()
    results = run_local(argv, processes, devices_per_process=devices, timeout_s=timeout, env=env)
    return results, time.monotonic() - start


def passed(r, use_gdb: bool) -> bool:
    if use_gdb:  # gdb's own exit code says little (1 after "No stack."): read what it printed
        return "received signal" not in r.stdout + r.stderr and "FAILED 0" in r.stdout
    return r.ok and "FAILED 0" in r.stdout


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    info = versions()
    print(f"# {info}; core_pattern: {Path('/proc/sys/kernel/core_pattern').read_text().strip()!r}")
    print(f"# {args.rounds} rounds of {args.cases}, {args.burners} burners, load {args.load!r}, "
          f"{args.parallel} at once{', under gdb' if args.gdb else ''}")
    load = Load(args.burners, args.load)
    runs, failed = [], 0
    t0 = time.monotonic()
    try:
        queue = [(r, c) for r in range(args.rounds) for c in args.cases]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(args.parallel) as pool:
            futures = [(r, c, pool.submit(one_run, *c, args.timeout, args.gdb)) for r, c in queue]
            for r, (p, d), fut in futures:
                while not fut.done():
                    load.poll()
                    time.sleep(0.5)
                results, seconds = fut.result()
                ok = all(passed(x, args.gdb) for x in results)
                codes = [x.returncode for x in results]
                load1 = os.getloadavg()[0]
                print(f"round {r:3d} {p}x{d}: {seconds:6.1f} s  load {load1:5.1f}  exit {codes}"
                      f"{'' if ok else '  FAILED'}", flush=True)
                runs.append({"round": r, "case": f"{p}x{d}", "seconds": round(seconds, 1),
                             "load1": round(load1, 1), "exit": codes, "ok": ok})
                if not ok:
                    failed += 1
                    for x in results:
                        stem = out / f"round{r}_{p}x{d}_process{x.process_id}"
                        stem.with_suffix(".stdout").write_text(x.stdout)
                        stem.with_suffix(".stderr").write_text(x.stderr)
                        trace = [ln for ln in x.stderr.splitlines()
                                 if "Fatal Python error" in ln or ln.startswith(("Thread", "  File"))]
                        if trace:
                            print("    process", x.process_id, "|", " | ".join(trace[:6]))
    finally:
        load.stop()
    summary = {"versions": info, "args": {k: v for k, v in vars(args).items() if k != "cases"},
               "cases": [f"{p}x{d}" for p, d in args.cases], "runs": runs, "failed": failed,
               "load_command_runs": load.load_runs, "seconds": round(time.monotonic() - t0, 1)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"# {len(runs)} runs, {failed} failed, {summary['seconds']} s; "
          f"exit codes seen: {sorted({c for x in runs for c in x['exit']}, key=str)}; "
          f"details in {out}")
    cores = [str(c) for c in Path.cwd().glob("core*")] + [str(c) for c in ROOT.glob("core*")]
    if cores:
        print(f"# core files: {sorted(set(cores))} (gdb {sys.executable} CORE, then bt)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
