"""A bucket of several leaves reaches the CPU executor as separate operands
(jax_blink/ops/segmented.py): one ``jax_blink_collective_segments`` call, no concatenation,
and the same sums as ``lax.psum`` through jit, grad, jvp, vmap, shard_map with and without
check_vma, and pmap.

Integers are compared exactly; floats within the summation-order bound of
:func:`jax_blink.numerics.wrong_elements` per element.
"""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_blink
from jax_blink import _ffi, numerics, settings
from ops_common import N, mesh1d, x64  # noqa: F401  (x64: an autouse fixture)

ONE_BUCKET = settings.MAX_BUCKET_BYTES
SIZES = (5, 1000, 3, 7000, 1)


@pytest.fixture(autouse=True)
def every_bucket_runs_the_plan(monkeypatch):
    """Whatever the CPU model thinks of a bucket's size, run the plan (count calls, not the
    choice)."""
    monkeypatch.setenv("JAX_BLINK_ALGO", "blink")
    monkeypatch.delenv("JAX_BLINK_SEGMENTED", raising=False)


def tree_of(dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.integers(-100, 100, (N, s)), dtype) for s in SIZES]


def summed(fn, tree, check_vma=True):
    """``fn`` on each device's leaves (shard_map over 8 devices); ``(sums, lowered text)``."""
    mesh = mesh1d()
    f = jax.jit(jax.shard_map(lambda t: fn([leaf[0] for leaf in t]), mesh=mesh, in_specs=P("x"),
                              out_specs=P(), check_vma=check_vma))
    tree = jax.device_put(tree, NamedSharding(mesh, P("x")))
    return f(tree), f.lower(tree).as_text()


def exact(tree):
    """Each leaf's sum over the devices in its dtype, rounded once (small integers: exact in
    float64, and so in every summation order before that rounding)."""
    return [np.asarray(leaf, np.float64).sum(axis=0).astype(leaf.dtype) for leaf in tree]


@pytest.mark.parametrize("dtype", ["float32", "int32", "float64", "bfloat16"])
@pytest.mark.parametrize("check_vma", [True, False])
def test_one_bucket_is_one_segmented_call_without_a_concatenation(dtype, check_vma):
    tree = tree_of(dtype)
    out, text = summed(lambda t: jax_blink.psum(t, "x", bucket_bytes=ONE_BUCKET), tree, check_vma)
    assert text.count("jax_blink_collective_segments") == 1 and "concatenate" not in text
    assert jax_blink.explain().splitlines()[-1].endswith(f"({len(SIZES)} leaves as separate operands of one call)")
    for o, want in zip(out, exact(tree)):
        assert o.dtype == want.dtype and o.shape == want.shape
        np.testing.assert_array_equal(np.asarray(o, np.float64), np.asarray(want, np.float64))


def test_turned_off_the_bucket_is_concatenated_and_sums_the_same(monkeypatch):
    tree = tree_of("int32")
    monkeypatch.setenv("JAX_BLINK_SEGMENTED", "0")
    out, text = summed(lambda t: jax_blink.psum(t, "x", bucket_bytes=ONE_BUCKET), tree)
    assert "jax_blink_collective_segments" not in text and "concatenate" in text
    assert "separate operands" not in jax_blink.explain().splitlines()[-1]  # this trace's decision
    for o, want in zip(out, exact(tree)):
        np.testing.assert_array_equal(o, want)


def test_the_check_rejects_a_sum_that_dropped_a_rank():
    tree = tree_of("int32")
    out, _ = summed(lambda t: jax_blink.psum(t, "x", bucket_bytes=ONE_BUCKET), tree)
    dropped = [np.asarray(leaf)[:-1].sum(axis=0) for leaf in tree]
    assert any(not np.array_equal(o, d) for o, d in zip(out, dropped))
    floats = [np.asarray(leaf, np.float32) for leaf in tree]
    assert numerics.wrong_elements(np.asarray(out[1], np.float32), floats[1]) == 0
    assert numerics.wrong_elements(np.asarray(dropped[1], np.float32), floats[1]) > 0


def test_dtypes_travel_apart_and_empty_leaves_are_concatenated_around():
    """Leaves of two dtypes are two segmented calls; a zero-size leaf keeps its bucket on the
    concatenated path (the executor takes no empty segment) and sums alike."""
    rng = np.random.default_rng(3)
    tree = [jnp.asarray(rng.integers(-9, 9, (N, 40)), jnp.float32), jnp.asarray(rng.integers(-9, 9, (N, 30)), jnp.int32),
            jnp.asarray(rng.integers(-9, 9, (N, 20)), jnp.float32), jnp.asarray(rng.integers(-9, 9, (N, 10)), jnp.int32)]
    out, text = summed(lambda t: jax_blink.psum(t, "x", bucket_bytes=ONE_BUCKET), tree)
    assert text.count("jax_blink_collective_segments") == 2
    for o, want in zip(out, exact(tree)):
        np.testing.assert_array_equal(o, want)
    with_empty = [tree[0], jnp.zeros((N, 0), jnp.float32), tree[2]]
    out, text = summed(lambda t: jax_blink.psum(t, "x", bucket_bytes=ONE_BUCKET), with_empty)
    assert "jax_blink_collective_segments" not in text
    for o, want in zip(out, exact(with_empty)):
        np.testing.assert_array_equal(o, want)


