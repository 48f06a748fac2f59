"""psum_scatter, all_gather, pmax and pmin against their lax equivalents on 8
CPU devices: every schedule dtype, tiled and not, every dimension, pytrees,
and under jit, grad, jvp, vmap, scan, shard_map (check_vma on and off) and pmap.

Integers and max/min must match lax exactly (max/min bitwise, NaN and
signed-zero rules included: see docs/schedule_format.md); float sums by the
summation-order bound of test_psum.py.
"""

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_blink
from jax_blink import numerics
from ops_common import N, mesh1d, x64  # noqa: F401  (x64: an autouse fixture)

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint32"]


def data(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    if dtype in ("int32", "int64"):
        return rng.integers(-1000, 1000, shape).astype(dtype)
    if dtype == "uint32":
        return rng.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype == "bfloat16":
        return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    return rng.standard_normal(shape).astype(dtype)


def rows(fn, x, check_vma=False):
    """fn on each device's slice of x (leading axis N); the results stacked."""
    mesh = mesh1d()
    f = jax.jit(jax.shard_map(
        lambda v: jax.tree.map(lambda o: o[None], fn(jax.tree.map(lambda a: a[0], v))),
        mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=check_vma))
    return f(jax.tree.map(lambda a: jax.device_put(a, NamedSharding(mesh, P("x"))), x))


def assert_sum_close(ours, ref, magnitude, dtype):
    """ours and lax's ref are sums of the same N values per element: equal for integers,
    else within both summation orders' bounds per element (jax_blink.numerics), where
    ``magnitude`` is the same reduction of |x|."""
    ours, ref = np.asarray(ours), np.asarray(ref)
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    assert numerics.wrong_vs_reference(ours, ref, magnitude, N, dtype) == 0


def magnitude(fn, x):
    """``fn`` (a lax reduction) of |x| in float32: the per-element sum of |summands|."""
    return rows(fn, jax.tree.map(lambda a: np.abs(np.asarray(a, np.float32)), x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tiled,dim", [(False, 0), (True, 0), (True, 1), (False, 1)])
def test_psum_scatter_as_lax(dtype, tiled, dim):
    shape = (N, 3, N * 5) if dim == 1 and tiled else (N, 3, N) if dim == 1 else (N, N * 2 if tiled else N, 7)
    x = data(dtype, shape)
    ours = rows(lambda v: jax_blink.psum_scatter(v, "x", scatter_dimension=dim, tiled=tiled), x)
    lax_scatter = lambda v: lax.psum_scatter(v, "x", scatter_dimension=dim, tiled=tiled)  # noqa: E731
    assert_sum_close(ours, rows(lax_scatter, x), magnitude(lax_scatter, x), dtype)
    assert "psum_scatter over ('x',)" in jax_blink.explain() and "rsag plan" in jax_blink.explain()


@pytest.mark.parametrize("dtype", DTYPES + ["bool", "int8", "complex64"])
@pytest.mark.parametrize("tiled,axis", [(False, 0), (True, 0), (False, 2), (True, 1)])
def test_all_gather_as_lax(dtype, tiled, axis):
    x = data(dtype, (N, 3, 5)) if dtype != "complex64" else \
        (data("float32", (N, 3, 5)) + 1j * data("float32", (N, 3, 5), 1)).astype(np.complex64)
    ours = rows(lambda v: jax_blink.all_gather(v, "x", axis=axis, tiled=tiled), x)
    ref = rows(lambda v: lax.all_gather(v, "x", axis=axis, tiled=tiled), x)
    assert np.asarray(ours).dtype == np.asarray(ref).dtype
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["pmax", "pmin"])
def test_pmax_pmin_bitwise_as_lax(dtype, name):
    x = data(dtype, (N, 257))
    if dtype.startswith(("float", "bfloat")):
        x[3, :5] = np.nan
        x[:, 5] = np.nan  # all-NaN column
        x[2, 6], x[4, 7] = np.inf, -np.inf
    ours = rows(lambda v: getattr(jax_blink, name)(v, "x"), x)
    ref = rows(lambda v: getattr(lax, name)(v, "x"), x)
    assert np.asarray(ours).dtype == np.asarray(ref).dtype
    assert np.asarray(ours).tobytes() == np.asarray(ref).tobytes()


def test_pytrees_of_mixed_dtypes_travel_together_per_dtype():
    x = {"a": data("float32", (N, N * 3)), "b": data("int32", (N, N, 2)),
         "c": data("float32", (N, N))}
    ours = rows(lambda v: jax_blink.psum_scatter(v, "x", tiled=True), x)
    ref = rows(lambda v: lax.psum_scatter(v, "x", tiled=True), x)
    mag = magnitude(lambda v: lax.psum_scatter(v, "x", tiled=True), x)
    for k in x:
        assert_sum_close(ours[k], ref[k], mag[k], str(x[k].dtype))
    ours = rows(lambda v: jax_blink.all_gather(v, "x"), x)
    ref = rows(lambda v: lax.all_gather(v, "x"), x)
    for k in x:
        np.testing.assert_array_equal(ours[k], ref[k])


def test_typing_under_check_vma_is_lax_typing():
    def body(v):
        for ours, ref in ((jax_blink.psum_scatter(v, "x", tiled=True), lax.psum_scatter(v, "x", tiled=True)),
                          (jax_blink.all_gather(v, "x"), lax.all_gather(v, "x")),
                          (jax_blink.pmax(v, "x"), lax.pmax(v, "x")),
                          (jax_blink.pmin(jnp.float32(2), "x"), lax.pmin(jnp.float32(2), "x"))):
            assert jax.typeof(ours) == jax.typeof(ref), (jax.typeof(ours), jax.typeof(ref))
        return v

    rows(body, data("float32", (N, N * 2)), check_vma=True)


@pytest.mark.parametrize("check_vma", [True, False])
def test_grads_transpose_into_each_other_as_lax(check_vma):
    """psum_scatter's transpose is all_gather and the other way round."""
    mesh = mesh1d()
    x = data("float32", (N, N * 4))
    w = data("float32", (N * 4,), 1)

    def loss(scatter, gather, x):
        def body(v):
            s = scatter(v[0], "x", tiled=True)             # (4,)
            g = gather(jnp.sin(s), "x", tiled=True)        # (N * 4,)
            return (g * w).sum()[None]
        return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                             check_vma=check_vma)(x).sum()

    ours = jax.jit(jax.grad(lambda x: loss(jax_blink.psum_scatter, jax_blink.all_gather, x)))(x)
    ref = jax.jit(jax.grad(lambda x: loss(lax.psum_scatter, lax.all_gather, x)))(x)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_invarying_all_gather_as_lax():
    """to="invarying": an invariant result (out_specs P()), lax's values, and
    the transpose of lax.all_gather(to="invarying") (each device's block)."""
    mesh = mesh1d()
    x = data("float32", (N, 5))
    w = data("float32", (N, 5), 1)

    def loss(gather, x):
        def body(v):
            g = gather(jnp.sin(v), "x", tiled=True, to="invarying")    # (N, 5), invariant
            assert not jax.typeof(g).manual_axis_type.varying
            return (g * w).sum()
        return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P())(x)

    np.testing.assert_allclose(jax.jit(lambda x: loss(jax_blink.all_gather, x))(x),
                               jax.jit(lambda x: loss(lax.all_gather, x))(x), rtol=1e-6)
    assert "plan on shm:8" in jax_blink.explain().splitlines()[-1], jax_blink.explain()
    ours = jax.jit(jax.grad(lambda x: loss(jax_blink.all_gather, x)))(x)
    ref = jax.jit(jax.grad(lambda x: loss(lax.all_gather, x)))(x)
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6)
    with pytest.raises(NotImplementedError):  # as lax: no grouped invariant gather
        rows(lambda v: jax_blink.all_gather(v, "x", to="invarying",
                                            axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]]),
             x, check_vma=True)


