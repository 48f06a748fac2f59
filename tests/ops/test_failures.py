"""Failure is all or nothing: under timeouts so short that some ranks fail, every
device of a call either raises or holds the right sum (`python
benchmarks/faults.py timeouts` runs the long version)."""

import numpy as np
import pytest

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_blink

N = 8


@pytest.mark.parametrize("size,calls", [(16, 150), (4096, 150), (1 << 20, 10)])
def test_every_device_of_a_call_fails_together_or_is_right(size, calls):
    mesh = jax.make_mesh((N,), ("i",))
    x = np.arange(N * size, dtype=np.float32).reshape(N, size) % 1000
    want = x.sum(0)
    xs = jax.device_put(x, NamedSharding(mesh, P("i")))
    f = jax.jit(jax.shard_map(lambda v: jax_blink.psum(v, "i", timeout_s=1e-3), mesh=mesh,
                              in_specs=P("i"), out_specs=P("i")))
    for _ in range(calls):
        per_device = []
        for shard in f(xs).addressable_shards:
            try:
                per_device.append("right" if np.array_equal(np.asarray(shard.data)[0], want)
                                  else "WRONG")
            except Exception as e:  # noqa: BLE001 - the error is what we check
                assert "DEADLINE_EXCEEDED" in str(e) or "timed out" in str(e), e
                per_device.append("raised")
        assert "WRONG" not in per_device
        assert len(set(per_device)) == 1, per_device  # all or nothing
    # the process still works with a normal timeout
    g = jax.jit(jax.shard_map(lambda v: jax_blink.psum(v, "i"), mesh=mesh, in_specs=P("i"),
                              out_specs=P("i")))
    np.testing.assert_array_equal(np.asarray(g(xs))[0], want)
