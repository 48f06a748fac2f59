"""Ranks in several processes of one GPU over CUDA IPC against the same ranks as
threads of one process: a float32 allreduce (the planner's schedule for
``shm:P``) at each size, P processes of one rank each
(``_blink_cuda_testing.ipc_run_rank``: the stream executor, its peers' inputs,
accumulators and events opened through CUDA IPC, meeting through the host
rendezvous) and P rank threads in one process (``time_schedule``).

    python benchmarks/bench_cuda_ipc.py [--processes 2 4] [--mbytes 1 64]
        [--iters 20] [--out results.json]

Reported per (P, size): seconds per call each way (across processes: the
slowest rank's wall time per call, ``iters`` calls back to back then a sync;
a rank exports its handles once, and every call meets its peers through the
host rendezvous and reads their event handles anew) and the ratio, and the
elements of the last output farther from the exact sum than rounding allows
(harness.wrong_elements; must be 0). Needs an NVIDIA GPU.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

import harness
from bench_cuda import gpu_name, load_cuda

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from ipc_workers import CUDA_WORKER_PREAMBLE, run_workers  # noqa: E402

_WORKER = CUDA_WORKER_PREAMBLE + r"""
sched = np.fromfile(f"{job_dir}/sched.bin", dtype=np.int64)
x = np.fromfile(f"{job_dir}/in{rank}.bin", dtype=np.float32)
cuda.ipc_run_rank(sched, rank, x, site=1, calls=2)  # warm-up: opens the peers' handles
res = cuda.ipc_run_rank(sched, rank, x, site=2, calls=job["iters"], timed=True)
res["output"].tofile(f"{job_dir}/out{rank}.bin")
print(json.dumps({"seconds": res["seconds"]}), flush=True)
"""


def across_processes(job_dir: Path, nprocs: int, iters: int) -> float:
    """The slowest rank's seconds per call, one rank per process."""
    return max(o["seconds"] for o in run_workers(_WORKER, nprocs, job_dir, timeout=300, iters=iters))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, nargs="*", default=[2, 4])
    ap.add_argument("--mbytes", type=float, nargs="*", default=[1.0, 64.0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cuda = load_cuda()

    import jax_blink
    from jax_blink.planning import CUDA_LAUNCH_SECONDS

    rows = []
    for nprocs in args.processes:
        plan = jax_blink.plan(jax_blink.Topology.preset(f"shm:{nprocs}"))
        for mbytes in args.mbytes:
            count = int(mbytes * 1e6) // 4
            sched = np.asarray(plan.lower(count * 4, "float32", launch_s=CUDA_LAUNCH_SECONDS).encode(),
                               dtype=np.int64)
            rng = np.random.default_rng(nprocs)
            inputs = [rng.integers(-1000, 1000, count).astype(np.float32) for _ in range(nprocs)]
            in_process = cuda.time_schedule(sched, iters=args.iters)["seconds"]
            with tempfile.TemporaryDirectory() as d:
                job = Path(d)
                sched.tofile(job / "sched.bin")
                for r, x in enumerate(inputs):
                    x.tofile(job / f"in{r}.bin")
                across = across_processes(job, nprocs, args.iters)
                wrong = sum(harness.wrong_elements(np.fromfile(job / f"out{r}.bin", dtype=np.float32), inputs)
                            for r in range(nprocs))
            row = dict(processes=nprocs, bytes_per_rank=count * 4, in_process_s=in_process,
                       across_processes_s=across, ratio=across / in_process, wrong=wrong)
            rows.append(row)
            print(f"{nprocs} x {count * 4 / 1e6:g} MB: one process {in_process * 1e3:.3f} ms, "
                  f"{nprocs} processes {across * 1e3:.3f} ms ({across / in_process:.2f}x), "
                  f"{wrong} wrong", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": harness.machine(gpu=gpu_name()),
                                              "iters": args.iters, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
