"""The drop-ins beyond psum agree with their lax equivalents on 8 CPU devices:
complex and small-integer psum, axis_index_groups, unreduced inputs,
broadcast, pvary (gradients of replicated values summed by jax_blink),
and the jaxpr holds no dead operations.

Float results are compared with the summation-order bound of test_psum.py.
"""

import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_blink
from ops_common import N, mesh1d, x64  # noqa: F401  (x64: an autouse fixture)


def rows(fn, x, check_vma=True, mesh=None):
    """fn on each device's row of x; every device's (varying) result, stacked."""
    mesh = mesh or mesh1d()
    f = jax.jit(jax.shard_map(lambda v: jax.tree.map(lambda o: o[None],
                                                     fn(jax.tree.map(lambda a: a[0], v))), mesh=mesh,
                              in_specs=P("x"), out_specs=P("x"), check_vma=check_vma))
    return f(jax.device_put(x, NamedSharding(mesh, P("x"))))


def close(a, b, rtol=1e-5):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)


def varying(v):
    return lax.pcast(v, "x", to="varying")


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_psum_of_complex_values_as_lax(dtype, monkeypatch):
    # the plan, whatever the CPU model predicts at this size (it gives complex128 to lax)
    monkeypatch.setenv("JAX_BLINK_ALGO", "blink")
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((N, 33)) + 1j * rng.standard_normal((N, 33))).astype(dtype)
    ours = rows(lambda v: varying(jax_blink.psum(v, "x")), x)
    ref = rows(lambda v: varying(lax.psum(v, "x")), x)
    close(ours, ref, 1e-5 if dtype == "complex64" else 1e-12)
    said = jax_blink.explain().splitlines()[-1]  # its decision (the parts as reals: 66 per device)
    assert "x 66 " in said and "plan on shm:8" in said, said


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "bool"])
def test_small_integers_wrap_as_lax(dtype):
    rng = np.random.default_rng(1)
    x = (rng.random((N, 50)) < 0.5) if dtype == "bool" else \
        rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, (N, 50)).astype(dtype)
    for name in ("psum", "pmax", "pmin"):
        ours = rows(lambda v: varying(getattr(jax_blink, name)(v, "x")), x)
        ref = rows(lambda v: varying(getattr(lax, name)(v, "x")), x)
        assert np.asarray(ours).dtype == np.asarray(ref).dtype, name
        np.testing.assert_array_equal(ours, ref)


def test_axis_index_groups_in_pmap_as_lax():
    x = np.arange(N * 6, dtype=np.float32).reshape(N, 6)
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    for g in (groups, [[0, 4], [1, 5], [2, 6], [3, 7]]):
        ours = jax.pmap(lambda v: jax_blink.psum(v, "i", axis_index_groups=g), axis_name="i")(x)
        ref = jax.pmap(lambda v: lax.psum(v, "i", axis_index_groups=g), axis_name="i")(x)
        np.testing.assert_array_equal(ours, ref)
        ours = jax.pmap(lambda v: jax_blink.pmean(v, "i", axis_index_groups=g), axis_name="i")(x)
        ref = jax.pmap(lambda v: lax.pmean(v, "i", axis_index_groups=g), axis_name="i")(x)
        np.testing.assert_array_equal(ours, ref)
    assert "in groups [[0, 4], [1, 5], [2, 6], [3, 7]]: float32 x 6" in jax_blink.explain()


def test_axis_index_groups_in_shard_map_each_group_planned_on_its_allocation():
    """lax.psum refuses axis_index_groups under shard_map; jax_blink sums
    within each group, planning each as a partial DGX-1V (the two halves of
    [[0, 2, 4, 6], [1, 3, 5, 7]] are different allocations: one schedule each)."""
    x = np.arange(N * 5, dtype=np.float32).reshape(N, 5)
    for groups in ([[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 2, 4, 6], [1, 3, 5, 7]], [[0, 5], [1, 2], [3, 6], [4, 7]]):
        out = rows(lambda v: jax_blink.psum(v, "x", axis_index_groups=groups,
                                            topology="dgx1-v100"), x)
        expected = np.zeros_like(x)
        for g in groups:
            expected[g] = x[g].sum(axis=0)
        np.testing.assert_array_equal(out, expected)
        text = jax_blink.explain().splitlines()[-1]
        assert "plan on dgx1-v100[" in text, text
    # the gradient of a group sum is the group sum of the cotangents (transpose = itself)
    g = jax.grad(lambda x: (rows(lambda v: jax_blink.psum(v, "x", axis_index_groups=groups), x)
                            * np.arange(5.0)).sum())(x)
    expected = np.zeros_like(x)
    for grp in groups:
        expected[grp] = len(grp) * np.arange(5.0)
    np.testing.assert_allclose(g, expected)


