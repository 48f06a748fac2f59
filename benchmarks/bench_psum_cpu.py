"""jax_blink.psum against lax.psum on 8 virtual CPU devices, per call: the CPU model's data.

For each per-device size (float32 elements) four jitted programs run, interleaved, one
call at a time with a sync after each (so each time is one call's latency, not a burst's
throughput), measured by :func:`jax_blink.measure.calibration.measure_allreduce` (the function
``python -m jax_blink calibrate`` measures a machine's profile with):

* ``none``:  ``x * 2``, the program without a collective;
* ``blink``: ``jax_blink.psum(x * 2)`` forced onto the plan (``JAX_BLINK_ALGO=blink``);
* ``lax``:   ``lax.psum(x * 2)``;
* ``auto``:  ``jax_blink.psum(x * 2)`` as users call it: the plan or lax, as psum's choice
  takes it from this machine's profile (``calibrate``), else from the recorded costs.

(The collective's input is a value the program computes, as a gradient is, not a
parameter: XLA would copy a parameter before jax_blink's in-place allreduce.) The medians
are reported per call, and the collectives' own cost as the median of each round's
difference with ``none`` (``*_added_us``): what adding the collective costs a program. ``planning.cost.CPU_ALLREDUCE_US``
(the recorded costs psum uses without a profile) is that added cost, copied from this
benchmark's recorded results, which a test replays (tests/test_cost_model.py). ``#wrong``
counts elements outside the summation-order bound (jax_blink.numerics).

    python benchmarks/bench_psum_cpu.py [--sizes 1,1e2,...] [--rounds 41] [--out FILE]
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
from jax_blink.settings import set_xla_cpu_threads  # imports no jax
set_xla_cpu_threads()  # XLA CPU\'s threads: twice the devices

import argparse
import json

import numpy as np

import jax

import jax_blink
from jax_blink.choice import predict_cpu
from jax_blink.measure.calibration import measure_allreduce
from _machine import RUN_COMMIT, machine

def device_machine():
    return machine(jax=jax.__version__, devices=f"{jax.device_count()} x {jax.devices()[0].platform}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,1e2,1e3,1e4,1e5,1e6,1e7")
    ap.add_argument("--rounds", type=int, default=41, help="interleaved calls per program (median)")
    ap.add_argument("--out", default=None, help="write results JSON here")
    args = ap.parse_args()
    n = jax.device_count()
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    source = predict_cpu.cpu_allreduce(4, devices=n).source
    print(f"# {device_machine()}\n# auto: psum's choice from {source}")
    print(f"{'count':>10} {'none_us':>9} {'blink_us':>9} {'lax_us':>9} {'auto_us':>9} {'blink_added':>11} "
          f"{'lax_added':>9} {'added ratio':>11} {'auto/lax':>8} {'#wrong':>6}")
    rows = []
    for size in sizes:  # one at a time, to print as it goes
        row = measure_allreduce([size], args.rounds, ("none", "blink", "lax", "auto"))[0]
        row.update(ratio_blink_over_lax=row["blink_us"] / row["lax_us"],
                   added_ratio_blink_over_lax=row["blink_added_us"] / row["lax_added_us"],
                   ratio_auto_over_lax=row["auto_us"] / row["lax_us"],
                   decision=jax_blink.explain(jax.ShapeDtypeStruct((size,), np.float32), n))
        rows.append(row)
        print(f"{size:>10} {row['none_us']:>9.1f} {row['blink_us']:>9.1f} {row['lax_us']:>9.1f} "
              f"{row['auto_us']:>9.1f} {row['blink_added_us']:>11.1f} {row['lax_added_us']:>9.1f} "
              f"{row['added_ratio_blink_over_lax']:>11.2f} {row['ratio_auto_over_lax']:>8.2f} {row['wrong']:>6}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": device_machine(), "commit": RUN_COMMIT, "rounds": args.rounds,
                       "profile": source,
                       "method": "per call, a sync after each, programs interleaved; *_added_us: "
                                 "the median over rounds of the program's time minus the same "
                                 "program's without the collective in that round; blink forced onto "
                                 "the plan, auto as psum chooses",
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
