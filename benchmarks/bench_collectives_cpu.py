"""Every jax_blink collective against its lax equivalent on 8 virtual CPU devices.

For each collective and per-device size (float32 elements), times jax_blink's
op and the lax op in the same process after compilation, one call at a time
with a sync after each, the two alternating (the median per-call latency,
not a burst's throughput), and reports the ratio blink/lax, nccl-tests' bus
bandwidth of the jax_blink run and the number of wrong elements (inputs are
small integers, so every correct result is exact):

    python benchmarks/bench_collectives_cpu.py [--sizes 1e2,1e3,...] [--ops psum_scatter,...]
        [--out FILE.json] [--md FILE.md]

The lax equivalents: psum_scatter -> lax.psum_scatter(tiled=True),
all_gather -> lax.all_gather(tiled=True), pmax/pmin -> lax.pmax/lax.pmin,
broadcast -> lax.psum of the root's value (lax has no broadcast). Sizes are
elements of one device's input (psum_scatter: the whole vector; all_gather:
one shard).
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
from jax_blink.settings import set_xla_cpu_threads  # imports no jax
set_xla_cpu_threads()  # XLA CPU\'s threads: twice the devices

import argparse
import json
import time

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_blink
from _machine import RUN_COMMIT, machine

ROOT = 0


def per_call(fns, x, rounds):
    """Median seconds of one call of each of ``fns`` (name -> jitted fn), a sync after each
    call, the functions alternating (and which goes first), ``rounds`` calls each."""
    times = {name: [] for name in fns}
    for f in fns.values():
        jax.block_until_ready(f(x))
    for i in range(rounds):
        for name in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
            start = time.perf_counter()
            jax.block_until_ready(fns[name](x))
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


def ops(n):
    """name -> (jax_blink fn, lax fn, expected(x rows) -> per-device rows, bus factor)."""
    return {
        "psum_scatter": (
            lambda v: jax_blink.psum_scatter(v, "x", tiled=True),
            lambda v: lax.psum_scatter(v, "x", tiled=True),
            lambda x: x.sum(0).reshape(n, -1), (n - 1) / n),
        "all_gather": (
            lambda v: jax_blink.all_gather(v, "x", tiled=True),
            lambda v: lax.all_gather(v, "x", tiled=True),
            lambda x: np.broadcast_to(x.reshape(-1), (n, x.size)), (n - 1) / n),
        "pmax": (
            lambda v: jax_blink.pmax(v, "x"), lambda v: lax.pmax(v, "x"),
            lambda x: np.broadcast_to(x.max(0), x.shape), 2 * (n - 1) / n),
        "pmin": (
            lambda v: jax_blink.pmin(v, "x"), lambda v: lax.pmin(v, "x"),
            lambda x: np.broadcast_to(x.min(0), x.shape), 2 * (n - 1) / n),
        "broadcast": (
            lambda v: jax_blink.broadcast(v, "x", root=ROOT),
            lambda v: lax.psum(jnp.where(lax.axis_index("x") == ROOT, v, 0), "x"),
            lambda x: np.broadcast_to(x[ROOT], x.shape), 1.0),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e2,1e3,1e4,1e5,1e6,1e7")
    ap.add_argument("--ops", default="psum_scatter,all_gather,pmax,pmin,broadcast")
    ap.add_argument("--rounds", type=int, default=41, help="calls of each op per size (median)")
    ap.add_argument("--out", default=None, help="write results JSON here")
    ap.add_argument("--md", default=None, help="write the tables docs/performance.md quotes (markdown) here")
    args = ap.parse_args()
    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("x",))
    info = machine(jax=jax.__version__, devices=f"{n} x {jax.devices()[0].platform}")
    print(f"# {info}")
    table = ops(n)
    results = {}
    for name in args.ops.split(","):
        blink_fn, lax_fn, expected_fn, bus = table[name]
        print(f"\n## {name}\n{'count':>10} {'lax_us':>10} {'blink_us':>10} {'ratio':>6} "
              f"{'busbw':>7} {'#wrong':>6}")
        rows = []
        for size in (int(float(s)) for s in args.sizes.split(",")):
            size -= size % n  # psum_scatter splits the vector into n shards
            x = np.random.default_rng(size).integers(-8, 8, (n, size)).astype(np.float32)
            xs = jax.device_put(x, NamedSharding(mesh, P("x")))
            shard = lambda fn: jax.jit(jax.shard_map(lambda v: fn(v[0])[None], mesh=mesh,
                                                     in_specs=P("x"), out_specs=P("x"),
                                                     check_vma=False))
            f_blink, f_lax = shard(blink_fn), shard(lax_fn)
            got = np.asarray(f_blink(xs))
            wrong = int(np.sum(got != expected_fn(x))) + int(np.sum(np.asarray(f_lax(xs)) != got))
            med = per_call({"lax": f_lax, "blink": f_blink}, xs,
                           args.rounds if size < 10**7 else max(5, args.rounds // 4))
            tl, tb = med["lax"], med["blink"]
            nbytes = size * 4 * (n if name == "all_gather" else 1)  # nccl-tests: the whole vector
            busbw = nbytes / tb / 1e9 * bus
            rows.append({"count": size, "lax_us": tl * 1e6, "blink_us": tb * 1e6,
                         "ratio_blink_over_lax": tb / tl, "busbw_gbps": busbw, "wrong": wrong,
                         "decision": jax_blink.explain(
                             jax.ShapeDtypeStruct((size,), np.float32), n,
                             op=name if name != "broadcast" else "broadcast")})
            print(f"{size:>10} {tl*1e6:>10.1f} {tb*1e6:>10.1f} {tb/tl:>6.2f} {busbw:>7.2f} "
                  f"{wrong:>6}")
        results[name] = rows
    commit = RUN_COMMIT
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": info, "commit": commit, "method": "per call, a sync after each, "
                       "jax_blink and lax alternating; median", "results": results}, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(f"Machine: {info['cpu']}, {info['cores']} cores, jax {info['jax']}, "
                    f"{info['devices']}; commit {commit}; `python benchmarks/bench_collectives_cpu.py`.\n")
            for name, rows in results.items():
                f.write(f"\n**{name}** (float32; per call, median of {args.rounds} calls each, "
                        f"alternating)\n\n| elements per device | lax (us) | "
                        f"jax_blink (us) | blink / lax | wrong |\n|---|---|---|---|---|\n")
                for r in rows:
                    f.write(f"| {r['count']:.0e} | {r['lax_us']:.1f} | {r['blink_us']:.1f} | "
                            f"{r['ratio_blink_over_lax']:.2f} | {r['wrong']} |\n")


if __name__ == "__main__":
    main()
