"""Wrong values under load: N processes (default 2, 4 and 8 in turn) run the
CUDA executor on one GPU at the same time, each calling every kind of
schedule through the single-GPU harness with fresh inputs, and count the
elements that differ from the exact answer.

    python benchmarks/gpu_stress.py [--processes 2 4 8] [--seconds 30]
        [--backend cuda|emulator] [--executor stream|device] [--legacy-upload]
        [--out results.json]

Each worker draws, call after call: a schedule (v1 allreduce trees; v2 trees
for allreduce, its split family, reduce, broadcast, reduce_scatter and
allgather, and rings for allreduce, reduce_scatter and allgather), a reduce
op (sum, max, min), a dtype (float32, bfloat16, int32, uint32), a rank count
(2-8), a size (1,000 to 100,003 elements) and direct or staged reads. Its
inputs are small nonzero integers, so every correct summation order gives
the exact answer in every dtype, and a missing or doubled contribution shows
in any element. Wrong elements, calls and failures are reported per process
count; the exit status is 1 if anything was wrong or a worker failed.

--executor device runs the device executor instead (one kernel per rank per
call): every call builds a fresh executor (``run_device``) and checks its
first call, the call that reads the program and flags its setup wrote, in
memory that other processes' executors freed a moment before; nothing
synchronises the GPU between the setup and the launch but the executor itself.
Errors are counted apart from wrong elements.

--backend emulator runs the same harness code over the host stream emulator
(no GPU; slow, for trying the script); with --executor device, the device
executor's host build with delayed setup writes. --legacy-upload uploads the inputs
the way that once gave wrong sums (on the legacy default stream, which the executor's
non-blocking streams do not wait for): on a GPU it should reproduce them, which
confirms their cause.

Recorded results: benchmarks/results/gpu_stress_*.json.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import harness

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # reference.py: the schedules and their exact answers

DTYPES = ["float32", "bfloat16", "int32", "uint32"]
OPS = ["sum", "max", "min"]


def cases(rng):
    """One random (name, Schedule, encoded words) to run."""
    from jax_blink.schedule import Schedule
    from reference import lowered, v1_words, v2_schedules

    n = int(rng.choice([2, 3, 4, 5, 8]))
    dtype = str(rng.choice(DTYPES))
    count = int(rng.choice([1000, 4099, 20_000, 100_003]))
    chunks = int(rng.choice([1, 3, 8]))
    if rng.random() < 0.25:
        s = Schedule.decode(lowered(n, count, dtype, chunks))
        return f"v1:allreduce n={n} {dtype} count={count} chunks={chunks}", s, v1_words(s)
    op = str(rng.choice(OPS))
    count -= count % n
    schedules = v2_schedules(n, count, dtype, op, chunks=chunks)
    name = str(rng.choice(sorted(schedules)))
    s = schedules[name]
    return f"v2:{name} {op} n={n} {dtype} count={count} chunks={chunks}", s, np.asarray(s.encode())


def inputs_for(s, rng):
    from reference import NP_DTYPES

    np_dtype = NP_DTYPES[s.dtype]
    signs = rng.choice([-1, 1], size=(s.nranks, s.in_count))
    if s.dtype == "uint32":
        signs = np.ones_like(signs)
    vals = rng.integers(1, 16, size=(s.nranks, s.in_count)) * signs
    return [np.ascontiguousarray(v.astype(np.float64).astype(np_dtype)) for v in vals]


def expected(s, inputs, r):
    """Rank r's exact output, or None where the collective leaves it undefined."""
    from reference import NP_DTYPES, reduce_reference

    op = getattr(s, "op", "sum")
    coll = s.collective
    if coll == "broadcast":
        return inputs[s.root]
    if coll == "allgather":
        return np.concatenate(inputs)
    if coll == "reduce" and r != s.root:
        return None
    if op == "sum":  # exact: small integers, in float64 or the integer type (wrapping)
        wide = np.float64 if s.dtype in ("float32", "bfloat16") else NP_DTYPES[s.dtype]
        total = np.sum([x.astype(wide) for x in inputs], axis=0)
        full = total.astype(NP_DTYPES[s.dtype])
    else:
        full = reduce_reference(op, s.dtype, inputs)
    if coll == "reduce_scatter":
        lo, hi = s.shard(r)
        return full[lo:hi]
    return full


