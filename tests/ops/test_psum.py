"""jax_blink.psum agrees with jax.lax.psum on 8 virtual CPU devices.

Integers must match exactly. Floats may differ from lax.psum only by
summation order: per element, by at most

    (n - 1) * eps * sum_r |x_r|  +  eps * |sum|

(the classic bound for two summation orders of n terms, plus one final
rounding), with eps the dtype's machine epsilon. float16/bfloat16 accumulate
in float32 along the trees and round once.
"""

import functools

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

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint32", "bool"]


def random_input(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("int32", "int64"):
        return rng.integers(-1000, 1000, shape).astype(dtype)
    if dtype == "uint32":
        return rng.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32)  # wraps
    if dtype == "bfloat16":
        return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    return rng.standard_normal(shape).astype(dtype)


def per_device(fn, x, mesh, check_vma=True):
    """Run fn on each device's row of x (shape [N, ...]); return every device's result."""
    def body(v):
        out = fn(v[0])
        if check_vma:
            out = jax.tree.map(lambda o: lax.pcast(o, "x", to="varying"), out)
        return jax.tree.map(lambda o: o[None], out)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=check_vma))
    return f(jax.device_put(x, NamedSharding(mesh, P("x"))))


def assert_close_to_lax(ours, ref, x, dtype):
    """Equal for integers; else within the bounds of both summation orders, per element
    (jax_blink.numerics), and within jax_blink's own bound of the exact sum."""
    ours, ref = np.asarray(ours), np.asarray(ref)
    assert ours.dtype == ref.dtype
    mag = np.abs(np.asarray(x, np.float64)).sum(axis=0)
    assert numerics.wrong_vs_reference(ours, ref, mag, N, dtype) == 0
    assert numerics.wrong_elements(ours, np.asarray(x), ours.dtype) == 0


@pytest.mark.parametrize("size", [1, 7, 1000, 10**6])
@pytest.mark.parametrize("dtype", DTYPES)
def test_psum_matches_lax_psum_and_every_rank_gets_the_same_bits(dtype, size):
    if dtype == "float64" and size == 10**6:
        size = 10**5  # keep the suite fast; the code path is the same
    x = random_input(dtype, (N, size))
    mesh = mesh1d()
    ours = np.asarray(per_device(lambda v: jax_blink.psum(v, "x", min_bytes=0), x, mesh))
    ref = np.asarray(per_device(lambda v: lax.psum(v, "x"), x, mesh))
    for r in range(1, N):
        assert ours[r].tobytes() == ours[0].tobytes(), f"rank {r} differs from rank 0"
    assert_close_to_lax(ours[0], ref[0], x, dtype)
    again = np.asarray(per_device(lambda v: jax_blink.psum(v, "x", min_bytes=0), x, mesh))
    assert again.tobytes() == ours.tobytes(), "repeated run is not bit-identical"


def test_output_is_typed_invariant_like_lax_psum():
    mesh = mesh1d()
    x = jax.device_put(np.ones((N, 100), np.float32), NamedSharding(mesh, P("x")))

    def body(v):
        out = jax_blink.psum(v, "x", min_bytes=0)
        assert jax.typeof(out).manual_axis_type.varying == jax.typeof(lax.psum(v, "x")).manual_axis_type.varying
        return out

    out = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P()))(x)
    np.testing.assert_array_equal(out, np.full((1, 100), N, np.float32))


def test_psum_of_a_value_not_varying_over_the_axis_is_n_times_it():
    mesh = mesh1d()
    x = jax.device_put(np.ones((N, 64), np.float32), NamedSharding(mesh, P("x")))
    f = jax.jit(jax.shard_map(lambda v: (jax_blink.psum(jnp.arange(5000.0), "x", min_bytes=0),
                                         lax.psum(jnp.arange(5000.0), "x")),
                              mesh=mesh, in_specs=P("x"), out_specs=(P(), P())))
    ours, ref = f(x)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("axes", ["x", "y", ("x", "y")])
