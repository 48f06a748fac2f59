"""Soak of the host transport with a peer killed at random.

Runs ``--jobs`` local jax.distributed jobs of 2 processes x 2 CPU devices
(jax_blink.launch.run_local). Each process makes ``--calls`` psums of random
float32 vectors of random sizes over all 4 devices, the host transport
carrying them (about half of them sums of an intermediate, which run in
place), and checks every result per element against numpy's sum
(jax_blink.numerics). In every other job process 1 SIGKILLs itself at a
random call, from a thread while its ranks are inside the call. Counts the
calls checked, the wrong elements, the jobs that hung (still running at
``--limit`` s), what the survivors said, and the entries left in /dev/shm.

    python benchmarks/host_soak.py [--jobs 10] [--calls 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _machine  # noqa: E402


def child(calls: int, seed: int, kill_at: int) -> None:
    import signal
    import threading

    from jax_blink.launch import initialize

    pid = initialize()
    import numpy as np

    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_blink
    from jax_blink import numerics

    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("i",))
    fns = {}
    checked = wrong = 0
    rng = np.random.default_rng(seed)  # the same draws in every process
    try:
        for call in range(calls):
            size = int(rng.choice([1, 7, 100, 1000, 4096, 100_000, 1 << 20]))
            scale = int(rng.integers(1, 3))  # 2: the sum of an intermediate, run in place
            x = rng.standard_normal((n, size)).astype(np.float32)
            if (size, scale) not in fns:
                fns[size, scale] = jax.jit(jax.shard_map(
                    lambda v, s=scale: jax_blink.psum(v * s if s != 1 else v, "i", timeout_s=10),
                    mesh=mesh, in_specs=P("i"), out_specs=P()))
            xs = jax.make_array_from_callback(x.shape, NamedSharding(mesh, P("i")), lambda i: x[i])
            if pid == 1 and call == kill_at:
                threading.Thread(target=fns[size, scale], args=(xs,), daemon=True).start()
                time.sleep(float(rng.uniform(0, 0.002)))  # often inside the call
                os.kill(os.getpid(), signal.SIGKILL)
            out = np.asarray(fns[size, scale](xs).addressable_shards[0].data)[0]
            y = x * np.float32(scale)  # exact: a power of two
            wrong += numerics.wrong_vs_reference(out, y.sum(0), np.abs(y).sum(0), n)
            checked += 1
        error = None
    except Exception as e:  # noqa: BLE001 (the survivor of a killed peer)
        error = f"{type(e).__name__}: {str(e)[:300]}"
    print("RESULT " + json.dumps({"process": pid, "checked": checked, "wrong": int(wrong),
                                  "error": error}), flush=True)
    os._exit(0)  # the coordination service would wait for a killed peer at exit


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--calls", type=int, default=100, help="psums per process per job")
    ap.add_argument("--limit", type=float, default=180.0, help="seconds before a job counts as hung")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    import random

    from jax_blink.launch import run_local

    def shm():
        return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()

    before = shm()
    rnd = random.Random(args.seed)
    jobs = []
    for j in range(args.jobs):
        kill_at = rnd.randrange(args.calls) if j % 2 else -1
        start = time.monotonic()
        rs = run_local([sys.executable, os.path.abspath(__file__), "--child", str(args.calls),
                        str(args.seed * 1000 + j), str(kill_at)], 2, devices_per_process=2,
                       timeout_s=args.limit)
        seconds = time.monotonic() - start
        found = {}
        for r in rs:
            line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
            found[r.process_id] = json.loads(line[7:]) if line else None
        jobs.append({"kill_at": kill_at, "seconds": round(seconds, 2),
                     "hung": any(r.returncode is None for r in rs),
                     "exit": [r.returncode for r in rs], "processes": found})
        p0 = found.get(0) or {}
        print(f"job {j}: kill at {kill_at:>3}  {seconds:5.1f} s  exits {jobs[-1]['exit']}  "
              f"checked {p0.get('checked')}  wrong {p0.get('wrong')}  error {p0.get('error')}")
    leftover = sorted(shm() - before)
    summary = {
        "calls_checked": sum((p or {}).get("checked", 0) for job in jobs for p in job["processes"].values()),
        "wrong_elements": sum((p or {}).get("wrong", 0) for job in jobs for p in job["processes"].values()),
        "hung_jobs": sum(job["hung"] for job in jobs),
        "killed_jobs": sum(job["kill_at"] >= 0 for job in jobs),
        "survivor_errors_naming_the_exit": sum(
            "has exited" in ((job["processes"].get(0) or {}).get("error") or "")
            for job in jobs if job["kill_at"] >= 0),
        "clean_jobs_with_errors": sum(
            any((p or {}).get("error") for p in job["processes"].values())
            for job in jobs if job["kill_at"] < 0),
        "dev_shm_left": leftover,
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": _machine.machine(),
                       "command": "python benchmarks/host_soak.py " + " ".join(argv or sys.argv[1:]),
                       "summary": summary, "jobs": jobs}, f, indent=1)
        print(f"wrote {args.json}")
    ok = (summary["wrong_elements"] == 0 and summary["hung_jobs"] == 0 and not leftover
          and summary["clean_jobs_with_errors"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
