"""What a training step pays for jax_blink's buckets: the copy into one buffer, and the executor's waits.

Issue 45's small MLPs: on 8 CPU devices their steps run slower with jax_blink.psum than
with lax.psum, although each of their calls alone is faster. Interleaved in one process,
per MLP, the data-parallel step of :func:`jax_blink.measure.timing.run_steps` with its
gradients:

* ``none``: not summed; ``lax.psum``; ``copy only``: not summed, but copied into one
  buffer and read back out of it (``jnp.concatenate``, an ``optimization_barrier`` so that
  XLA keeps the buffer, slices), which is what one bucket of many leaves does around its
  collective;
* ``one bucket``: ``jax_blink.psum`` with every leaf in one collective (the leaves as
  separate operands of one custom call, :mod:`jax_blink.ops.segmented`); ``one bucket,
  concatenated``: the same traced with ``JAX_BLINK_SEGMENTED=0`` (the leaves copied into one
  vector and the sum sliced back); ``buckets``:
  ``jax_blink.psum`` with its default buckets, once per ``--yield-us`` value (the
  executor's ``JAX_BLINK_YIELD_US``, set between calls);
* ``buckets of N B``: ``jax_blink.psum(bucket_bytes=N)`` for each ``--bucket-bytes`` value
  (``model``: the size the CPU cost model gives, which psum took before a calibration
  measured training steps).

Prints step times, the process's CPU time per step, and ratios to lax.psum; summed
jax_blink's summed gradients are checked per element against the exact sum (the
summation-order bound, as ``run_steps`` does).

    python benchmarks/bench_bucket_costs.py [--models 8x256 4x1024] [--rounds 9] [--yield-us 200 0]
        [--bucket-bytes model 1048576]
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
from jax_blink.settings import set_xla_cpu_threads  # imports no jax
set_xla_cpu_threads()  # XLA CPU's threads: twice the devices

import argparse
import resource
import time
from unittest import mock

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax_blink import _ffi, settings
from jax_blink.choice import decide
from jax_blink.measure import timing as measure
from jax_blink.choice import predict_cpu
from jax_blink.planning.cost import bucket_bytes as model_bucket_bytes
from _machine import machine


def copy_only(grads):
    """The gradients through one buffer and back, as a bucket's collective sees them."""
    leaves, tree = jax.tree.flatten(grads)
    flat = lax.optimization_barrier(jnp.concatenate([g.reshape(-1) for g in leaves]))
    out, offset = [], 0
    for g in leaves:
        out.append(flat[offset:offset + g.size].reshape(g.shape))
        offset += g.size
    return tree.unflatten(out)


def copy_step(mesh, depth, width):
    """:func:`jax_blink.measure.timing.mlp_step`'s step with its gradients through :func:`copy_only`."""
    axis = mesh.axis_names[0]
    params, loss = measure._mlp(mesh, depth, width)

    def step(ps, x):
        return jax.tree.map(lambda p, g: p - 1e-3 * g, ps, copy_only(jax.grad(loss)(ps, x)))

    return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P(axis)), out_specs=P(), check_vma=False))


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def configure(yield_us):
    """The executor's settings from the environment, with ``yield_us`` (between calls only)."""
    cfg = settings.executor()
    _ffi.load_extension().configure(spin=cfg.spin, yield_us=yield_us, push=cfg.push, nt_bytes=cfg.nt_bytes,
                                    hugepage_bytes=cfg.hugepage_bytes, debug=cfg.debug)


#: The arms and the :data:`jax_blink.measure.timing.STEP_VARIANTS` they run.
VARIANT = {"none": "none", "lax.psum": "lax.psum", "one bucket": "jax_blink one bucket", "buckets": "jax_blink"}


def concatenated(on: bool):
    """``JAX_BLINK_SEGMENTED=0`` while a step is traced, where ``on``."""
    return mock.patch.dict(os.environ, {"JAX_BLINK_SEGMENTED": "0"} if on else {})


