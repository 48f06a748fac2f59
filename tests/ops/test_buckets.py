"""Buckets (issue 28, item 3): psum of a pytree, and pvary's transpose, sum the leaves in
buckets, last leaf first, one collective per bucket, sized by the cost model or by
bucket_bytes= / JAX_BLINK_BUCKET_BYTES; explain() says how."""

import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_blink
from jax_blink import numerics
from jax_blink.ops import buckets
from jax_blink.choice import decide
from jax_blink.planning import cost

N = 8


@pytest.fixture(autouse=True)
def every_bucket_runs_the_plan(monkeypatch):
    """The CPU model may hand a small bucket to lax.psum; count buckets, not that choice."""
    monkeypatch.setenv("JAX_BLINK_ALGO", "blink")


def mesh():
    return jax.sharding.Mesh(np.asarray(jax.devices()[:N]), ("d",))


def layered(sizes, seed=0):
    """A pytree of leaves of the given element counts, in "forward" order."""
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.normal(size=(N, s)), jnp.float32) for s in sizes]


def summed(fn, tree):
    f = jax.jit(jax.shard_map(lambda t: fn([leaf[0] for leaf in t]), mesh=mesh(),
                              in_specs=P("d"), out_specs=P(), check_vma=False))
    tree = jax.device_put(tree, NamedSharding(mesh(), P("d")))
    return f(tree), f.lower(tree).as_text().count("jax_blink_collective")


def assert_sums(out, tree):
    for o, leaf in zip(out, tree):
        assert numerics.wrong_elements(np.asarray(o), np.asarray(leaf)) == 0


def bucket_line():
    return next(line for line in reversed(jax_blink.explain().splitlines()) if "bucket" in line)