def test_unreduced_inputs_are_summed_as_lax_does():
    """JAX's typed partial sums (test_shmap_unreduced_psum_fwd of JAX's suite)."""
    mesh = jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
    a, b = np.arange(32.).reshape(4, 8), np.arange(48.).reshape(8, 6)

    def run(psum):
        @jax.shard_map(in_specs=P(unreduced={"x"}), out_specs=P())
        def ar(v):
            out = psum(v, "x")
            assert jax.typeof(out).manual_axis_type.unreduced == frozenset()
            assert jax.typeof(out).manual_axis_type.varying == frozenset()
            return out

        @jax.jit
        def f(x, y):
            z = jnp.einsum("ab,bc->ac", x, y, out_sharding=P(unreduced={"x"}))
            return ar(z).sum()

        with jax.set_mesh(mesh):
            xs = jax.device_put(a, P(None, "x"))
            ys = jax.device_put(b, P("x", None))
            return f(xs, ys), jax.jit(jax.grad(f, argnums=(0, 1)))(xs, ys)

    (ours, ours_g), (ref, ref_g) = run(jax_blink.psum), run(lax.psum)
    np.testing.assert_allclose(ours, ref)
    np.testing.assert_allclose(ours, (a @ b).sum())
    for o, r in zip(ours_g, ref_g):
        np.testing.assert_allclose(o, r)
    # its own decision (z: 4 x 6 per device, float64 under the module's x64), not an earlier test's
    assert "psum over ('x',): float64 x 24 " in jax_blink.explain()


@pytest.mark.parametrize("root", [0, 5])
def test_broadcast_gives_every_device_the_roots_value(root):
    rng = np.random.default_rng(root)
    x = {"a": rng.standard_normal((N, 100)).astype(np.float32),
         "b": rng.integers(-9, 9, (N, 3, 4)).astype(np.int32), "c": rng.random((N, 7)) < 0.5}
    out = rows(lambda v: varying(jax_blink.broadcast(v, "x", root=root)), x)
    for k in x:
        assert np.asarray(out[k]).dtype == x[k].dtype
        np.testing.assert_array_equal(out[k], np.broadcast_to(x[k][root], x[k].shape))
    # the planned broadcast ran (not a lax fallback): the plan is named
    assert re.search(r"broadcast over \('x',\): float32 x 100 \(400 B per device\): tree plan on shm:8",
                     jax_blink.explain())
    assert "lax" not in next(line for line in jax_blink.explain().splitlines()
                             if line.startswith("broadcast over ('x',): float32"))


@pytest.mark.parametrize("check_vma", [True, False])
def test_broadcast_transpose_gives_the_root_the_cotangents(check_vma):
    """grad of sum(w * broadcast(x)): the root gets the sum over devices of its
    cotangent, the others zeros (a reduce to the root without check_vma)."""
    mesh = mesh1d()
    x = np.random.default_rng(2).standard_normal((N, 16)).astype(np.float32)
    w = np.arange(16, dtype=np.float32)
    root = 3

    def loss(bcast, x):
        f = jax.shard_map(lambda v: (bcast(v[0]) * w).sum()[None], mesh=mesh, in_specs=P("x"),
                          out_specs=P("x"), check_vma=check_vma)
        return f(x).sum()

    ours = jax.jit(jax.grad(lambda x: loss(lambda v: jax_blink.broadcast(v, "x", root=root), x)))(x)
    ref = jax.jit(jax.grad(lambda x: loss(
        lambda v: lax.psum(jnp.where(lax.axis_index("x") == root, v, 0.0), "x"), x)))(x)
    np.testing.assert_allclose(ours, ref)
    expected = np.zeros_like(x)
    expected[root] = N * w
    np.testing.assert_allclose(ours, expected)


def test_broadcast_root_out_of_range_is_a_clear_error():
    with pytest.raises(ValueError, match="root must be a device index in 0..7"):
        rows(lambda v: jax_blink.broadcast(v, "x", root=8), np.ones((N, 4), np.float32))


def compiled_text(f, *args):
    return f.lower(*args).compile().as_text()


def test_pvary_gradients_of_replicated_parameters_run_on_the_executor():
    """jax.grad through jax_blink.pvary sums the gradients of replicated
    parameters with jax_blink (the compiled step has the custom call and no
    XLA all-reduce), and equals the gradients lax computes."""
    mesh = mesh1d()
    rng = np.random.default_rng(3)
    params = {"w": rng.standard_normal((5, 3)).astype(np.float32),
              "b": rng.standard_normal(3).astype(np.float32)}
    batch = rng.standard_normal((N * 4, 5)).astype(np.float32)

    def grads(cast):
        def local(p, xb):
            p = cast(p)
            return (jnp.tanh(xb @ p["w"] + p["b"]) ** 2).sum()

        f = jax.shard_map(lambda p, xb: jax.grad(local)(p, xb), mesh=mesh,
                          in_specs=(P(), P("x")), out_specs=P())
        return jax.jit(f)

    ours, ref = grads(lambda p: jax_blink.pvary(p, "x")), grads(lambda p: p)
    xb = jax.device_put(batch, NamedSharding(mesh, P("x")))
    for k in params:
        np.testing.assert_allclose(ours(params, xb)[k], ref(params, xb)[k], rtol=1e-5)
    text = compiled_text(ours, params, xb)
    assert "jax_blink_collective" in text and "all-reduce" not in text
    assert "all-reduce" in compiled_text(ref, params, xb)


