"""CUDA executor on one GPU: reduction kernel bandwidth against a device-to-
device copy, and an allreduce of N simulated ranks (default 8) at 256 MB per
rank, all on one GPU through ``jax_blink._blink_cuda_testing``.

    python benchmarks/bench_cuda.py [--ranks 8] [--mbytes 256 ...] [--dtype float32]
        [--iters 10] [--staged] [--preset shm:8] [--executors stream device]
        [--out results.json]

    # both executors side by side at 1, 16 and 256 MB (gpu_check.sh's executors stage)
    python benchmarks/bench_cuda.py --mbytes 1 16 256 --executors stream device

Reported:
  * kernel: dst = a + b over 256 MB of accumulator data per operand; memory
    traffic 3 x bytes (two reads, one write) per launch, as GB/s and as a
    fraction of the D2D copy's traffic rate (2 x bytes per cudaMemcpyAsync).
  * allreduce: algbw = S / t and busbw = algbw * 2(N-1)/N per rank (the
    nccl-tests definitions). All N ranks share one GPU's memory, so the
    aggregate N * busbw is compared with the copy rate: the ratio is the time
    a single D2D copy of every byte the ranks receive (2(N-1)/N * S each)
    would take, divided by the measured time.

Needs an NVIDIA GPU and the _blink_cuda_testing module (built when nvcc is found,
docs/building.md); exits with a message otherwise. Also reported per rank:
the CUDA API calls of one collective, the host time to enqueue them (and how
much of it went to waiting for peers to enqueue theirs), and the workspace.
``--executors device`` times the device executor (``time_device``: one kernel
launch per rank per call, then each rank's outcome read back, as its handler
does) on the same schedules. Recorded results: benchmarks/results/cuda_*.json.
"""

import argparse
import json
import subprocess
import sys

import numpy as np

import harness

DTYPE_CODES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int32": 4,
               "int64": 5, "uint32": 6}
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4,
            "int64": 8, "uint32": 4}
ACCSIZE = dict(ITEMSIZE, float16=4, bfloat16=4)


