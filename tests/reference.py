"""Reference inputs and checks shared by the executor tests (CPU and CUDA).

Inputs are chosen so that float16/bfloat16 partial sums are exact in
float32: the executors' result must then equal the exact sum rounded once,
in every summation order, and the comparison is exact. max/min results are
exact in every order; their inputs include NaN, signed zeros and
infinities (:func:`make_inputs` with ``specials``), and :func:`check_outputs`
compares them bitwise with a numpy fold of :func:`numpy_executor.reduce_pair`.
"""

from types import SimpleNamespace

import ml_dtypes
import numpy as np

from jax_blink.schedule import lower_ring, lower_trees
from numpy_executor import reduce_pair

#: schedule dtype name -> numpy type
NP_DTYPES = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "int32": np.int32,
    "int64": np.int64,
    "uint32": np.uint32,
}


def make_inputs(dtype, nranks, count, seed=0, specials=False):
    """Inputs whose float16/bfloat16 partial sums are exact in float32.

    ``specials``: floating-point inputs also hold NaN, +-0.0 and +-inf in
    about a third of their elements (for max/min)."""
    xs = _make_inputs(dtype, nranks, count, seed)
    if specials and dtype in ("float32", "float64", "float16", "bfloat16"):
        rng = np.random.default_rng(seed + 1)
        pool = np.array([np.nan, -np.nan, 0.0, -0.0, np.inf, -np.inf], np.float64)
        for x in xs:
            where = rng.random(count) < 0.35
            x[where] = pool[rng.integers(0, len(pool), where.sum())].astype(x.dtype)
    return xs


def _make_inputs(dtype, nranks, count, seed):
    rng = np.random.default_rng(seed)
    np_dtype = NP_DTYPES[dtype]
    if dtype in ("int32", "int64"):
        info = np.iinfo(np_dtype)
        return [rng.integers(info.min, info.max, count, dtype=np_dtype, endpoint=True)
                for _ in range(nranks)]
    if dtype == "uint32":
        return [rng.integers(0, 2**32, count, dtype=np.uint32) for _ in range(nranks)]
    if dtype == "float16":
        # 11-bit integers scaled by 2^k, k in [-20, -14]: sums of 8 need at most
        # 11 + 3 + 6 = 20 bits (exact in float32); includes f16 subnormals.
        return [(rng.integers(-2048, 2048, count) * 2.0 ** rng.integers(-20, -14, count))
                .astype(np.float16) for _ in range(nranks)]
    if dtype == "bfloat16":
        return [(rng.integers(-256, 256, count) * 2.0 ** rng.integers(-4, 4, count))
                .astype(ml_dtypes.bfloat16) for _ in range(nranks)]
    return [rng.standard_normal(count).astype(np_dtype) * 100 for _ in range(nranks)]


def check_sum(dtype, inputs, out):
    np_dtype = NP_DTYPES[dtype]
    if dtype in ("int32", "int64", "uint32"):
        ref = np.zeros_like(inputs[0])
        for x in inputs:
            ref = ref + x  # wraps, like lax.psum
        np.testing.assert_array_equal(out, ref)
    elif dtype in ("float16", "bfloat16"):
        exact = np.sum([x.astype(np.float64) for x in inputs], axis=0)
        ref = exact.astype(np.float32).astype(np_dtype)  # exact in f32: one rounding
        np.testing.assert_array_equal(out.view(np.uint16), ref.view(np.uint16))
    else:
        exact = np.sum([x.astype(np.longdouble) for x in inputs], axis=0)
        bound = (len(inputs) - 1) * np.finfo(np_dtype).eps * np.sum(
            [np.abs(x.astype(np.longdouble)) for x in inputs], axis=0)
        bound = bound + np.spacing(np.abs(exact).astype(np_dtype)).astype(np.longdouble)
        assert np.all(np.abs(out.astype(np.longdouble) - exact) <= bound)


def reduce_reference(op, dtype, inputs):
    """max or min over the ranks' arrays as the format defines it, in the dtype (exact)."""
    np_dtype = NP_DTYPES[dtype]
    wide = [x.astype(np.float64) if dtype in ("float16", "bfloat16") else x for x in inputs]
    out = wide[0]
    for x in wide[1:]:
        out = reduce_pair(op, out, x)
    return np.asarray(out).astype(np_dtype)


def check_reduced(op, dtype, inputs, out):
    """``out`` is the reduction of ``inputs`` by ``op`` (sum: see check_sum; max/min: bitwise)."""
    if op == "sum":
        check_sum(dtype, inputs, out)
        return
    ref = reduce_reference(op, dtype, inputs)
    assert out.dtype == ref.dtype
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[ref.itemsize]
    mismatch = np.flatnonzero(out.view(bits) != ref.view(bits))
    assert mismatch.size == 0, (f"{op} {dtype}: {mismatch.size} elements differ, first at {mismatch[0]}: "
                                f"got {out[mismatch[0]]!r}, want {ref[mismatch[0]]!r}, inputs "
                                f"{[x[mismatch[0]] for x in inputs]}")


