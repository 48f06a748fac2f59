"""The C++ CPU executor alone (no jax dispatch), against a plain numpy copy.

Runs the shm:N allreduce schedule that jax_blink.psum uses on N CPU devices
through ``_blink_testing.run_ranks`` (one thread per rank, ``repeat`` calls on
the same threads, as a call site inside ``lax.scan``), and reports per call:
time, algbw (S/t, nccl-tests), the memory traffic the executor must move at
least (every rank reads its input and writes its output: 2·N·S bytes) as
GB/s, and a single-thread numpy copy of the same per-rank bytes for scale.

    python benchmarks/bench_executor_cpu.py [--sizes 1e4,1e5,1e6,1e7] [--ranks 8]
        [--dtype float32] [--out benchmarks/results/executor_cpu.json]

Timings are medians over interleaved rounds; on a shared machine they are
only as good as the machine is idle (the user/sys CPU time columns are less
sensitive to other load).
"""

import argparse
import json
import os
import platform
import resource
import time

import numpy as np

from jax_blink import _ffi
from jax_blink.planning import plan
from jax_blink.topo import Topology


def numpy_copy_seconds(nbytes, rounds):
    a = np.ones(nbytes // 4, np.float32)
    b = np.empty_like(a)
    reps = max(3, int(2e8 // max(nbytes, 1)))
    best = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            np.copyto(b, a)
        best.append((time.perf_counter() - t) / reps)
    return float(np.median(best))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e4,1e5,1e6,1e7")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    harness = _ffi.load_testing()
    n = args.ranks
    p = plan(Topology.preset(f"shm:{n}"), "allreduce")
    itemsize = np.dtype(args.dtype).itemsize
    rows = []
    print(f"# executor alone: {n} ranks, {args.dtype}, {os.cpu_count()} cores, "
          f"{platform.processor() or platform.machine()}")
    print(f"{'size(B)':>12} {'count':>10} {'us':>10} {'algbw':>7} {'min_traffic_GB/s':>17} "
          f"{'np_copy_GB/s':>13} {'user_us':>8} {'sys_us':>7}")
    for count in [int(float(s)) for s in args.sizes.split(",")]:
        schedule = p.lower(count * itemsize, args.dtype)
        enc = np.asarray(schedule.encode())
        rng = np.random.default_rng(0)
        ins = [rng.standard_normal(count).astype(args.dtype) for _ in range(n)]
        outs = [np.empty_like(x) for x in ins]
        reps = max(3, int(3e8 // (count * itemsize * n)))
        assert harness.run_ranks(enc, ins, outs, 60000, repeat=2) == [None] * n
        walls, users, syss = [], [], []
        for _ in range(args.rounds):
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t = time.perf_counter()
            errors = harness.run_ranks(enc, ins, outs, 60000, repeat=reps)
            walls.append((time.perf_counter() - t) / reps)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            users.append((r1.ru_utime - r0.ru_utime) / reps)
            syss.append((r1.ru_stime - r0.ru_stime) / reps)
            assert errors == [None] * n, errors
        ref = np.sum(np.stack(ins).astype(np.float64), axis=0)
        wrong = int(np.sum(np.abs(outs[0] - ref) > 1e-3 * (1 + np.abs(ref))))
        t = float(np.median(walls))
        size = count * itemsize
        row = dict(size_bytes=size, count=count, time_us=t * 1e6, algbw_gbps=size / t / 1e9,
                   min_traffic_gbps=2 * n * size / t / 1e9,
                   numpy_copy_gbps=2 * size / numpy_copy_seconds(size, 3) / 1e9,
                   user_us=float(np.median(users)) * 1e6, sys_us=float(np.median(syss)) * 1e6,
                   wrong=wrong, chunks=len(schedule.chunks), steps=schedule.num_steps)
        rows.append(row)
        print(f"{size:>12} {count:>10} {row['time_us']:>10.1f} {row['algbw_gbps']:>7.2f} "
              f"{row['min_traffic_gbps']:>17.2f} {row['numpy_copy_gbps']:>13.2f} "
              f"{row['user_us']:>8.0f} {row['sys_us']:>7.0f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(machine=dict(cores=os.cpu_count(), cpu=platform.processor()),
                           ranks=n, dtype=args.dtype, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