def model_size() -> int:
    """The bucket size of the CPU cost model (:func:`jax_blink.planning.cost.bucket_bytes` over
    this machine's isolated calls), which psum took before calibrations timed steps."""
    return model_bucket_bytes(lambda b: predict_cpu.cpu_allreduce(b).blink_s,
                              fixed_s=predict_cpu.blink_fixed_seconds())


def measure_model(mesh, depth, width, rounds, yields, sizes=(), reps=3):
    axis = mesh.axis_names[0]
    n = mesh.devices.size
    x = jax.device_put(jnp.asarray(np.random.default_rng(1).normal(size=(n * 64, width)), jnp.float32),
                       NamedSharding(mesh, P(axis)))
    variants = dict(VARIANT, **{f"buckets of {b} B": measure.bucketed(b) for b in sizes})
    steps = {name: measure.mlp_step(mesh, depth, width, v)[0] for name, v in variants.items()}
    steps["one bucket, concatenated"] = measure.mlp_step(mesh, depth, width, "jax_blink one bucket")[0]
    steps["copy only"] = copy_step(mesh, depth, width)
    params = measure.mlp_step(mesh, depth, width, "none")[1]
    wrong = {}
    for name, f in steps.items():  # compiles (traced now: the setting holds for the trace)
        with concatenated(name == "one bucket, concatenated"):
            jax.block_until_ready(f(params, x))
            if name in variants and name not in ("none", "lax.psum"):
                wrong[name] = measure._wrong_gradient_sums(mesh, depth, width, variants[name], x)
    with concatenated(True):
        wrong["one bucket, concatenated"] = measure._wrong_gradient_sums(mesh, depth, width,
                                                                         "jax_blink one bucket", x)
    arms = (["none", "lax.psum", "copy only", "one bucket, concatenated", "one bucket"]
            + [f"buckets, yield {y} us" for y in yields] + [f"buckets of {b} B" for b in sizes])
    times = {a: [] for a in arms}
    cpu = {a: [] for a in arms}
    for r in range(rounds):
        for arm in (arms if r % 2 == 0 else arms[::-1]):
            name = arm
            if arm.startswith("buckets, yield"):
                configure(int(arm.split()[2]))
                name = "buckets"
            start, start_cpu = time.perf_counter(), cpu_seconds()
            for _ in range(reps):
                jax.block_until_ready(steps[name](params, x))
            times[arm].append((time.perf_counter() - start) / reps)
            cpu[arm].append((cpu_seconds() - start_cpu) / reps)
    configure(settings.executor().yield_us)
    med = {a: float(np.median(v)) * 1e3 for a, v in times.items()}
    return [{"model": f"{depth}x{width}", "arm": a, "step_ms": med[a], "cpu_ms": float(np.median(cpu[a])) * 1e3,
             "vs_lax": med[a] / med["lax.psum"],
             "wrong": wrong.get("buckets" if a.startswith("buckets, yield") else a, 0)} for a in arms]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["8x256", "4x1024"])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--yield-us", type=int, nargs="+", default=[200, 0, 20])
    ap.add_argument("--bucket-bytes", nargs="*", default=[],
                    help="bucket sizes to time beside the default buckets ('model': the CPU cost model's)")
    args = ap.parse_args()
    sizes = [model_size() if b == "model" else int(b) for b in args.bucket_bytes]
    mesh = Mesh(np.array(jax.devices()), ("data",))
    print(f"# {machine()}, {mesh.devices.size} CPU devices, PJRT_NPROC={os.environ.get('PJRT_NPROC')}")
    print(f"{'model':>8} {'gradients':>26} {'step ms':>8} {'CPU ms':>8} {'vs lax':>7} {'wrong':>6}")
    for model in args.models:
        depth, width = (int(v) for v in model.split("x"))
        print(f"# {model}'s default buckets: {decide.bucket_size(None, 'cpu', 4 * (width + 1) * width * depth)}")
        for row in measure_model(mesh, depth, width, args.rounds, args.yield_us, sizes):
            print(f"{row['model']:>8} {row['arm']:>26} {row['step_ms']:8.2f} {row['cpu_ms']:8.1f} "
                  f"{row['vs_lax']:7.2f} {row['wrong']:6d}", flush=True)


if __name__ == "__main__":
    main()
