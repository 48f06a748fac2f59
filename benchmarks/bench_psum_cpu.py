"""jax_blink.psum against lax.psum on 8 virtual CPU devices, per call: the CPU model's data.

For each per-device size (float32 elements) three jitted programs run, interleaved, one
call at a time with a sync after each (so each time is one call's latency, not a burst's
throughput):

* ``none``:  ``x * 2``, the program without a collective;
* ``blink``: ``jax_blink.psum(x * 2)``;
* ``lax``:   ``lax.psum(x * 2)``.

(The collective's input is a value the program computes, as a gradient is, not a
parameter: XLA would copy a parameter before jax_blink's in-place allreduce.) The medians
are reported per call, and the collectives' own cost as the difference with ``none``
(``*_added_us``): what adding the collective costs a program. ``planning.cost.CPU_ALLREDUCE_US``
(psum's ``auto`` choice between the plan and lax on CPU devices, and the bucket size) is
that added cost, copied from this benchmark's recorded results, which a test replays
(tests/test_cost_model.py). ``#wrong`` counts elements outside the summation-order bound
(jax_blink.numerics).

    python benchmarks/bench_psum_cpu.py [--sizes 1,1e2,...] [--rounds 41] [--out FILE]
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
from jax_blink import numerics
from _machine import RUN_COMMIT, machine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def device_machine():
    return machine(jax=jax.__version__, devices=f"{jax.device_count()} x {jax.devices()[0].platform}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,1e2,1e3,1e4,1e5,1e6,1e7")
    ap.add_argument("--rounds", type=int, default=41, help="interleaved calls per program (median)")
    ap.add_argument("--out", default=None, help="write results JSON here")
    args = ap.parse_args()
    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("x",))
    shard = lambda fn: jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x")))  # noqa: E731
    programs = {"none": shard(lambda v: v * 2),
                "blink": shard(lambda v: jax_blink.psum(v * 2, "x")),
                "lax": shard(lambda v: lax.psum(v * 2, "x"))}
    rows = []
    print(f"# {device_machine()}")
    print(f"{'count':>10} {'none_us':>9} {'blink_us':>9} {'lax_us':>9} {'blink_added':>11} "
          f"{'lax_added':>9} {'added ratio':>11} {'#wrong':>6}")
    for size in (int(float(s)) for s in args.sizes.split(",")):
        x = np.random.default_rng(0).standard_normal((n, size)).astype(np.float32)
        xs = jax.device_put(x, NamedSharding(mesh, P("x")))
        got = np.asarray(programs["blink"](xs))
        wrong = numerics.wrong_elements(got, 2 * x)  # every device's row against the exact sum
        times = {k: [] for k in programs}
        for f in programs.values():
            jax.block_until_ready(f(xs))
        rounds = args.rounds if size <= 10**6 else max(9, args.rounds // 4)
        for i in range(rounds):
            order = list(programs) if i % 2 == 0 else list(programs)[::-1]
            for k in order:
                start = time.perf_counter()
                jax.block_until_ready(programs[k](xs))
                times[k].append(time.perf_counter() - start)
        med = {k: float(np.median(v)) * 1e6 for k, v in times.items()}
        added = {k: med[k] - med["none"] for k in ("blink", "lax")}
        row = {"count": size, "size_bytes": size * 4, "none_us": med["none"], "blink_us": med["blink"],
               "lax_us": med["lax"], "blink_added_us": added["blink"], "lax_added_us": added["lax"],
               "ratio_blink_over_lax": med["blink"] / med["lax"],
               "added_ratio_blink_over_lax": added["blink"] / added["lax"], "wrong": wrong,
               "decision": jax_blink.explain(jax.ShapeDtypeStruct((size,), np.float32), n)}
        rows.append(row)
        print(f"{size:>10} {med['none']:>9.1f} {med['blink']:>9.1f} {med['lax']:>9.1f} "
              f"{added['blink']:>11.1f} {added['lax']:>9.1f} {added['blink'] / added['lax']:>11.2f} "
              f"{wrong:>6}")
    if args.out:
        commit = RUN_COMMIT
        with open(args.out, "w") as f:
            json.dump({"machine": device_machine(), "commit": commit, "rounds": args.rounds,
                       "method": "per call, a sync after each, programs interleaved; *_added_us: "
                                 "the program's time minus the same program without the collective",
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