@pytest.mark.parametrize("permuted", [False, True])
def test_2d_mesh_psum_over_each_axis_and_both(axes, permuted):
    devices = np.asarray(jax.devices()[:N])
    if permuted:
        devices = devices[[5, 2, 7, 0, 3, 6, 1, 4]]
    mesh = jax.sharding.Mesh(devices.reshape(4, 2), ("x", "y"))
    x = random_input("float32", (4, 2, 3000))
    xs = jax.device_put(x, NamedSharding(mesh, P("x", "y")))
    spec = P(*(None if a in (axes if isinstance(axes, tuple) else (axes,)) else a for a in ("x", "y")))

    def run(fn):
        return jax.jit(jax.shard_map(lambda v: fn(v), mesh=mesh, in_specs=P("x", "y"),
                                     out_specs=spec))(xs)

    ours = run(lambda v: jax_blink.psum(v, axes, min_bytes=0))
    ref = run(lambda v: lax.psum(v, axes))
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_check_vma_false_and_pmap():
    mesh = mesh1d()
    x = random_input("float32", (N, 5000))
    ours = per_device(lambda v: jax_blink.psum(v, "x", min_bytes=0), x, mesh, check_vma=False)
    ref = per_device(lambda v: lax.psum(v, "x"), x, mesh, check_vma=False)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
    pm_ours = jax.pmap(lambda v: jax_blink.psum(v, "i", min_bytes=0), axis_name="i")(x)
    pm_ref = jax.pmap(lambda v: lax.psum(v, "i"), axis_name="i")(x)
    np.testing.assert_allclose(pm_ours, pm_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("check_vma", [True, False])
def test_grad_matches_lax_psum(check_vma):
    mesh = mesh1d()
    x = random_input("float32", (N, 3000))

    def loss(psum_fn, v):
        def body(w):
            s = psum_fn(jnp.sin(w[0]) * w[0], "x")
            return (s * s).sum()[None]
        per = jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                            check_vma=check_vma)(v)
        return per.sum()

    xs = jax.device_put(x, NamedSharding(mesh, P("x")))
    ours = jax.jit(jax.grad(functools.partial(loss, functools.partial(jax_blink.psum, min_bytes=0))))(xs)
    ref = jax.jit(jax.grad(functools.partial(loss, lax.psum)))(xs)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-3)


def test_jvp_and_vmap_match_lax_psum():
    mesh = mesh1d()
    x = random_input("float32", (N, 4, 1000))
    t = random_input("float32", (N, 4, 1000), seed=1)

    def jvp_of(psum_fn):
        def body(v, tv):
            return jax.jvp(lambda w: psum_fn(w * w, "x"), (v[0],), (tv[0],))[1][None]
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")),
                                     out_specs=P("x"), check_vma=False))(x, t)

    def vmap_of(psum_fn):
        def body(v):
            return jax.vmap(lambda row: psum_fn(row * 2.0, "x"))(v[0])[None]
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                     check_vma=False))(x)

    blink = functools.partial(jax_blink.psum, min_bytes=0)
    np.testing.assert_allclose(jvp_of(blink), jvp_of(lax.psum), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(vmap_of(blink), vmap_of(lax.psum), rtol=1e-5, atol=1e-4)


def test_three_psums_scan_pytree_and_pmean():
    mesh = mesh1d()
    x = random_input("float32", (N, 2000))
    blink = functools.partial(jax_blink.psum, min_bytes=0)

    def program(psum_fn, mean_fn, v):
        v = v[0]
        a = psum_fn(v, "x")
        b = psum_fn(v * 2.0, "x")
        c = psum_fn(a * b * 1e-3, "x")

        def step(carry, _):
            return psum_fn(carry, "x") * 0.125, None

        d, _ = lax.scan(step, v, None, length=5)
        tree = psum_fn({"w": v[:1000], "b": (v[1000:], jnp.arange(3000, dtype=jnp.int32))}, "x")
        m = mean_fn(v, "x")
        return jax.tree.map(lambda o: o[None], (a, b, c, d, tree, m))

    def run(psum_fn, mean_fn):
        return jax.jit(jax.shard_map(functools.partial(program, psum_fn, mean_fn), mesh=mesh,
                                     in_specs=P("x"), out_specs=P("x"), check_vma=False))(
            jax.device_put(x, NamedSharding(mesh, P("x"))))

    ours = run(blink, functools.partial(jax_blink.pmean, min_bytes=0))
    ref = run(lax.psum, lax.pmean)
    for o, r in zip(jax.tree.leaves(ours), jax.tree.leaves(ref)):
        np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-4)


def test_inputs_below_min_bytes_fall_back_to_lax_psum_and_explain_says_so():
    mesh = mesh1d()
    x = random_input("float32", (N, 10))
    ours = per_device(lambda v: jax_blink.psum(v, "x", min_bytes=1024), x, mesh)
    np.testing.assert_allclose(ours[0], x.sum(0), rtol=1e-5)
    assert "min_bytes 1024" in jax_blink.explain()
    assert "lax.psum" in jax_blink.explain(jax.ShapeDtypeStruct((10,), jnp.float32), N,
                                           min_bytes=1024)
    assert "plan" in jax_blink.explain(jax.ShapeDtypeStruct((10,), jnp.float32), N)


