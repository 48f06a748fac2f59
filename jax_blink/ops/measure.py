"""Measuring ``jax_blink.psum`` against ``jax.lax.psum`` on the devices present.

:func:`run_devices` times both over every present device (CPU virtual
devices or GPUs) per message size and counts wrong elements, with
nccl-tests' columns (``python -m jax_blink bench --devices``).
"""

from __future__ import annotations

import sys
import time

import numpy as np

import jax
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

from jax_blink.ops.psum import psum
from jax_blink.sim import bus_factor

__all__ = ["run_devices"]


def run_devices(sizes, dtype="float32", iters=20, min_bytes=None):
    """Time ``jax_blink.psum`` and ``lax.psum`` over all present devices.

    Each size is the per-device message in bytes. Inputs are small integers
    (exact in every dtype), so a correct sum equals numpy's exactly; ``wrong``
    counts elements that differ, over all devices.

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
    progress = tqdm(total=len(sizes) * len(fns), desc="measuring", file=sys.stderr, leave=False)
    for size in sizes:
        if size % itemsize:
            raise ValueError(f"size {size} is not a multiple of the {dtype} item size {itemsize}")
        count = size // itemsize
        host = np.random.default_rng(size).integers(-8, 8, (n, count)).astype(np_dtype)
        expected = host.astype(np.float64).sum(axis=0)
        x = jax.device_put(host.reshape(n * count), jax.sharding.NamedSharding(mesh, P("i")))
        rows = {}
        for name, f in compiled.items():
            result = f(x)
            result.block_until_ready()
            got = np.asarray(result, dtype=np.float64).reshape(n, count)
            wrong = int((got != expected[None, :]).sum())
            times = []
            for _ in range(iters):
                start = time.perf_counter()
                f(x).block_until_ready()
                times.append(time.perf_counter() - start)
            t = float(np.median(times))
            rows[name] = {"time_us": t * 1e6, "algbw_gbps": size / t / 1e9,
                          "busbw_gbps": size / t / 1e9 * bus_factor("allreduce", n), "wrong": wrong}
            progress.update()
        rows["jax_blink.psum"]["speedup"] = rows["lax.psum"]["time_us"] / rows["jax_blink.psum"]["time_us"]
        out.append((size, rows))
    progress.close()
    return out, f"{n} x {devices[0].platform} ({devices[0].device_kind})"