def per_device_grads(psum_fn, check_vma):
    """The gradients of a loss of psum'ed leaves (a bucket of three), per device."""
    mesh = mesh1d()
    rng = np.random.default_rng(5)
    xs = [jnp.asarray(rng.standard_normal((N, s)), jnp.float32) for s in (300, 2, 1000)]

    def loss(vs):
        def body(*ws):
            sums = psum_fn([jnp.sin(w[0]) * w[0] for w in ws], "x")
            return sum((s * s).sum() for s in sums)[None]
        per = jax.shard_map(body, mesh=mesh, in_specs=(P("x"),) * 3, out_specs=P("x"),
                            check_vma=check_vma)(*vs)
        return per.sum()

    vs = jax.device_put(xs, NamedSharding(mesh, P("x")))
    return jax.jit(jax.grad(loss))(vs), jax.jit(jax.grad(loss)).lower(vs).as_text()


@pytest.mark.parametrize("check_vma", [True, False])
def test_grad_matches_lax_psum(check_vma):
    ours, text = per_device_grads(lambda t, ax: jax_blink.psum(t, ax, bucket_bytes=ONE_BUCKET), check_vma)
    ref, _ = per_device_grads(lax.psum, check_vma)
    assert "jax_blink_collective_segments" in text
    for o, r in zip(ours, ref):
        np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-3)


def test_jvp_vmap_and_pmap_match_lax_psum():
    mesh = mesh1d()
    rng = np.random.default_rng(7)
    x = [jnp.asarray(rng.standard_normal((N, 4, s)), jnp.float32) for s in (100, 7)]
    t = [jnp.asarray(rng.standard_normal((N, 4, s)), jnp.float32) for s in (100, 7)]
    blink = lambda v, ax: jax_blink.psum(v, ax, bucket_bytes=ONE_BUCKET)  # noqa: E731

    def jvp_of(psum_fn):
        def body(a, b, ta, tb):
            return [o[None] for o in jax.jvp(lambda u, w: psum_fn([u * u, w * 3.0], "x"),
                                             (a[0], b[0]), (ta[0], tb[0]))[1]]
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"),) * 4, out_specs=P("x"),
                                     check_vma=False))(*x, *t)

    def vmap_of(psum_fn):
        def body(a, b):  # b's batch is mapped, a is broadcast across it
            return [o[None] for o in jax.vmap(lambda row: psum_fn([a[0][0], row], "x"))(b[0])]
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"),) * 2, out_specs=P("x"),
                                     check_vma=False))(*x)

    for a, b in ((jvp_of(blink), jvp_of(lax.psum)), (vmap_of(blink), vmap_of(lax.psum))):
        for u, w in zip(a, b):
            np.testing.assert_allclose(u, w, rtol=1e-5, atol=1e-4)
    ours = jax.pmap(lambda a, b: blink([a, b], "i"), axis_name="i")(x[0][:, 0], x[1][:, 0])
    ref = jax.pmap(lambda a, b: lax.psum([a, b], "i"), axis_name="i")(x[0][:, 0], x[1][:, 0])
    for u, w in zip(ours, ref):
        np.testing.assert_allclose(u, w, rtol=1e-5, atol=1e-4)


def test_for_gpus_the_bucket_lowers_to_the_concatenation_around_one_call():
    """The CUDA executor takes one buffer: lowered for CUDA (here without a GPU, through
    jax.export), a bucket is the concatenation, one jax_blink_collective call and slices."""
    if not _ffi.has_cuda_support():
        pytest.skip("the CUDA module jax_blink._blink_cuda is not built (no CUDA compiler at build time)")
    mesh = mesh1d()
    sharded = NamedSharding(mesh, P("x"))
    f = jax.jit(jax.shard_map(lambda a, b: jax_blink.psum([a[0], b[0]], "x", bucket_bytes=ONE_BUCKET),
                              mesh=mesh, in_specs=P("x"), out_specs=P()))
    args = [jax.ShapeDtypeStruct((N, n), jnp.float32, sharding=sharded) for n in (100, 7)]
    unchecked = [jax.export.DisabledSafetyCheck.custom_call("jax_blink_collective")]
    text = jax.export.export(f, platforms=["cuda"], disabled_checks=unchecked)(*args).mlir_module()
    assert text.count("@jax_blink_collective(") == 1 and "jax_blink_collective_segments" not in text
    assert "stablehlo.concatenate" in text
    cpu = jax.export.export(f, platforms=["cpu"], disabled_checks=[
        jax.export.DisabledSafetyCheck.custom_call("jax_blink_collective_segments")])(*args).mlir_module()
    assert cpu.count("@jax_blink_collective_segments(") == 1 and "stablehlo.concatenate" not in cpu


def test_a_bad_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv("JAX_BLINK_SEGMENTED", "maybe")
    with pytest.raises(ValueError, match="JAX_BLINK_SEGMENTED='maybe'"):
        summed(lambda t: jax_blink.psum(t, "x", bucket_bytes=ONE_BUCKET), tree_of("int32"))