def test_empty_values_and_the_env_threshold(monkeypatch):
    mesh = mesh1d()
    empty = per_device(lambda v: jax_blink.psum(v, "x"), np.zeros((N, 0), np.float32), mesh)
    assert empty.shape == (N, 0)
    monkeypatch.setenv("JAX_BLINK_MIN_BYTES", "4096")
    assert "lax.psum" in jax_blink.explain(jax.ShapeDtypeStruct((1000,), jnp.float32), N)
    assert "plan" in jax_blink.explain(jax.ShapeDtypeStruct((1024,), jnp.float32), N)
    monkeypatch.setenv("JAX_BLINK_MIN_BYTES", "lots")
    with pytest.raises(ValueError, match="JAX_BLINK_MIN_BYTES='lots'"):
        jax_blink.explain(jax.ShapeDtypeStruct((1024,), jnp.float32), N)


def test_unsupported_dtype_is_a_clear_trace_time_error():
    mesh = mesh1d()
    x = np.ones((N, 4), jnp.float8_e4m3fn)
    with pytest.raises(TypeError, match="does not support dtype float8_e4m3fn"):
        per_device(lambda v: jax_blink.psum(v, "x"), x, mesh)


def test_axis_index_groups_that_do_not_cover_the_axis_are_a_clear_error():
    mesh = mesh1d()
    with pytest.raises(ValueError, match="must cover all indices exactly once"):
        per_device(lambda v: jax_blink.psum(v, "x", axis_index_groups=[[0, 1]]),
                   np.ones((N, 4), np.float32), mesh)
    with pytest.raises(ValueError, match="same size"):
        per_device(lambda v: jax_blink.psum_scatter(v, "x", axis_index_groups=[[0, 1, 2], [3, 4, 5, 6, 7]]),
                   np.ones((N, 8), np.float32), mesh)


def test_topology_of_the_wrong_size_is_a_clear_error():
    mesh = mesh1d()
    with pytest.raises(ValueError, match="has 4 ranks but the reduced axes have 8"):
        per_device(lambda v: jax_blink.psum(v, "x", topology="shm:4", min_bytes=0),
                   np.ones((N, 4), np.float32), mesh)


def test_missing_rank_times_out_naming_it_and_the_process_goes_on():
    mesh = mesh1d()
    x = np.ones((N, 1000), np.float32)

    def body(v):
        skip = lax.axis_index("x") == 3
        return lax.cond(skip, lambda w: w,
                        lambda w: jax_blink.psum(w, "x", min_bytes=0, timeout_s=0.5), v)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))
    with pytest.raises(Exception, match=r"(?s)timed out.*\b3\b"):
        jax.block_until_ready(f(jax.device_put(x, NamedSharding(mesh, P("x")))))
    ours = per_device(lambda v: jax_blink.psum(v, "x", min_bytes=0), x, mesh)
    np.testing.assert_array_equal(ours, np.full((N, 1000), N, np.float32))


def test_one_rank_schedule_through_the_cpu_custom_call():
    """The primitive on one device: a one-rank schedule, executed by the handler."""
    from reference import one_device_collective

    x = np.arange(1000, dtype=np.float32) - 3.5
    out, text = one_device_collective(x, jax.devices("cpu")[0])
    assert "jax_blink_collective" in text
    np.testing.assert_array_equal(out, x)


def test_jax_blink_cuda_setting_is_parsed_strictly(monkeypatch):
    from jax_blink import settings

    for value, expected in (("", True), ("0", False), ("off", False), ("1", True), ("yes", True)):
        monkeypatch.setenv("JAX_BLINK_CUDA", value)
        assert settings.cuda_enabled() is expected
    monkeypatch.setenv("JAX_BLINK_CUDA", "maybe")
    with pytest.raises(ValueError, match="JAX_BLINK_CUDA='maybe'"):
        settings.cuda_enabled()


def test_op_ids_are_numbered_per_program_and_repeat_across_traces():
    """Two psums in one program get ids 1 and 2; tracing the same program again
    (as another process would) gives the same ids, whatever was lowered in
    between."""
    import re

    mesh = mesh1d()
    x = random_input("float32", (N, 64))

    def lowered_ids():
        f = jax.jit(jax.shard_map(lambda v: jax_blink.psum(v, "x") * jax_blink.psum(2 * v, "x"),
                                  mesh=mesh, in_specs=P("x"), out_specs=P()))
        return re.findall(r"op_id = (\d+)", f.lower(x).as_text())

    first = lowered_ids()
    per_device(lambda v: jax_blink.psum(v + 1, "x"), x, mesh)  # another program in between
    assert first == ["1", "2"] and lowered_ids() == first


def test_explain_gives_the_decision_psum_records():
    mesh = mesh1d()
    for size, min_bytes in ((100, 0), (100, 1 << 20), (0, 0)):
        x = random_input("float32", (N, size))
        per_device(lambda v: jax_blink.psum(v, "x", min_bytes=min_bytes), x, mesh)
        recorded = jax_blink.explain().splitlines()[-1]
        assert recorded == "psum over ('x',): " + jax_blink.explain(
            jax.ShapeDtypeStruct((size,), jnp.float32), N, min_bytes=min_bytes)


