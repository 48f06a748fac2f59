"""CUDA executor on one GPU: reduction kernel bandwidth against a device-to-
device copy, and an allreduce of N simulated ranks (default 8) at 256 MB per
rank, all on one GPU through ``jax_blink._blink_cuda``.

    python benchmarks/bench_cuda.py [--ranks 8] [--mbytes 256] [--dtype float32]
        [--iters 10] [--staged] [--preset shm:8] [--out results.json]

Reported:
  * kernel: dst = a + b over 256 MB of accumulator data per operand; memory
    traffic 3 x bytes (two reads, one write) per launch, as GB/s and as a
    fraction of the D2D copy's traffic rate (2 x bytes per cudaMemcpyAsync).
  * allreduce: algbw = S / t and busbw = algbw * 2(N-1)/N per rank (the
    nccl-tests definitions). All N ranks share one GPU's memory, so the
    aggregate N * busbw is compared with the copy rate: the ratio is the time
    a single D2D copy of every byte the ranks receive (2(N-1)/N * S each)
    would take, divided by the measured time.

Needs an NVIDIA GPU and the _blink_cuda module (built when nvcc is found,
docs/building.md); exits with a message otherwise. No results are recorded
in the repository yet: the code was written without a GPU.
"""

import argparse
import json
import sys

import numpy as np

DTYPE_CODES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int32": 4,
               "int64": 5, "uint32": 6}
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4,
            "int64": 8, "uint32": 4}
ACCSIZE = dict(ITEMSIZE, float16=4, bfloat16=4)


def load_cuda():
    try:
        from jax_blink import _blink_cuda
    except ImportError as e:
        sys.exit(f"bench_cuda: no NVIDIA GPU support: jax_blink._blink_cuda is not built ({e}); "
                 "rebuild with a CUDA compiler present (docs/building.md)")
    if _blink_cuda.device_count() < 1:
        sys.exit("bench_cuda: no NVIDIA GPU: _blink_cuda sees no CUDA device")
    return _blink_cuda


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--mbytes", type=float, default=256.0, help="MB (1e6 bytes) per rank")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPE_CODES))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--chunks", type=int, default=None, help="chunks per tree (planner default)")
    ap.add_argument("--preset", default=None, help="topology preset (default shm:RANKS)")
    ap.add_argument("--staged", action="store_true",
                    help="copy peers' chunks to staging first (cudaMemcpyPeerAsync path)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    cuda = load_cuda()

    import jax_blink

    code = DTYPE_CODES[args.dtype]
    size = int(args.mbytes * 1e6) // ITEMSIZE[args.dtype] * ITEMSIZE[args.dtype]
    count = size // ITEMSIZE[args.dtype]
    res = {"dtype": args.dtype, "ranks": args.ranks, "bytes_per_rank": size}

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

    # Allreduce of N simulated ranks on this GPU.
    n = args.ranks
    preset = args.preset or f"shm:{n}"
    plan = jax_blink.plan(jax_blink.Topology.preset(preset))
    sched = np.asarray(plan.lower(size, args.dtype, chunks=args.chunks).encode())
    t = cuda.time_schedule(sched, iters=args.iters, direct=not args.staged)
    algbw = size / t
    busbw = algbw * 2 * (n - 1) / n
    ratio = (n * busbw) / copy_rate
    res.update(preset=preset, allreduce_s=t, algbw_gbps=algbw / 1e9, busbw_gbps=busbw / 1e9,
               aggregate_busbw_gbps=n * busbw / 1e9, ratio_to_copy_bound=ratio,
               staged=args.staged)
    print(f"allreduce {n} ranks x {size / 1e6:.1f} MB ({preset}, "
          f"{'staged' if args.staged else 'direct'}): {t * 1e3:8.3f} ms  "
          f"algbw {algbw / 1e9:.1f} GB/s  busbw {busbw / 1e9:.1f} GB/s per rank, "
          f"{n * busbw / 1e9:.1f} GB/s aggregate = {ratio:.2f} x the D2D copy bound")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
