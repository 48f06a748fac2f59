"""What a multi-process psum does when a process fails it: how long the
survivor takes to fail, and with which error (docs/multihost.md). Each
scenario is a 2 x 4 CPU-device job of tests/multiprocess/worker.py, psum over
("host", "local"):

* ``absent``: process 1 never makes the first call;
* ``dies``: after one call both made, process 1 exits;
* ``absent-later``: after one call both made, process 1 (alive) skips the next;
* ``killed``: process 1 is SIGKILLed while its ranks wait inside a call.

By default the processes share memory (the host transport);
``--no-host-transport`` runs the path processes on different hosts take
(in-process phases, gloo across). Every process is killed at ``--limit``
seconds if still running (reported as "killed"). About 5 minutes with the
default limits.

    python benchmarks/multiprocess_faults.py [--scenarios absent dies] [--limit 150]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "multiprocess", "worker.py")


def first_error(text):
    for line in text.splitlines():
        if line.startswith("ERROR"):
            return line[:200]
    return "-"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", nargs="+", default=["absent", "dies", "absent-later", "killed"],
                    choices=["absent", "dies", "absent-later", "killed"])
    ap.add_argument("--no-host-transport", action="store_true",
                    help="JAX_BLINK_HOST_TRANSPORT=0: the path of processes on different hosts")
    ap.add_argument("--limit", type=float, default=150.0,
                    help="seconds after which a process still running is killed")
    args = ap.parse_args(argv)
    from jax_blink.launch import run_local

    for scenario in args.scenarios:
        start = time.monotonic()
        env = dict(os.environ, JAX_BLINK_HOST_TRANSPORT="0" if args.no_host_transport else "1")
        results = run_local([sys.executable, WORKER, scenario], 2, devices_per_process=4,
                            timeout_s=args.limit, env=env)
        seconds = time.monotonic() - start
        print(f"\n{scenario}: {seconds:.0f} s until every process ended or was killed")
        for r in results:
            end = "killed" if r.returncode is None else f"exit {r.returncode}"
            print(f"  process {r.process_id}: {end}; error seen: {first_error(r.stdout)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