def load_cuda():
    """The single-GPU harness (jax_blink._blink_cuda_testing), or exit."""
    from jax_blink import _ffi

    try:
        from jax_blink import _blink_cuda
        testing = _ffi.load_cuda_testing()
    except ImportError as e:
        sys.exit(f"bench_cuda: no NVIDIA GPU support ({e}); "
                 "rebuild with a CUDA compiler present (docs/building.md)")
    if _blink_cuda.device_count() < 1:
        sys.exit("bench_cuda: no NVIDIA GPU: _blink_cuda sees no CUDA device")
    return testing


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30).stdout.strip().splitlines()
        return out[0] if out else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cuda_info(sched):
    from jax_blink import _ffi

    return _ffi.load_extension().validate_schedule(sched)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--mbytes", type=float, nargs="+", default=[256.0],
                    help="MB (1e6 bytes) per rank; several: one allreduce row each")
    ap.add_argument("--executors", nargs="+", default=["stream"], choices=["stream", "device"],
                    help="which CUDA executors to time, side by side (default: stream)")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPE_CODES))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--chunks", type=int, nargs="*", default=None,
                    help="chunks per tree to sweep (default: the planner's choice)")
    ap.add_argument("--preset", default=None, help="topology preset (default shm:RANKS)")
    ap.add_argument("--staged", action="store_true",
                    help="copy peers' chunks to staging first (cudaMemcpyPeerAsync path)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    cuda = load_cuda()

    import jax_blink
    from jax_blink.planning import CUDA_LAUNCH_SECONDS

    code = DTYPE_CODES[args.dtype]
    sizes = [int(mb * 1e6) // ITEMSIZE[args.dtype] * ITEMSIZE[args.dtype] for mb in args.mbytes]
    size = max(sizes)  # the kernel and copy rates are measured at the largest size
    count = size // ITEMSIZE[args.dtype]
    res = {"machine": harness.machine(gpu=gpu_name()), "dtype": args.dtype, "ranks": args.ranks,
           "bytes_per_rank": size, "executors": args.executors}
    # Kernel vs copy, over the same number of elements.
    t_copy = cuda.time_kernel(code, count, iters=args.iters, copy=True)
    t_red = cuda.time_kernel(code, count, iters=args.iters)
    copy_rate = 2 * size / t_copy
    red_rate = 3 * count * ACCSIZE[args.dtype] / t_red
    res.update(copy_s=t_copy, copy_gbps=copy_rate / 1e9, reduce_s=t_red,
               reduce_gbps=red_rate / 1e9, reduce_vs_copy=red_rate / copy_rate)
    print(f"D2D copy   {size / 1e6:8.1f} MB: {t_copy * 1e3:8.3f} ms  {copy_rate / 1e9:8.1f} GB/s "
          "(read+write)")
    print(f"reduce a+b {count} x {args.dtype}: {t_red * 1e3:8.3f} ms  {red_rate / 1e9:8.1f} GB/s "
          f"(2 reads + 1 write) = {red_rate / copy_rate:.2f} x copy")
    if args.dtype in ("float16", "bfloat16"):
        t_in = cuda.time_kernel(code, count, iters=args.iters, from_input=True)
        rate_in = count * (2 * ITEMSIZE[args.dtype] + 4) / t_in
        res.update(reduce_from_input_gbps=rate_in / 1e9)
        print(f"reduce from {args.dtype} inputs into float32: {t_in * 1e3:8.3f} ms  "
              f"{rate_in / 1e9:8.1f} GB/s")

    # Allreduce of N simulated ranks on this GPU, at the planner's chunk
    # count and at each --chunks value.
    n = args.ranks
    preset = args.preset or f"shm:{n}"
    plan = jax_blink.plan(jax_blink.Topology.preset(preset))
    res.update(preset=preset, staged=args.staged, allreduce=[])
    for size, chunks, executor in [(z, c, e) for z in sizes for c in args.chunks or [None]
                                   for e in args.executors]:
        sched = np.asarray(plan.lower(size, args.dtype, chunks=chunks,
                                      launch_s=CUDA_LAUNCH_SECONDS).encode())
        info = cuda_info(sched)
        if executor == "device":
            st = cuda.time_device(sched, iters=args.iters)
        else:
            st = cuda.time_schedule(sched, iters=args.iters, direct=not args.staged)
        t = st["seconds"]
        algbw = size / t
        busbw = algbw * 2 * (n - 1) / n
        # a D2D copy moves copy_rate / 2 bytes per second (copy_rate counts the read and the
        # write); the bound is such a copy of the 2(n-1)/n * S bytes each of the n ranks
        # receives: ratio = bound / t = 2 * n * busbw / copy_rate = 2(n-1) t_copy / t
        ratio = 2 * (n * busbw) / copy_rate
        row = dict(executor=executor, bytes_per_rank=size,
                   chunks=info["nchunks"] // max(info["ntrees"], 1), trees=info["ntrees"],
                   seconds=t, algbw_gbps=algbw / 1e9, busbw_gbps=busbw / 1e9,
                   aggregate_busbw_gbps=n * busbw / 1e9, ratio_to_copy_bound=ratio)
        if executor == "device":
            row.update(all_seconds=st["all_seconds"], kernel_launches_per_rank=st["launches_per_rank"],
                       blocks_per_rank=st["blocks_per_rank"], threads_per_block=st["threads_per_block"])
            detail = (f"1 kernel launch per rank ({row['blocks_per_rank']} blocks x "
                      f"{row['threads_per_block']} threads)")
        else:
            row.update(api_calls_per_rank=st["api_calls_per_rank"],
                       enqueue_us_per_rank=st["enqueue_us_per_rank"],
                       gate_us_per_rank=st["gate_us_per_rank"],
                       workspace_bytes_per_rank=st["max_workspace_bytes"],
                       fused_steps=st["fused_steps"])
            detail = (f"per rank: {row['api_calls_per_rank']:.0f} API calls, enqueue "
                      f"{row['enqueue_us_per_rank']:.0f} us (waiting for peers "
                      f"{row['gate_us_per_rank']:.0f} us), workspace "
                      f"{row['workspace_bytes_per_rank'] / 1e6:.1f} MB")
        res["allreduce"].append(row)
        print(f"allreduce [{executor}] {n} ranks x {size / 1e6:.1f} MB ({preset}, "
              f"{'staged' if args.staged and executor == 'stream' else 'direct'}, {row['trees']} trees x "
              f"{row['chunks']} chunks): {t * 1e3:8.3f} ms  algbw {algbw / 1e9:.1f} GB/s  "
              f"busbw {busbw / 1e9:.1f} GB/s per rank, {n * busbw / 1e9:.1f} GB/s aggregate = "
              f"{ratio:.2f} x the D2D copy bound; {detail}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
