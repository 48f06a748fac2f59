"""Measuring ``jax_blink.psum`` against ``jax.lax.psum`` on the devices present.

:func:`run_devices` times both over every present device (CPU virtual
devices or GPUs) per message size and counts wrong elements, with
nccl-tests' columns (``python -m jax_blink bench --devices``).

:func:`run_steps` times what users run: data-parallel training steps of MLPs
whose gradients are summed after ``jax.grad``, with no communication,
``lax.psum``, ``jax_blink.psum`` in one bucket and ``jax_blink.psum`` with its
default buckets (``python -m jax_blink bench --steps``).
"""

from __future__ import annotations

import functools
import re
import resource
import sys

import numpy as np

import jax
from jax import lax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax_blink import settings
from jax_blink.measure.rounds import interleaved
from jax_blink.numerics import wrong_elements
from jax_blink.ops.psum import psum
from jax_blink.sim import bus_factor

__all__ = ["run_devices", "run_steps", "wrong_gradient_sums", "STEP_VARIANTS", "PER_LEAF", "mlp_step", "bucketed"]

#: How the gradients of a measured step are summed: not at all (the step's
#: compute alone), by lax.psum, by jax_blink.psum in one bucket (every leaf in
#: one collective), by jax_blink.psum with its default buckets. (Also
#: :func:`bucketed`: jax_blink.psum in buckets of a given size, and :data:`PER_LEAF`.)
STEP_VARIANTS = ("none", "lax.psum", "jax_blink one bucket", "jax_blink")
#: The step variant that calls jax_blink.psum once per leaf (``jax.tree.map``), as code
#: written for lax.psum often does: one collective per leaf, where XLA merges lax's.
PER_LEAF = "jax_blink per leaf"
_BUCKETED = re.compile(r"jax_blink in buckets of (\d+) B")


def bucketed(size: int) -> str:
    """The step variant whose gradients ``jax_blink.psum`` sums in buckets of ``size`` bytes
    per device (``bucket_bytes=size``)."""
    return f"jax_blink in buckets of {int(size)} B"


def run_devices(sizes, dtype="float32", iters=20, min_bytes=None):
    """Time ``jax_blink.psum`` and ``lax.psum`` over all present devices.

    Each size is the per-device message in bytes. Inputs are small integers
    (exact in every dtype; complex values with integer imaginary parts too), so
    a correct sum is exact; ``wrong`` counts elements, on every device, that
    differ from it (real and imaginary parts both checked).

    Returns
    -------
    (rows_by_size, devices)
        ``rows_by_size``: ``[(size, {"jax_blink.psum": row, "lax.psum": row})]``,
        rows as in :func:`jax_blink.sim.compare` plus ``wrong``; ``devices``: a description.
    """
    from tqdm import tqdm  # the examples' and tests' extra

    devices = jax.devices()
    n = len(devices)
    if n < 2:
        raise ValueError(f"--devices needs at least 2 devices, found {n}; try --cpu-devices 8")
    mesh = Mesh(np.array(devices), ("i",))
    np_dtype = np.dtype(dtype) if dtype != "bfloat16" else jax.numpy.bfloat16
    kwargs = {} if min_bytes is None else {"min_bytes": min_bytes}
    fns = {
        "jax_blink.psum": lambda v: psum(v, "i", **kwargs),
        "lax.psum": lambda v: lax.psum(v, "i"),
    }
    compiled = {name: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
                for name, f in fns.items()}
    itemsize = np.dtype(np_dtype).itemsize
    out = []
    progress = tqdm(total=len(sizes) * len(fns), desc="measuring", file=sys.stderr, leave=False,
                    disable=None)  # no bar in logs (stderr not a terminal)
    for size in sizes:
        if size % itemsize:
            raise ValueError(f"size {size} is not a multiple of the {dtype} item size {itemsize}")
        count = size // itemsize
        rng = np.random.default_rng(size)
        host = rng.integers(-8, 8, (n, count)).astype(np_dtype)
        if np.dtype(np_dtype).kind == "c":  # imaginary parts of their own
            host = host + 1j * rng.integers(-8, 8, (n, count)).astype(np_dtype)
        x = jax.device_put(host.reshape(n * count), jax.sharding.NamedSharding(mesh, P("i")))
        # small integers: every order of summation gives the exact sum, which a correct
        # result equals, in its real and imaginary parts
        wide = np.complex128 if np.dtype(np_dtype).kind == "c" else np.float64
        exact = host.astype(wide).sum(axis=0)[None, :]
        wrong = {name: int(np.sum(np.asarray(f(x)).astype(wide).reshape(n, count) != exact))
                 for name, f in compiled.items()}
        times = interleaved({name: functools.partial(lambda f: f(x).block_until_ready(), f)
                             for name, f in compiled.items()}, iters)
        rows = {}
        for name, t in times.items():
            t = float(np.median(t))
            rows[name] = {"time_us": t * 1e6, "algbw_gbps": size / t / 1e9,
                          "busbw_gbps": size / t / 1e9 * bus_factor("allreduce", n), "wrong": wrong[name]}
        progress.update(len(compiled))
        rows["jax_blink.psum"]["speedup"] = rows["lax.psum"]["time_us"] / rows["jax_blink.psum"]["time_us"]
        out.append((size, rows))
    progress.close()
    return out, f"{n} x {devices[0].platform} ({devices[0].device_kind})"