def test_every_collective_of_a_jvp_program_has_its_own_op_id():
    import re

    mesh = mesh1d()
    x = random_input("float32", (N, 64))
    f = jax.jit(jax.shard_map(lambda v: jax.jvp(lambda u: jax_blink.psum(u, "x"), (v,), (v,)),
                              mesh=mesh, in_specs=P("x"), out_specs=(P(), P())))
    ids = re.findall(r"op_id = (\d+)", f.lower(x).as_text())
    assert len(ids) == 2 and len(set(ids)) == 2
    primal, tangent = f(x)
    np.testing.assert_allclose(primal, tangent, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_a_sum_of_negative_zeros_is_positive_zero_as_in_lax(dtype):
    mesh = mesh1d()
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    x = np.full((N, 7), -0.0, np_dtype)
    x[:, 0] = 1.5  # a column that is not all zeros keeps its value
    ours = per_device(lambda v: jax_blink.psum(v, "x"), x, mesh)
    ref = per_device(lambda v: lax.psum(v, "x"), x, mesh)
    assert np.asarray(ours).tobytes() == np.asarray(ref).tobytes()
    assert not np.signbit(np.asarray(ours, np.float32)[..., 1:]).any()


def test_a_function_called_several_times_pairs_each_call_with_itself():
    """An inner jitted psum called six times in one program is one op id run
    six times; every device must pair the k-th run with the k-th run."""
    mesh = mesh1d()
    inner = jax.jit(jax.shard_map(lambda v: jax_blink.psum(v, "x"), mesh=mesh,
                                  in_specs=P("x"), out_specs=P()))
    outer = jax.jit(lambda *xs: tuple(inner(x) for x in xs))
    xs = [jax.device_put(np.full((N, 256), k, np.float32) * (np.arange(N)[:, None] + 1),
                         NamedSharding(mesh, P("x"))) for k in range(1, 7)]
    want = N * (N + 1) // 2
    for _ in range(200):
        for k, out in enumerate(outer(*xs), 1):
            np.testing.assert_array_equal(np.asarray(out), want * k)


def test_jax_blink_topology_takes_a_preset_name_or_a_file(monkeypatch, tmp_path):
    x = jax.ShapeDtypeStruct((4096,), jnp.float32)
    monkeypatch.setenv("JAX_BLINK_TOPOLOGY", "dgx1-v100")
    assert "plan on dgx1-v100:" in jax_blink.explain(x, N)
    path = tmp_path / "topo.json"
    path.write_text(jax_blink.Topology.preset("pcie").to_json())
    monkeypatch.setenv("JAX_BLINK_TOPOLOGY", str(path))
    assert "plan on pcie:" in jax_blink.explain(x, N)


def test_explain_words_instead_of_a_zero_ring():
    text = jax_blink.explain(jax.ShapeDtypeStruct((4096,), jnp.float32), N)  # shm:8: no ring
    assert "ring 0" not in text and "no NVLink/NVSwitch ring" in text


def test_constants_and_weak_types_as_in_lax():
    """Constants (Python numbers) are multiplied by the axis size, as lax.psum
    does (so 8 x -0.0 stays -0.0), and weak-typed traced leaves stay weak
    next to strong ones."""
    mesh = mesh1d()
    x = jax.device_put(np.ones((N, 4), np.int32), NamedSharding(mesh, P("x")))

    def run(fn, tree):
        f = jax.jit(jax.shard_map(lambda v: fn(tree(v), "x"), mesh=mesh, in_specs=P("x"),
                                  out_specs=P()))
        return jax.eval_shape(f, x), f(x)

    for tree in (lambda v: (3, -0.0, 2.5), lambda v: (v, v[0] * 0 + 2, 3 + 0 * v[1])):
        (ours_t, ours), (ref_t, ref) = run(jax_blink.psum, tree), run(lax.psum, tree)
        assert [(t.dtype, t.weak_type) for t in ours_t] == [(t.dtype, t.weak_type) for t in ref_t]
        for a, b in zip(ours, ref):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_an_unbound_axis_says_to_call_it_under_shard_map():
    with pytest.raises(NameError, match="Found an unbound axis name: nope. To fix this, please "
                                        "call psum under `jax.shard_map`"):
        jax.jit(lambda v: jax_blink.psum(v, "nope"))(jnp.ones(3))


def test_more_ranks_than_the_planner_takes_fall_back_to_lax_psum():
    from jax_blink.planning import MAX_RANKS
    n = MAX_RANKS + 1
    text = jax_blink.explain(jax.ShapeDtypeStruct((4096,), jnp.float32), n)
    assert "lax.psum" in text and f"at most {MAX_RANKS}" in text
