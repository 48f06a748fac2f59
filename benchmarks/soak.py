"""Long runs: memory and caches stay bounded, and a killed peer never leaves a wrong sum,
a hung job or shared memory behind.

* ``devices``: many jitted psum calls and many distinct shapes on CPU devices of one
  process. Reports resident memory (RSS) at the start, after the calls and after the
  shapes, and the sizes of jax_blink's own caches: the schedule cache
  (``choice.requests.schedule_for``, an LRU of 256), the process plan cache
  (``planning.cache``), the recorded decisions (64 at most) and the in-process rendezvous
  (entries, active and pooled slots, tombstones). Each new shape is a new trace, lowering
  and XLA compilation, so part of the memory growth over the shapes is jax's own
  executable cache, reported separately as the number of compiled executables jax keeps.
* ``host``: the host transport with a peer killed at random. Runs ``--jobs`` local
  jax.distributed jobs of 2 processes x 2 CPU devices (jax_blink.launch.run_local). Each
  process makes ``--calls`` psums of random float32 vectors of random sizes over all 4
  devices, the host transport carrying them (about half of them sums of an intermediate,
  which run in place), and checks every result per element against the exact sum
  (harness.wrong_elements). In every other job process 1 SIGKILLs itself at a random
  call, from a thread while its ranks are inside the call. Counts the calls checked, the
  wrong elements, the jobs that hung (still running at ``--limit`` s), what the survivors
  said, and the entries left in /dev/shm.

    python benchmarks/soak.py devices [--calls 10000] [--shapes 200] [--devices 8] [--out FILE]
    python benchmarks/soak.py host [--jobs 10] [--calls 100] [--limit 180] [--json FILE]

Writes ``benchmarks/results/soak_<machine>.json`` and ``host_soak_<machine>.json``
(``--machine``: another name; ``--out``/``--json``: another file). Exit status 1 when a
sum was wrong (``host``: or a job hung, a clean job erred, or /dev/shm kept entries).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import harness


def devices(args) -> int:
    harness.cpu_devices(args.devices)  # before jax is imported
    import numpy as np
    import psutil

    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_blink
    from jax_blink import _ffi
    from jax_blink.choice import log as _decisions
    from jax_blink.choice import requests as _schedules
    from jax_blink.planning import cache

    proc = psutil.Process(os.getpid())
    n = args.devices
    mesh = jax.make_mesh((n,), ("i",))

    def caches():
        return {"schedules": _schedules.schedule_for.cache_info().currsize,
                "plans_in_process": len(cache._MEMORY_CACHE),
                "decisions": len(_decisions.recent()),
                "rendezvous": _ffi.load_testing().rendezvous_stats()}

    def snapshot(label, t0):
        row = {"at": label, "rss_mib": proc.memory_info().rss / 2**20,
               "seconds": time.perf_counter() - t0, **caches()}
        print(json.dumps(row), flush=True)
        return row

    def step_for(size):
        return jax.jit(jax.shard_map(lambda v: jax_blink.psum(v, "i") * (1.0 / n), mesh=mesh,
                                     in_specs=P("i"), out_specs=P("i")))

    t0 = time.perf_counter()
    x = jax.device_put(np.ones((n, 4096), np.float32), NamedSharding(mesh, P("i")))
    step = step_for(4096)
    for _ in range(50):  # warm up: compile, pools, rendezvous tables
        x = step(x)
    x.block_until_ready()
    rows = [snapshot("start", t0)]
    for k in range(args.calls):
        x = step(x)
        if k % 100 == 0:
            x.block_until_ready()
        if k == args.calls // 2:
            rows.append(snapshot(f"after {k} calls", t0))
    x.block_until_ready()
    ok_calls = bool(np.all(np.asarray(x) == 1.0))
    rows.append(snapshot(f"after {args.calls} calls", t0))
    for k in range(args.shapes):
        size = 1000 + 7 * k
        y = jax.device_put(np.ones((n, size), np.float32), NamedSharding(mesh, P("i")))
        out = step_for(size)(y)
        assert np.all(np.asarray(out) == 1.0), size
        if k == args.shapes // 2:
            rows.append(snapshot(f"after {k} shapes", t0))
    rows.append(snapshot(f"after {args.shapes} shapes", t0))
    result = {"calls": args.calls, "shapes": args.shapes, "devices": n, "calls_correct": ok_calls,
              "rows": rows, "machine": harness.machine(jax=jax.__version__)}
    path = args.out or harness.RESULTS / f"soak_{args.machine or harness.machine_tag()}.json"
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}")
    return 0 if ok_calls else 1


def host_child(calls: int, seed: int, kill_at: int) -> None:
    """One process of a ``host`` job: ``calls`` checked psums; process 1 kills itself at
    call ``kill_at`` (-1: never)."""
    import signal
    import threading

    from jax_blink.launch import initialize

    pid = initialize()
    import numpy as np

    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_blink

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
            wrong += harness.wrong_elements(out, x * np.float32(scale))  # exact: a power of two
            checked += 1
        error = None
    except Exception as e:  # noqa: BLE001 (the survivor of a killed peer)
        error = f"{type(e).__name__}: {str(e)[:300]}"
    harness.print_result({"process": pid, "checked": checked, "wrong": int(wrong), "error": error})
    os._exit(0)  # the coordination service would wait for a killed peer at exit


def host(args) -> int:
    if args.child:
        host_child(*args.child)
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
        rs = run_local([sys.executable, os.path.abspath(__file__), "host", "--child", str(args.calls),
                        str(args.seed * 1000 + j), str(kill_at)], 2, devices_per_process=2,
                       timeout_s=args.limit)
        seconds = time.monotonic() - start
        found = {r.process_id: harness.read_result(r.stdout) for r in rs}
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
    path = args.json or harness.RESULTS / f"host_soak_{args.machine or harness.machine_tag()}.json"
    with open(path, "w") as f:
        json.dump({"machine": harness.machine(), "command": "python benchmarks/soak.py " + " ".join(args.argv),
                   "summary": summary, "jobs": jobs}, f, indent=1)
    print(f"wrote {path}")
    ok = (summary["wrong_elements"] == 0 and summary["hung_jobs"] == 0 and not leftover
          and summary["clean_jobs_with_errors"] == 0)
    return 0 if ok else 1


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="sub", required=True)
    dv = sub.add_parser("devices", help="psum calls and shapes on CPU devices of one process")
    dv.add_argument("--calls", type=int, default=10000)
    dv.add_argument("--shapes", type=int, default=200)
    dv.add_argument("--devices", type=int, default=8)
    dv.add_argument("--out", default=None,
                    help="write the results here (default: benchmarks/results/soak_<machine>.json)")
    dv.set_defaults(run=devices)
    hs = sub.add_parser("host", help="the host transport's jobs, a peer killed in every other one")
    hs.add_argument("--jobs", type=int, default=10)
    hs.add_argument("--calls", type=int, default=100, help="psums per process per job")
    hs.add_argument("--limit", type=float, default=180.0, help="seconds before a job counts as hung")
    hs.add_argument("--seed", type=int, default=0)
    hs.add_argument("--json", help="write the results here (default: benchmarks/results/host_soak_<machine>.json)")
    hs.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)  # a process of a job
    hs.set_defaults(run=host)
    for p in (dv, hs):
        p.add_argument("--machine", help="the machine's name in the default results file (default: this one's)")
    args = ap.parse_args(argv)
    args.argv = argv
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