def check_outputs(schedule, inputs, outputs):
    """Every rank's output is what the schedule's collective promises (docs/schedule_format.md)."""
    s = schedule
    coll, op = s.collective, s.op
    for r in range(s.nranks):
        out = outputs[r]
        assert out.shape == (s.out_count,), (r, out.shape, s.out_count)
        if coll == "allreduce" or (coll == "reduce" and r == s.root):
            check_reduced(op, s.dtype, inputs, out)
        elif coll == "reduce_scatter":
            lo, hi = s.shard(r)
            check_reduced(op, s.dtype, [x[lo:hi] for x in inputs], out)
        elif coll == "broadcast":
            assert out.tobytes() == inputs[s.root].tobytes(), r
        elif coll == "allgather":
            assert out.tobytes() == np.concatenate(inputs).tobytes(), r
    if coll in ("allreduce", "broadcast", "allgather"):
        assert_bit_identical(outputs)


def v2_schedules(nranks, count, dtype, op, chunks=2):
    """``{name: Schedule}``: every collective lowered from trees, and the three rings, with ``op``
    (``count`` must be a multiple of ``nranks``)."""
    T = SimpleNamespace
    n = nranks
    chain = T(root=n - 1, edges=[(i + 1, i) for i in range(n - 1)], weight=2.0)
    star = T(root=0, edges=[(0, i) for i in range(1, n)], weight=1.0)
    shifted = T(root=1 % n, edges=[(1 % n, i) for i in range(n) if i != 1 % n], weight=1.0)
    # per-rank roots: a star and a chain rooted at every rank
    rooted = [t for r in range(n) for t in (
        T(root=r, edges=[(r, i) for i in range(n) if i != r], weight=1.0),
        T(root=r, edges=[((r + i) % n, (r + i + 1) % n) for i in range(n - 1)], weight=0.5))]
    out = {}
    common = dict(nranks=n, count=count, dtype=dtype, chunks=chunks, op=op)
    out["trees:allreduce"] = lower_trees([star, chain, shifted], collective="allreduce", **common)
    # the planner's "split" family: reduced up one tree (up_edges), broadcast down another
    reduce_chain = [(i, i + 1) for i in range(n - 1)]  # (parent, child): up toward rank 0
    out["trees:allreduce-split"] = lower_trees(
        [T(root=0, edges=star.edges, up_edges=reduce_chain, weight=1.0),
         T(root=n - 1, edges=chain.edges, up_edges=[(n - 1, i) for i in range(n - 1)], weight=1.0)],
        collective="allreduce", **common)
    out["trees:reduce"] = lower_trees([chain], collective="reduce", root=n - 1, **common)
    out["trees:broadcast"] = lower_trees([star], collective="broadcast", root=0, **common)
    out["trees:reduce_scatter"] = lower_trees(rooted, collective="reduce_scatter", **common)
    out["trees:allgather"] = lower_trees(rooted, collective="allgather", **common)
    order = list(range(0, n, 2)) + list(range(1, n, 2))
    for coll in ("allreduce", "reduce_scatter", "allgather"):
        out[f"ring:{coll}"] = lower_ring(order, collective=coll, count=count, dtype=dtype, chunks=chunks, op=op)
    return {name: s.validate() for name, s in out.items()}


def v1_words(s):
    """``s`` (a sum schedule) encoded as format version 1 (the 9-word header)."""
    from jax_blink.schedule.constants import MAGIC

    w = s.encode().tolist()
    return np.asarray([MAGIC, 1] + w[2:7] + w[10:], np.int64)


def assert_bit_identical(outputs):
    for o in outputs[1:]:
        assert o.tobytes() == outputs[0].tobytes()


def lowered(nranks, count, dtype, chunks=4):
    """Several trees (a star, a chain and a shifted star) through lower_trees,
    as the encoded, validated schedule."""
    T = SimpleNamespace
    trees = [
        T(root=0, edges=[(0, i) for i in range(1, nranks)], weight=1.0),
        T(root=nranks - 1, edges=[(i + 1, i) for i in range(nranks - 1)], weight=2.0),
        T(root=1 % nranks, edges=[(1 % nranks, i) for i in range(nranks) if i != 1 % nranks],
          weight=1.0),
    ]
    s = lower_trees(trees, nranks=nranks, collective="allreduce", count=count,
                    dtype=dtype, chunks=chunks)
    return np.asarray(s.validate().encode())


def one_device_collective(x, device):
    """Runs the blink_psum primitive over a one-device mesh on ``device``.

    ``jax_blink.psum`` leaves single devices to ``lax.psum``; binding the
    primitive directly still lowers to the custom call (a one-rank schedule:
    the handler copies the input), which checks the lowering and the FFI
    handler of the device's platform under real XLA. Returns the output and
    the compiled program's text.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from jax_blink import Topology
    from jax_blink.choice.requests import PlanRequest
    from jax_blink.ops.primitive import bind_collective

    mesh = jax.sharding.Mesh(np.asarray([device]), ("x",))
    request = PlanRequest(Topology.preset("shm:1"))

    def body(v):
        flat = bind_collective(v.reshape(-1), jnp.int32(0), jnp.int32(0), axes=("x",),
                               request=request, timeout_ms=10_000, mode="varying")
        return flat.reshape(v.shape)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False))
    x = jax.device_put(x, device)
    return np.asarray(f(x)), f.lower(x).compile().as_text()