def _summer(variant, axis):
    if variant == "none":
        return lambda g: g
    if variant == "lax.psum":
        return lambda g: lax.psum(g, axis)
    if variant == "jax_blink one bucket":
        return lambda g: psum(g, axis, bucket_bytes=settings.MAX_BUCKET_BYTES)
    if variant == "jax_blink":
        return lambda g: psum(g, axis)
    if variant == PER_LEAF:
        return lambda g: jax.tree.map(lambda leaf: psum(leaf, axis), g)
    sized = _BUCKETED.fullmatch(variant)
    if sized:
        return lambda g: psum(g, axis, bucket_bytes=int(sized.group(1)))
    raise ValueError(f"unknown step variant {variant!r}; expected one of {STEP_VARIANTS}, {PER_LEAF!r} or bucketed(size)")


@functools.lru_cache(maxsize=4)
def _weights(depth, width):
    """An MLP's initial weights (host arrays: each of a model's steps and checks starts from
    the same, drawn once; a 8 x 1024² draw takes 0.2 s)."""
    rng = np.random.default_rng(0)
    return tuple(rng.normal(0, 1 / np.sqrt(width), (width, width)).astype(np.float32) for _ in range(depth))


def _mlp(mesh, depth, width):
    """``(params, loss)`` of an MLP of ``depth`` ``width x width`` tanh layers
    with biases, its parameters replicated on ``mesh``."""
    params = [(w, np.zeros((width,), np.float32)) for w in _weights(depth, width)]

    def loss(ps, x):
        for w, b in ps:
            x = jnp.tanh(x @ w + b)
        return jnp.mean(x * x)

    return jax.device_put(params, NamedSharding(mesh, P())), loss


def mlp_step(mesh, depth: int, width: int, variant: str, lr: float = 1e-3):
    """``(step, params)``: a jitted data-parallel SGD step of an MLP of ``depth``
    ``width x width`` tanh layers with biases over ``mesh``'s one axis, whose
    gradients (computed by ``jax.grad`` on each device's batch) are summed as
    ``variant`` says; ``params`` are replicated on the mesh. ``step(params, x)``
    takes ``x`` of shape ``(devices * batch, width)`` sharded over the axis."""
    axis = mesh.axis_names[0]
    summed = _summer(variant, axis)
    params, loss = _mlp(mesh, depth, width)

    def step(ps, x):
        grads = summed(jax.grad(loss)(ps, x))
        return jax.tree.map(lambda p, g: p - lr * g, ps, grads)

    return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P(axis)), out_specs=P(),
                                 check_vma=False)), params