def test_pvary_types_as_lax_pcast_and_checks_its_input():
    mesh = mesh1d()

    def body(v):
        r = jax_blink.pvary(jnp.float32(1.0), "x")
        assert jax.typeof(r).manual_axis_type.varying == {"x"}
        with pytest.raises(ValueError, match="already varying"):
            jax_blink.pvary(v, "x")
        return v + r

    rows(body, np.zeros((N, 2), np.float32))


def test_no_dead_operations_in_the_jaxpr():
    """Every equation's result is used (the issue found unused squeezes of
    the rank operand), over one and two axes."""
    mesh2 = jax.make_mesh((2, 4), ("a", "b"))
    x = jax.device_put(np.ones((8, 64), np.float32), NamedSharding(mesh2, P(("a", "b"))))
    for axes in ("b", ("a", "b")):
        f = jax.shard_map(lambda v: jax_blink.psum(v, axes), mesh=mesh2, in_specs=P(("a", "b")),
                          out_specs=P("a") if axes == "b" else P())
        jaxpr = jax.make_jaxpr(f)(x).jaxpr.eqns[0].params["jaxpr"]
        used = {id(v) for e in jaxpr.eqns for v in e.invars} | {id(v) for v in jaxpr.outvars}
        dead = [str(e.primitive) for e in jaxpr.eqns if not any(id(o) in used for o in e.outvars)]
        assert not dead, (axes, dead, jaxpr)
        assert "blink_collective" in str(jaxpr)


def test_unbound_axis_message_names_shard_map():
    with pytest.raises(NameError, match="Found an unbound axis name: x. To fix this, please "
                                        "call psum under `jax.shard_map`"):
        jax_blink.psum(jnp.ones(3), "x")
    with pytest.raises(NameError, match="please call broadcast under"):
        jax_blink.broadcast(jnp.ones(3), "x")


def test_unreduced_psum_scatter_and_its_transpose_as_lax():
    """test_eager_unreduced_in of JAX's suite: an unreduced input scatters to
    varying shards; the gradient is typed reduced, as lax's."""
    mesh = jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))

    def run(scatter):
        with jax.set_mesh(mesh):
            arr = jax.reshard(jnp.arange(16.0), P(unreduced={"x"}))
            f = jax.shard_map(lambda x: scatter(x, "x", tiled=True), out_specs=P("x"))
            return f(arr), jax.grad(lambda x: (f(x) * jnp.arange(16.0)).sum())(arr)

    (ours, ours_g), (ref, ref_g) = run(jax_blink.psum_scatter), run(lax.psum_scatter)
    np.testing.assert_array_equal(ours, ref)
    np.testing.assert_array_equal(ours_g, ref_g)
    assert ours_g.sharding == ref_g.sharding


def test_uneven_axis_index_groups_for_the_allreduces_as_lax():
    """testPsumUnevenReplicaGroups of JAX's suite: groups of 2 and 6."""
    x = np.arange(N * 4, dtype=np.float32).reshape(N, 4)
    groups = [[0, 1], list(range(2, N))]
    for name in ("psum", "pmax", "pmin", "pmean"):
        ours = jax.pmap(lambda v: getattr(jax_blink, name)(v, "i", axis_index_groups=groups), "i")(x)
        ref = jax.pmap(lambda v: getattr(lax, name)(v, "i", axis_index_groups=groups), "i")(x)
        np.testing.assert_array_equal(ours, ref)
    with pytest.raises(ValueError, match="same size"):
        jax.pmap(lambda v: jax_blink.all_gather(v, "i", axis_index_groups=groups), "i")(x)


def test_fallbacks_use_lax_even_when_jax_lax_is_swapped(monkeypatch):
    """A user may swap the drop-ins into jax.lax; jax_blink's own lax
    fallbacks still call lax's collectives (no recursion)."""
    for name in ("psum", "pmax", "psum_scatter", "all_gather"):
        monkeypatch.setattr(lax, name, getattr(jax_blink, name))
    x = np.arange(N * N, dtype=np.float32).reshape(N, N)
    out = rows(lambda v: jax_blink.psum_scatter(v, "x", min_bytes=1 << 20), x)
    np.testing.assert_array_equal(np.asarray(out).reshape(N), x.sum(0))
    out = rows(lambda v: jax_blink.all_gather(v, "x", min_bytes=1 << 20), x)
    np.testing.assert_array_equal(out, np.broadcast_to(x, (N, N, N)))