def worker(args):
    from jax_blink import _ffi

    rng = np.random.default_rng(args.seed)
    if args.backend == "cuda":
        from jax_blink import _blink_cuda

        if _blink_cuda.device_count() < 1:
            sys.exit("gpu_stress: no CUDA device")
        testing = _ffi.load_cuda_testing()

        def run(words, inputs, direct):
            if args.executor == "device":
                res = testing.run_device(words, inputs)
                return res["errors"][0], res["outputs"]
            return [None], testing.run_schedule(words, inputs, direct=direct,
                                                legacy_upload=args.legacy_upload)
    else:
        testing = _ffi.load_testing()

        def run(words, inputs, direct):
            if args.executor == "device":
                (errors, outputs), = testing.run_fresh_device_executors(words, inputs, executors=1)[0]
                return errors, outputs
            return [None], testing.emulate_run_schedule(
                words, inputs, direct=direct, seed=int(rng.integers(1 << 30)),
                legacy_upload=args.legacy_upload)["outputs"]
    calls = wrong = wrong_calls = elements = errors = 0
    examples = []
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and (args.calls == 0 or calls < args.calls):
        name, s, words = cases(rng)
        inputs = inputs_for(s, rng)
        direct = bool(rng.random() < 0.5)
        errs, outs = run(words, inputs, direct)
        calls += 1
        if any(e is not None for e in errs):
            errors += 1
            if len(examples) < 10:
                examples.append(f"{name}: {next(e for e in errs if e is not None)[:300]}")
            continue
        bad = 0
        for r in range(s.nranks):
            want = expected(s, inputs, r)
            if want is None:
                continue
            bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[want.dtype.itemsize]
            diff = int(np.count_nonzero(outs[r].view(bits) != want.view(bits)))
            elements += want.size
            if diff:
                bad += diff
                if len(examples) < 10:
                    examples.append(f"{name} {'direct' if direct else 'staged'} rank {r}: "
                                    f"{diff} of {want.size} elements wrong")
        wrong += bad
        wrong_calls += bad > 0
    harness.print_result({"calls": calls, "wrong_elements": wrong, "wrong_calls": wrong_calls,
                          "errors": errors, "elements_checked": elements, "examples": examples})


def run_processes(nprocs, args):
    """Starts nprocs workers at once; returns their results and failures (all reaped)."""
    cmd = [sys.executable, __file__, "--worker", "--seconds", str(args.seconds), "--calls",
           str(args.calls), "--backend", args.backend, "--executor", args.executor] + (
               ["--legacy-upload"] if args.legacy_upload else [])
    procs = [subprocess.Popen(cmd + ["--seed", str(1000 * nprocs + i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
             for i in range(nprocs)]
    results, failures = [], []
    limit = time.monotonic() + args.seconds + args.grace
    for i, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(1.0, limit - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            failures.append(f"process {i}: no result within {args.seconds + args.grace} s (killed)")
            continue
        result = harness.read_result(out)
        if p.returncode != 0 or result is None:
            failures.append(f"process {i}: exit {p.returncode}: {err[-1500:]}")
        else:
            results.append(result)
    return results, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, nargs="*", default=[2, 4, 8])
    ap.add_argument("--seconds", type=float, default=30.0, help="per process count")
    ap.add_argument("--calls", type=int, default=0, help="stop a worker after this many calls (0: time only)")
    ap.add_argument("--grace", type=float, default=120.0, help="seconds past --seconds before a worker is killed")
    ap.add_argument("--backend", choices=["cuda", "emulator"], default="cuda")
    ap.add_argument("--executor", choices=["stream", "device"], default="stream")
    ap.add_argument("--legacy-upload", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    rows, status = [], 0
    print(f"{'procs':>5} {'calls':>8} {'wrong calls':>11} {'wrong elements':>14} {'errors':>6} "
          f"{'failed':>6}")
    for n in args.processes:
        results, failures = run_processes(n, args)
        row = {"processes": n, "executor": args.executor, "calls": sum(r["calls"] for r in results),
               "wrong_calls": sum(r["wrong_calls"] for r in results),
               "wrong_elements": sum(r["wrong_elements"] for r in results),
               "errors": sum(r["errors"] for r in results),
               "elements_checked": sum(r["elements_checked"] for r in results),
               "failures": failures, "examples": [e for r in results for e in r["examples"]][:10]}
        if args.executor == "device":
            row["fresh_executors"] = row["calls"]  # each call is a new executor's first
        rows.append(row)
        print(f"{n:>5} {row['calls']:>8} {row['wrong_calls']:>11} {row['wrong_elements']:>14} "
              f"{row['errors']:>6} {len(failures):>6}", flush=True)
        for line in failures + row["examples"]:
            print("   ", line)
        if failures or row["wrong_elements"] or row["errors"]:
            status = 1
    gpu = None
    if args.backend == "cuda":
        from bench_cuda import gpu_name
        gpu = gpu_name()
    doc = {"machine": harness.machine(gpu=gpu), "backend": args.backend, "executor": args.executor,
           "legacy_upload": args.legacy_upload, "seconds_per_count": args.seconds, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