def _cpu_seconds():
    """CPU time of this process so far (all threads: XLA's, jax_blink's, Python's)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _data_mesh():
    devices = jax.devices()
    if len(devices) < 2:
        raise ValueError(f"--steps needs at least 2 devices, found {len(devices)}; try --cpu-devices 8")
    return Mesh(np.array(devices), ("data",))


def _batch(mesh, batch, width):
    """The examples of a step: ``batch`` per device of ``mesh``, sharded over its axis."""
    n = mesh.devices.size
    return jax.device_put(jnp.asarray(np.random.default_rng(1).normal(size=(n * batch, width)), jnp.float32),
                          NamedSharding(mesh, P(mesh.axis_names[0])))


def wrong_gradient_sums(depth, width, variant, batch=64):
    """Elements of the gradients of :func:`run_steps`'s step of the MLP (``depth``, ``width``)
    summed as ``variant`` says, on every device, outside the bound of
    :func:`jax_blink.numerics.sum_bound` around the exact sum of the devices' gradients."""
    mesh = _data_mesh()
    axis = mesh.axis_names[0]
    summed = _summer(variant, axis)
    params, loss = _mlp(mesh, depth, width)

    def both(ps, x):
        grads = jax.grad(loss)(ps, x)
        return jax.tree.map(lambda t: t[None], (summed(grads), grads))

    f = jax.jit(jax.shard_map(both, mesh=mesh, in_specs=(P(), P(axis)), out_specs=P(axis),
                              check_vma=False))
    sums, parts = f(params, _batch(mesh, batch, width))
    return sum(wrong_elements(np.asarray(s), np.asarray(g))
               for s, g in zip(jax.tree.leaves(sums), jax.tree.leaves(parts)))


def run_steps(models, batch=64, rounds=9, reps=3, variants=STEP_VARIANTS, check=None):
    """Median step time of each variant of :data:`STEP_VARIANTS` on MLPs.

    Parameters
    ----------
    models : list of (depth, width)
    batch : int
        Examples per device.
    rounds, reps : int
        The variants run interleaved (:func:`jax_blink.measure.rounds.interleaved`: so
        all see the same machine load), ``reps`` steps each, ``rounds`` times; the
        median over rounds is kept.

    Returns
    -------
    (rows, devices)
        One row per model and variant: ``model``, ``variant``, ``step_ms``,
        ``cpu_ms`` (the process's CPU time per step, all threads), ``vs_none`` and
        ``vs_lax`` (step time ratios), ``collectives`` (jax_blink
        custom calls in the compiled step) and ``wrong``: elements of the summed
        gradients, on every device, outside the summation-order bound around
        the exact sum (:mod:`jax_blink.numerics`; 0 for ``none``, which sums
        nothing; None for a variant not in ``check``, where one is given: a large
        model's check takes seconds, and a calibration checks only the
        bucketing it keeps, with :func:`wrong_gradient_sums`).
    """
    from tqdm import tqdm

    mesh = _data_mesh()
    devices = list(mesh.devices.flat)
    rows = []
    progress = tqdm(total=len(models) * rounds, desc="steps", file=sys.stderr, leave=False,
                    disable=None)
    for depth, width in models:
        x = _batch(mesh, batch, width)
        steps = {}
        for v in variants:
            steps[v], params = mlp_step(mesh, depth, width, v)
            jax.block_until_ready(steps[v](params, x))  # compiles
        cpu = {v: [] for v in variants}

        def call(v):
            start_cpu = _cpu_seconds()
            for _ in range(reps):
                jax.block_until_ready(steps[v](params, x))
            cpu[v].append((_cpu_seconds() - start_cpu) / reps)

        times = interleaved({v: functools.partial(call, v) for v in variants}, rounds)
        progress.update(rounds)
        med = {v: float(np.median(t)) / reps * 1e3 for v, t in times.items()}
        for v in variants:
            hlo = steps[v].lower(params, x).as_text()
            rows.append({"model": f"{depth}x{width}", "depth": depth, "width": width, "batch": batch,
                         "variant": v, "step_ms": med[v],
                         "cpu_ms": float(np.median(cpu[v])) * 1e3,
                         "vs_none": med[v] / med["none"] if "none" in med else None,
                         "vs_lax": med[v] / med["lax.psum"] if "lax.psum" in med else None,
                         "collectives": hlo.count("jax_blink_collective"),
                         "wrong": 0 if v == "none" else None if check is not None and v not in check
                         else wrong_gradient_sums(depth, width, v, batch)})
    progress.close()
    return rows, f"{len(devices)} x {devices[0].platform} ({devices[0].device_kind})"