def test_the_default_buckets_come_from_the_cpu_model():
    size, why = decide.bucket_size(None, "cpu", 1 << 20)
    assert why.startswith("the CPU model (defaults recorded on a 2-core AMD EPYC")  # tests/conftest.py
    # the fixed cost (the median of the calls up to 1,000 elements: 139.8 us) is at most half of a
    # bucket's time, and not of half as much
    t = lambda s: cost.cpu_allreduce_seconds("blink", s)  # noqa: E731
    assert t(size) >= 2 * 139.8e-6 > t(size // 2)


def test_on_gpus_the_pytree_is_one_bucket():
    assert decide.bucket_size(None, "gpu", 1 << 20) == (None, "one bucket: the CUDA executor runs in the compute stream's order")
    assert decide.bucket_size(4096, "gpu", 1 << 20) == (4096, "bucket_bytes=")


def test_default_buckets_sum_as_lax_one_call_per_bucket():
    # element counts: 65536 floats = 256 KB, the CPU model's bucket on 2 cores (or larger)
    sizes = [300_000, 300, 200_000, 7, 1_000]
    tree = layered(sizes)
    out, calls = summed(lambda t: jax_blink.psum(t, "d"), tree)
    assert_sums(out, tree)
    size, _ = decide.bucket_size(None, "cpu", 4 * sum(sizes))
    expected = buckets.split([4 * s for s in sizes], size)
    assert calls == len(expected)
    assert re.search(rf"5 leaves \(\d+ B per device\) in {len(expected)} bucket\(s\), last leaf first "
                     rf"\(bucket_bytes {size} from the CPU model \(defaults recorded", bucket_line())


@pytest.mark.parametrize("bucket_bytes, calls", [(1, 5), (1 << 40, 1), (1 << 20, 2)])
def test_bucket_bytes_sets_the_buckets(bucket_bytes, calls):
    sizes = [300_000, 300, 200_000, 7, 1_000]
    tree = layered(sizes, seed=1)
    out, got = summed(lambda t: jax_blink.psum(t, "d", bucket_bytes=bucket_bytes), tree)
    assert_sums(out, tree)
    assert got == calls == len(buckets.split([4 * s for s in sizes], bucket_bytes))
    assert f"bucket_bytes {bucket_bytes} from bucket_bytes=" in bucket_line()


def test_the_environment_variable_sets_the_buckets(monkeypatch):
    monkeypatch.setenv("JAX_BLINK_BUCKET_BYTES", "1")
    tree = layered([100, 200, 300], seed=2)
    out, calls = summed(lambda t: jax_blink.psum(t, "d"), tree)
    assert_sums(out, tree)
    assert calls == 3 and "from JAX_BLINK_BUCKET_BYTES" in bucket_line()


@pytest.mark.parametrize("value, error", [(0, ValueError), (-1, ValueError), (2.5, TypeError),
                                          ("1M", TypeError), (True, TypeError)])
def test_a_bad_bucket_size_is_an_error_naming_it(value, error):
    with pytest.raises(error, match="bucket_bytes"):
        summed(lambda t: jax_blink.psum(t, "d", bucket_bytes=value), layered([10, 20]))


@pytest.mark.parametrize("text", ["0", "-5", "2.5", "1e30", "abc"])
def test_a_bad_environment_bucket_size_names_the_variable(monkeypatch, text):
    monkeypatch.setenv("JAX_BLINK_BUCKET_BYTES", text)
    with pytest.raises(ValueError, match=f"JAX_BLINK_BUCKET_BYTES={text!r}"):
        summed(lambda t: jax_blink.psum(t, "d"), layered([10, 20]))


def test_the_last_leaf_goes_first():
    """The first bucket lowered (op id 1) holds the last leaves: a layered model's backward
    pass produces its last layer's gradients first."""
    tree = layered([50_000, 40_000, 30_000])
    f = jax.jit(jax.shard_map(lambda t: jax_blink.psum([leaf[0] for leaf in t], "d", bucket_bytes=1),
                              mesh=mesh(), in_specs=P("d"), out_specs=P(), check_vma=False))
    text = f.lower(jax.device_put(tree, NamedSharding(mesh(), P("d")))).as_text()
    sizes = [int(m) for m in re.findall(r"custom_call @jax_blink_collective\(%\S+, %\S+, %\S+\) "
                                        r"\{[^\n]*\} : \(tensor<(\d+)xf32>", text)]
    assert sizes == [30_000, 40_000, 50_000]


def test_pvary_transposes_into_buckets_and_sums_as_lax():
    """jax.grad of a per-device loss through pvary sums each parameter's gradient; with
    bucket_bytes=1 every leaf is its own collective, by default the CPU model's buckets."""
    params = [jnp.full((64, 64), 0.01), jnp.zeros((64,)), jnp.full((64, 64), 0.02), jnp.zeros((64,))]
    x = jax.device_put(jnp.asarray(np.random.default_rng(3).normal(size=(N * 4, 64)), jnp.float32),
                       NamedSharding(mesh(), P("d")))

    def grads(cast):
        def loss(ps, x):
            w1, b1, w2, b2 = cast(ps)
            return jnp.sum(jnp.tanh(jnp.tanh(x @ w1 + b1) @ w2 + b2) ** 2)
        return jax.jit(jax.shard_map(jax.grad(loss), mesh=mesh(), in_specs=(P(), P("d")), out_specs=P()))

    ours = grads(lambda ps: jax_blink.pvary(ps, "d", bucket_bytes=1))
    ref = grads(lambda ps: ps)  # JAX's implicit cast: XLA's psum
    assert ours.lower(params, x).as_text().count("jax_blink_collective") == 4
    for a, b in zip(ours(params, x), ref(params, x)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    default = grads(lambda ps: jax_blink.pvary(ps, "d"))
    assert default.lower(params, x).as_text().count("jax_blink_collective") == 1  # 33 KB: one bucket


def test_pmax_of_a_pytree_is_not_bucketed():
    tree = layered([10, 20, 30])
    _, calls = summed(lambda t: jax_blink.pmax(t, "d"), tree)
    assert calls == 1
