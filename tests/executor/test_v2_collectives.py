"""Schedule format v2 on the executors: every collective x reduce op x several dtypes.

The CPU executor (through the test harness ``run_ranks``) and the stream
executor over the host stream emulator (``emulate_streams``) run tree-lowered
and ring schedules of allreduce, reduce, broadcast, reduce_scatter and
allgather with sum, max and min; outputs are compared with numpy
(``reference.check_outputs``), the two executors with each other bitwise,
and max/min with ``jax.lax.pmax`` / ``lax.pmin`` on 8 CPU devices, bitwise.
"""

import numpy as np
import pytest

from jax_blink import _ffi
from jax_blink.schedule import lower_ring
from reference import NP_DTYPES, check_outputs, make_inputs, v2_schedules

harness = _ffi.load_testing()

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint32"]
OPS = ["sum", "max", "min"]


def inputs_for(s, seed=0):
    """Inputs of in_count elements; max/min get NaN, signed zeros and infinities too."""
    return make_inputs(s.dtype, s.nranks, s.in_count, seed, specials=s.op != "sum")


def run_cpu(s, inputs):
    outputs = [np.full(s.out_count, 7, NP_DTYPES[s.dtype]) for _ in range(s.nranks)]
    errors = harness.run_ranks(s.encode(), inputs, outputs, 20000)
    assert errors == [None] * s.nranks, errors
    return outputs


def run_emulated(s, inputs, seed=0, **kw):
    res = harness.emulate_streams(s.encode(), inputs, seed=seed, **kw)
    assert res["errors"] == [None] * s.nranks, res["errors"]
    assert res["races"] == [], "\n".join(res["races"][:5])
    assert res["stats"]["live_alloc_bytes"] == 0
    return res["outputs"]


def outputs_that_count(s, outputs):
    """The outputs the collective defines (a reduce's non-roots are unspecified)."""
    return [o for r, o in enumerate(outputs) if s.collective != "reduce" or r == s.root]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_every_collective_on_the_cpu_executor_and_the_stream_emulator(dtype, op):
    for name, s in v2_schedules(4, 4 * 37, dtype, op).items():
        inputs = inputs_for(s, seed=len(name))
        cpu = run_cpu(s, inputs)
        check_outputs(s, inputs, cpu)
        emulated = run_emulated(s, inputs, seed=len(name))
        check_outputs(s, inputs, emulated)
        for a, b in zip(outputs_that_count(s, cpu), outputs_that_count(s, emulated)):
            assert a.tobytes() == b.tobytes(), name


@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter", "allgather"])
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_rings_with_repeated_triples_run_on_both_executors(coll, n):
    s = lower_ring(list(range(n))[::-1], collective=coll, count=n * 1000 + (0 if coll != "allreduce" else 7),
                   dtype="float32", chunks=3, op="max").validate()
    inputs = inputs_for(s, n)
    check_outputs(s, inputs, run_cpu(s, inputs))
    check_outputs(s, inputs, run_emulated(s, inputs, seed=n))


@pytest.mark.parametrize("coll", ["reduce_scatter", "allgather"])
def test_sharded_collectives_staged_and_across_devices_in_the_emulator(coll):
    s = v2_schedules(4, 4 * 50, "bfloat16", "sum")[f"trees:{coll}"]
    inputs = inputs_for(s)
    out = run_emulated(s, inputs, devices=[0, 1, 2, 3], direct=False)
    check_outputs(s, inputs, out)


def test_large_fused_max_reductions_with_non_temporal_outputs():
    # big enough for the CPU executor's non-temporal stores and several kernel blocks
    s = v2_schedules(3, 3 * (1 << 18), "float32", "max")["trees:allreduce"]
    inputs = inputs_for(s, 3)
    check_outputs(s, inputs, run_cpu(s, inputs))


def test_aliased_input_and_output_use_the_workspace():
    s = v2_schedules(4, 4 * 64, "int64", "min")["trees:allreduce"]
    inputs = inputs_for(s)
    outs = [x.copy() for x in inputs]
    assert harness.run_ranks(s.encode(), outs, outs, 20000) == [None] * 4
    check_outputs(s, inputs, outs)


def test_buffers_of_the_wrong_size_are_refused_naming_both_sizes():
    s = v2_schedules(4, 4 * 10, "float32", "sum")["trees:reduce_scatter"]
    inputs = inputs_for(s)
    outputs = [np.zeros(s.count, np.float32) for _ in range(4)]  # the full vector, not a shard
    errors = harness.run_ranks(s.encode(), inputs, outputs, 5000)
    assert all("(output) elements but the reduce_scatter schedule's are 40 and 10" in e for e in errors), errors


