"""Randomized pytrees through ``jax_blink.psum`` against ``lax.psum``: leaves of mixed
dtypes and odd shapes (scalars, empty leaves, leaves of a few elements and of ~100k),
random bucket sizes (segmented buckets, leaves alone, one bucket), donated inputs, and
several jitted programs dispatched before any result is read, so that their calls are in
flight together.

Each case is drawn from a fixed seed. Integers must equal lax's sums exactly; floats must
lie within the summation-order bound of :func:`jax_blink.numerics.wrong_elements` per
element, which rejects a sum with one rank dropped (checked below).
"""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_blink
from jax_blink import numerics, settings
from ops_common import N, mesh1d, x64  # noqa: F401  (x64: an autouse fixture)

DTYPES = ("float32", "int32", "float16", "bfloat16", "float64", "int8", "uint32", "int64")
BUCKETS = (None, 64, 4096, 1 << 16, settings.MAX_BUCKET_BYTES)


@pytest.fixture(autouse=True)
def run_the_plan(monkeypatch):
    """Every bucket on jax_blink's plan, whatever the CPU model says of its size."""
    monkeypatch.setenv("JAX_BLINK_ALGO", "blink")
    monkeypatch.delenv("JAX_BLINK_SEGMENTED", raising=False)


def draw_case(rng):
    """A pytree per device (leaves stacked on axis 0 over the N devices), its bucket
    size and whether the program donates it."""
    leaves = int(rng.integers(1, 10))
    mixed = rng.random() < 0.5
    one = DTYPES[int(rng.integers(len(DTYPES)))]
    tree = []
    for _ in range(leaves):
        dtype = DTYPES[int(rng.integers(len(DTYPES)))] if mixed else one
        if rng.random() < 0.15:
            shape = (int(rng.integers(1, 120_000)),)
        else:
            shape = tuple(int(s) for s in rng.integers(0, 40, int(rng.integers(0, 3))))
        tree.append(jnp.asarray(rng.integers(-3, 4, (N,) + shape), dtype))
    return tree, BUCKETS[int(rng.integers(len(BUCKETS)))], bool(rng.random() < 0.5)


def program(psum, mesh, donate):
    f = jax.shard_map(lambda t: psum([leaf[0] for leaf in t]), mesh=mesh, in_specs=P("x"),
                      out_specs=P())
    return jax.jit(f, donate_argnums=(0,) if donate else ())


def wrong(out, parts):
    """Elements of one leaf's sum outside the per-element bound (integers: unequal)."""
    return numerics.wrong_elements(np.asarray(out), np.asarray(parts))


@pytest.mark.parametrize("seed", range(6))
def test_random_trees_in_flight_equal_lax(seed):
    rng = np.random.default_rng(seed)
    mesh = mesh1d()
    shard = NamedSharding(mesh, P("x"))
    cases = [draw_case(rng) for _ in range(3)]
    programs = [program(lambda t, b=bucket: jax_blink.psum(t, "x", bucket_bytes=b), mesh, donate)
                for _, bucket, donate in cases]
    reference = program(lambda t: lax.psum(t, "x"), mesh, False)
    want = [reference(jax.device_put(tree, shard)) for tree, _, _ in cases]
    # Every program dispatched before any result is read.
    got = [f(jax.device_put(tree, shard)) for f, (tree, _, _) in zip(programs, cases)]
    for (tree, bucket, donate), outs, refs in zip(cases, got, want):
        assert len(outs) == len(tree)
        for k, (out, ref, parts) in enumerate(zip(outs, refs, tree)):
            what = f"seed {seed} leaf {k} {parts.dtype}{parts.shape[1:]} bucket {bucket} donate {donate}"
            assert out.shape == ref.shape and out.dtype == ref.dtype, what
            assert wrong(out, parts) == 0, what
            if jnp.issubdtype(out.dtype, jnp.integer):
                np.testing.assert_array_equal(np.asarray(out), np.asarray(ref), err_msg=what)


@pytest.mark.parametrize("dtype", ["float32", "int32", "bfloat16"])
def test_the_checker_rejects_a_dropped_rank_and_zeros(dtype):
    rng = np.random.default_rng(1)
    parts = jnp.asarray(rng.integers(1, 4, (N, 300)), dtype)
    exact = jnp.sum(jnp.asarray(parts, jnp.float32), axis=0).astype(dtype)
    dropped = jnp.sum(jnp.asarray(parts[1:], jnp.float32), axis=0).astype(dtype)
    assert wrong(exact, parts) == 0
    assert wrong(dropped, parts) == 300
    assert wrong(jnp.zeros_like(exact), parts) == 300
