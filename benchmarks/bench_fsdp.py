"""A fully-sharded + tensor-parallel training step with small shards on a 4 x 2 mesh of CPU
devices, its all-gathers and reduce-scatters by jax_blink's drop-ins against the same step
with lax's, interleaved in one process.

Each of ``--layers`` layers gathers its weight's rows over ``data`` (FSDP) and its
activations' columns over ``model`` (tensor parallel); the backward pass transposes both
into reduce-scatters: 4 collectives per layer. With this machine's profile the drop-ins
choose per call between their plan and lax (:mod:`jax_blink.choice.decide`).

    python benchmarks/bench_fsdp.py [--layers 9] [--width 256] [--batch 32] [--rounds 41]
        [--json OUT]

Recorded: benchmarks/results/fsdp_*.json (``fsdp_recorded_defaults_*``: with
JAX_BLINK_PROFILE=defaults, where no measurement of the gathers and scatters exists).
"""

import argparse
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from jax_blink import settings  # noqa: E402

settings.set_xla_cpu_threads()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jax_blink  # noqa: E402
from _machine import machine, machine_tag  # noqa: E402

OPS = {"jax_blink": jax_blink.all_gather, "lax": lax.all_gather}


def make_step(all_gather, mesh, layers):
    def loss(params, x):
        h = x
        for w in params:  # w: this device's (rows / data, columns / model) block
            full = all_gather(w, "data", axis=0, tiled=True)  # FSDP: the layer's rows
            h = jnp.tanh(h @ full)                             # this device's output columns
            h = all_gather(h, "model", axis=1, tiled=True)     # TP: every column
        return jnp.sum(h * h)

    def step(params, x):
        grads = jax.grad(loss)(params, x)  # the gathers' transposes: reduce-scatters
        return [w - 1e-3 * g for w, g in zip(params, grads)]

    specs = [P("data", "model")] * layers
    return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(specs, P("data")), out_specs=specs))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=9)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    rng = np.random.default_rng(0)
    params = [jax.device_put(rng.standard_normal((args.width, args.width)).astype(np.float32) / 16,
                             NamedSharding(mesh, P("data", "model"))) for _ in range(args.layers)]
    x = jax.device_put(rng.standard_normal((args.batch, args.width)).astype(np.float32),
                       NamedSharding(mesh, P("data")))
    steps = {k: make_step(f, mesh, args.layers) for k, f in OPS.items()}
    out = {k: jax.block_until_ready(f(params, x)) for k, f in steps.items()}
    worst = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(out["jax_blink"], out["lax"]))
    hlo = steps["jax_blink"].lower(params, x).as_text()
    calls = hlo.count("jax_blink_collective")
    times = {k: [] for k in steps}
    for r in range(args.rounds):
        for k in (list(steps) if r % 2 == 0 else list(steps)[::-1]):
            start = time.perf_counter()
            jax.block_until_ready(steps[k](params, x))
            times[k].append(time.perf_counter() - start)
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    paired = np.asarray(times["jax_blink"]) / np.asarray(times["lax"])
    res = {"machine": machine(), "tag": machine_tag(), "layers": args.layers, "width": args.width,
           "batch": args.batch, "rounds": args.rounds, "step_ms": med,
           "ratio": med["jax_blink"] / med["lax"], "paired_ratio_median": float(np.median(paired)),
           "paired_ratio_iqr": [float(np.percentile(paired, 25)), float(np.percentile(paired, 75))],
           "jax_blink_calls_in_program": calls, "max_abs_difference": worst,
           "profile": None if jax_blink.machine_profile() is None else jax_blink.machine_profile().named("1x8")}
    print(f"step: jax_blink {med['jax_blink']:.2f} ms, lax {med['lax']:.2f} ms, ratio {res['ratio']:.2f} "
          f"(paired median {res['paired_ratio_median']:.2f}, IQR {res['paired_ratio_iqr'][0]:.2f}-"
          f"{res['paired_ratio_iqr'][1]:.2f}); jax_blink calls in the program: {calls}; "
          f"largest difference from lax's step {worst:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