# ------------------------------------------------------- lax.pmax / lax.pmin
def lax_reduce(op, x):
    """``lax.pmax`` / ``lax.pmin`` of the rows of ``x`` over 8 CPU devices."""
    jax = pytest.importorskip("jax")
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh((8,), ("i",))
    fn = {"max": jax.lax.pmax, "min": jax.lax.pmin}[op]
    f = jax.jit(jax.shard_map(lambda v: fn(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    return np.asarray(f(jax.device_put(x, NamedSharding(mesh, P("i")))))


def no_mixed_zero_ties(op, inputs):
    """Inputs with the elements where the result is a zero held by ranks with different signs replaced:
    there XLA CPU keeps the lowest such rank's sign, which a tree cannot know (docs/schedule_format.md)."""
    x = np.stack([a.astype(np.float64) for a in inputs])
    clean = np.where(np.isnan(x), -np.inf if op == "max" else np.inf, x)
    best = clean.max(axis=0) if op == "max" else clean.min(axis=0)
    zeros = (clean == 0)
    mixed = (best == 0) & (zeros & np.signbit(clean)).any(axis=0) & (zeros & ~np.signbit(clean)).any(axis=0)
    return [np.where(mixed, np.ones_like(a), a) for a in inputs], int(mixed.sum())


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32", "uint32"])
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("kind", ["trees:allreduce", "ring:allreduce"])
def test_max_and_min_equal_lax_pmax_and_pmin_bitwise(dtype, op, kind):
    s = v2_schedules(8, 8 * 300, dtype, op)[kind]
    inputs, replaced = no_mixed_zero_ties(op, make_inputs(dtype, 8, s.count, 5, specials=True))
    inputs = [a.astype(NP_DTYPES[dtype]) for a in inputs]
    want = lax_reduce(op, np.stack(inputs))
    for out in (run_cpu(s, inputs), run_emulated(s, inputs)):
        for r in range(8):
            assert out[r].tobytes() == want[r].tobytes(), (kind, r)
    if dtype.startswith("float"):
        assert replaced < s.count // 10  # most elements keep their specials (NaN, +-0, +-inf)


def test_nan_never_wins_and_all_nan_gives_the_identity_as_on_xla_cpu():
    nan, inf = np.float32("nan"), np.float32("inf")
    cols = [[nan] * 8, [nan] * 7 + [1.0], [1.0] + [nan] * 7, [-inf] + [nan] * 7, [-0.0] * 8, [0.0] * 8]
    inputs = [np.array([c[r] for c in cols], np.float32) for r in range(8)]
    for op in ("max", "min"):
        s = lower_ring(list(range(8)), collective="allreduce", count=len(cols), dtype="float32", op=op)
        out = run_cpu(s, inputs)
        assert out[0].tobytes() == lax_reduce(op, np.stack(inputs))[0].tobytes()
        want = [-inf if op == "max" else inf, 1.0, 1.0, -inf, -0.0, 0.0]
        assert out[0].tobytes() == np.array(want, np.float32).tobytes()


def test_mixed_signed_zeros_give_plus_zero_for_max_and_minus_zero_for_min():
    """The documented departure from XLA CPU (which keeps the lowest rank's sign)."""
    inputs = [np.array([-0.0, 0.0], np.float32), np.array([0.0, -0.0], np.float32)]
    for op, want in (("max", [0.0, 0.0]), ("min", [-0.0, -0.0])):
        s = lower_ring([0, 1], collective="allreduce", count=2, dtype="float32", op=op)
        for out in (run_cpu(s, inputs), run_emulated(s, inputs)):
            assert out[0].tobytes() == np.array(want, np.float32).tobytes()


def random_float_bits(dtype, nranks, count, seed):
    """Inputs of random bit patterns, half of them zeros, denormals, NaNs (with payloads) and
    infinities of either sign, so that most results are ties among zeros and denormals."""
    itype, bits = {"float32": (np.uint32, 32), "float64": (np.uint64, 64)}[dtype]
    mant = (1 << (23 if bits == 32 else 52)) - 1
    exp = ((1 << bits) - 1) ^ mant ^ (1 << (bits - 1))
    sign = 1 << (bits - 1)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(nranks):
        x = rng.integers(0, 1 << 62, count, dtype=np.uint64).astype(itype)
        kind = rng.integers(0, 8, count)
        small = rng.integers(0, 4, count).astype(itype)  # zeros and denormals 1..3
        x = np.where(kind < 3, small, x)
        x = np.where(kind == 3, itype(exp) | (x & itype(mant)) | itype(1), x)  # NaN, any payload
        x = np.where(kind == 4, itype(exp), x)  # inf
        x = np.where(rng.random(count) < 0.5, x | itype(sign), x & itype(~sign & ((1 << bits) - 1)))
        out.append(x.view(dtype))
    return out


def reference_fold(op, inputs):
    """Combine's fold without denormal flushing: NaN counts as -inf (max) / +inf (min); a zero
    result has the sign of max's AND (min's OR) of the zeros' signs; otherwise the winner's bits."""
    x = np.stack(inputs)
    fill = -np.inf if op == "max" else np.inf
    clean = np.where(np.isnan(x), fill, x)
    best = clean.max(axis=0) if op == "max" else clean.min(axis=0)
    neg = np.signbit(clean) & (clean == 0)
    zeros = clean == 0
    zero_sign = (neg | ~zeros).all(axis=0) if op == "max" else neg.any(axis=0)
    return np.where(best == 0, np.where(zero_sign, -0.0, 0.0).astype(x.dtype), best).astype(x.dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_of_random_bits_agree_on_every_executor(dtype, op):
    """The CPU executor's vector kernels (a plain fold, redone exactly where a result compares equal
    to zero) and the stream emulator's scalar Combine give the same bits, on fused reductions of
    1 to 7 operands and on chunks whose lengths are not multiples of the vector width."""
    n = 8
    for name, s in v2_schedules(n, n * 1003, dtype, op, chunks=3).items():
        if s.collective not in ("allreduce", "reduce_scatter", "reduce"):
            continue
        inputs = random_float_bits(dtype, n, s.in_count, seed=len(name))
        want = reference_fold(op, inputs)
        cpu, emulated = run_cpu(s, inputs), run_emulated(s, inputs, seed=len(name))
        for r in range(n):
            if s.collective == "reduce" and r != s.root:
                continue
            lo, hi = s.shard(r) if s.collective == "reduce_scatter" else (0, s.count)
            assert cpu[r].tobytes() == want[lo:hi].tobytes(), (name, r)
            assert emulated[r].tobytes() == cpu[r].tobytes(), (name, r)
