"""A long run of jax_blink.psum does not grow resident memory."""

import os

import numpy as np
import psutil

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_blink


def test_1000_steps_do_not_grow_resident_memory():
    mesh = jax.make_mesh((8,), ("x",))
    x = jax.device_put(np.ones((8, 20000), np.float32), NamedSharding(mesh, P("x")))
    step = jax.jit(jax.shard_map(lambda v: jax_blink.psum(v, "x", min_bytes=0) * 0.125,
                                 mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                 check_vma=False))
    proc = psutil.Process(os.getpid())
    for _ in range(100):  # warm up: compile, allocator pools, rendezvous tables
        x = step(x)
    x.block_until_ready()
    before = proc.memory_info().rss
    for i in range(1000):
        x = step(x)
        if i % 50 == 0:
            x.block_until_ready()
    x.block_until_ready()
    grown = proc.memory_info().rss - before
    np.testing.assert_array_equal(np.asarray(x)[0], np.ones(20000, np.float32))
    assert grown < 8 * 2**20, f"resident memory grew by {grown / 2**20:.1f} MiB over 1000 steps"
