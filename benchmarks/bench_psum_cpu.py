"""jax_blink.psum against lax.psum on 8 virtual CPU devices (issue 3's numbers).

For each per-device size (float32 elements), times both in the same process,
interleaved, after compilation, and reports nccl-tests' columns plus the
ratio blink/lax. The memory-bandwidth column compares the bytes jax_blink
moves (see below) with a plain numpy copy of the same per-device bytes.

    python benchmarks/bench_psum_cpu.py [--sizes 1e4,1e5,1e6,1e7] [--out FILE]

Bytes moved by the shm:N plan (rsag, N stars): each rank reads N inputs of its
1/N slice, writes the slice, then copies N-1 slices in and writes its output:
traffic per rank ~ (N + 2(N-1)) * S/N reads+writes ≈ 3 S.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("PJRT_NPROC", "64")

import argparse
import json
import time

import numpy as np

import jax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_blink
from _machine import machine


def device_machine():
    return machine(jax=jax.__version__, devices=f"{jax.device_count()} x {jax.devices()[0].platform}")


def time_fn(f, x, reps):
    f(x).block_until_ready()
    t = time.perf_counter()
    for _ in range(reps):
        out = f(x)
    out.block_until_ready()
    return (time.perf_counter() - t) / reps


def copy_seconds(nbytes, reps):
    a = np.ones(nbytes // 4, np.float32)
    b = np.empty_like(a)
    np.copyto(b, a)
    t = time.perf_counter()
    for _ in range(reps):
        np.copyto(b, a)
    return (time.perf_counter() - t) / reps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,1e2,1e3,1e4,1e5,1e6,1e7")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (median)")
    ap.add_argument("--out", default=None, help="write results JSON here")
    ap.add_argument("--chunks", default="",
                    help="also time these pipeline chunk counts per tree (e.g. 1,2,4,12), "
                         "next to the planner model's choice")
    args = ap.parse_args()
    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("x",))
    rows = []
    chunk_counts = [int(c) for c in args.chunks.split(",") if c]
    print(f"# {device_machine()}")
    print(f"{'size(B)':>12} {'count':>10} {'lax_us':>10} {'blink_us':>10} {'ratio':>6} "
          f"{'algbw':>7} {'busbw':>7} {'copy_GB/s':>9} {'#wrong':>6}"
          + "".join(f" {'ratio@' + str(k):>9}" for k in chunk_counts))
    for size in (int(float(s)) for s in args.sizes.split(",")):
        x = np.random.default_rng(0).standard_normal((n, size)).astype(np.float32)
        xs = jax.device_put(x, NamedSharding(mesh, P("x")))
        shard = lambda fn: jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P()))
        f_lax = shard(lambda v: lax.psum(v, "x"))
        f_blink = shard(lambda v: jax_blink.psum(v, "x", min_bytes=0))
        f_chunks = {k: shard(lambda v, k=k: jax_blink.psum(v, "x", min_bytes=0, chunks=k))
                    for k in chunk_counts}
        ref = x.astype(np.float64).sum(0)
        got = np.asarray(f_blink(xs))[0]
        wrong = int(np.sum(np.abs(got - ref) > 1e-4 * np.abs(x).sum(0) + 1e-6))
        reps = max(3, min(1000, int(3e7 // size)))
        t_lax, t_blink, t_chunks = [], [], {k: [] for k in chunk_counts}
        for _ in range(args.rounds):
            t_lax.append(time_fn(f_lax, xs, reps))
            t_blink.append(time_fn(f_blink, xs, reps))
            for k, f in f_chunks.items():
                t_chunks[k].append(time_fn(f, xs, reps))
        tl, tb = float(np.median(t_lax)), float(np.median(t_blink))
        ratio_at = {k: float(np.median(t)) / tl for k, t in t_chunks.items()}
        nbytes = size * 4
        algbw = nbytes / tb / 1e9
        busbw = algbw * 2 * (n - 1) / n
        # achieved memory traffic (~3 S per rank, all ranks) vs a plain copy (2 S traffic)
        tc = copy_seconds(nbytes * n, max(3, reps // 4))
        achieved = 3 * nbytes * n / tb / 1e9
        copy_bw = 2 * nbytes * n / tc / 1e9
        row = {"count": size, "size_bytes": nbytes, "lax_us": tl * 1e6, "blink_us": tb * 1e6,
               "ratio_blink_over_lax": tb / tl, "algbw_gbps": algbw, "busbw_gbps": busbw,
               "mem_traffic_gbps": achieved, "copy_traffic_gbps": copy_bw, "wrong": wrong,
               "chunks_per_tree": jax_blink.explain(jax.ShapeDtypeStruct((size,), np.float32), n),
               "ratio_at_chunks": ratio_at}
        rows.append(row)
        print(f"{nbytes:>12} {size:>10} {tl*1e6:>10.1f} {tb*1e6:>10.1f} {tb/tl:>6.2f} "
              f"{algbw:>7.2f} {busbw:>7.2f} {achieved:>4.1f}/{copy_bw:<4.1f} {wrong:>6}"
              + "".join(f" {r:>9.2f}" for r in ratio_at.values()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": device_machine(), "plan": jax_blink.explain(
                jax.ShapeDtypeStruct((10**6,), np.float32), n), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