def test_jvp_as_lax():
    x, t = data("float32", (N, N * 2)), data("float32", (N, N * 2), 1)
    for ours_fn, ref_fn in ((lambda v: jax_blink.psum_scatter(v, "x", tiled=True),
                             lambda v: lax.psum_scatter(v, "x", tiled=True)),
                            (lambda v: jax_blink.all_gather(v, "x"), lambda v: lax.all_gather(v, "x"))):
        ours = jax.jvp(lambda a: rows(ours_fn, a), (x,), (t,))
        ref = jax.jvp(lambda a: rows(ref_fn, a), (x,), (t,))
        for o, r in zip(ours, ref):
            np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-5)


def test_pmax_is_not_differentiable_as_lax():
    x = data("float32", (N, 4))
    with pytest.raises(NotImplementedError, match="not differentiable"):
        jax.grad(lambda a: rows(lambda v: jax_blink.pmax(v, "x"), a).sum())(x)


def test_vmap_inside_shard_map_as_lax():
    x = data("float32", (N, 3, N * 2))  # a batch of 3 per device
    for ours_fn, ref_fn in ((lambda v: jax_blink.psum_scatter(v, "x", tiled=True),
                             lambda v: lax.psum_scatter(v, "x", tiled=True)),
                            (lambda v: jax_blink.all_gather(v, "x", tiled=True),
                             lambda v: lax.all_gather(v, "x", tiled=True)),
                            (lambda v: jax_blink.pmax(v, "x"), lambda v: lax.pmax(v, "x"))):
        ours = rows(jax.vmap(ours_fn), x)
        ref = rows(jax.vmap(ref_fn), x)
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_scan_reuses_one_call_site():
    x = data("float32", (N, N * 2))

    def body(scatter, gather):
        def step(c, _):
            return gather(scatter(c, "x", tiled=True) / N, "x", tiled=True), None
        return lambda v: lax.scan(step, v, None, length=4)[0]

    ours = rows(body(jax_blink.psum_scatter, jax_blink.all_gather), x)
    ref = rows(body(lax.psum_scatter, lax.all_gather), x)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_pmap_and_axis_index_groups_as_lax():
    x = data("float32", (N, 4, 6))
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    for ours_fn, ref_fn in (
            (lambda v: jax_blink.psum_scatter(v, "i", axis_index_groups=groups),
             lambda v: lax.psum_scatter(v, "i", axis_index_groups=groups)),
            (lambda v: jax_blink.all_gather(v, "i", axis_index_groups=groups),
             lambda v: lax.all_gather(v, "i", axis_index_groups=groups)),
            (lambda v: jax_blink.pmax(v, "i", axis_index_groups=groups),
             lambda v: lax.pmax(v, "i", axis_index_groups=groups)),
            (lambda v: jax_blink.all_gather(v, "i", tiled=True), lambda v: lax.all_gather(v, "i", tiled=True))):
        ours = jax.pmap(ours_fn, axis_name="i")(x)
        ref = jax.pmap(ref_fn, axis_name="i")(x)
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
    assert "all_gather over ('i',)" in jax_blink.explain()


def test_wrong_shapes_are_clear_errors():
    with pytest.raises(ValueError, match="must equal the number of devices"):
        rows(lambda v: jax_blink.psum_scatter(v, "x"), np.ones((N, 3), np.float32))
    with pytest.raises(ValueError, match="multiple of the number of devices"):
        rows(lambda v: jax_blink.psum_scatter(v, "x", tiled=True), np.ones((N, 3), np.float32))
    with pytest.raises(ValueError, match="axis 3 is out of range"):
        rows(lambda v: jax_blink.all_gather(v, "x", axis=3), np.ones((N, 3), np.float32))
