"""One process of tests/multiprocess/test_multiprocess.py (started by
jax_blink.launch.run_local): jax_blink's collectives against lax's over
devices of several processes. Prints one line per failed check and a last
line ``CHECKS <n> FAILED <m>``; exits 1 if any failed.

    python worker.py cases       every case below (run with JAX_BLINK_HOST_TRANSPORT=0: the
                                 hierarchical path and lax, as across hosts)
    python worker.py host        the host transport: every collective over devices of several
                                 processes of this host as one schedule over shared memory
    python worker.py absent      process 1 never calls the collective
    python worker.py killed      process 1 is killed in the middle of a call
    python worker.py hosts       two labelled hosts (JAX_BLINK_HOST_KEY) of NPROC/2 processes: the
                                 hierarchical path across them, the host transport inside each
    python worker.py obey        every op over the host transport runs what the machine profile
                                 (JAX_BLINK_PROFILE) measured faster (JAX_BLINK_EXPECT)
"""

import os
import signal
import sys
import threading
import time
import traceback

import numpy as np

import jax_blink
from jax_blink import numerics
from jax_blink.launch import initialize

pid = initialize()
if sys.argv[1:] == ["hosts"]:  # the first half of the processes on one (labelled) host
    os.environ["JAX_BLINK_HOST_KEY"] = f"host{pid // (int(os.environ['JAX_BLINK_NUM_PROCESSES']) // 2)}"

import jax  # noqa: E402  (after initialize: the device count is the job's)
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

jax.config.update("jax_enable_x64", True)
NPROC, LOCAL = jax.process_count(), jax.local_device_count()
N = NPROC * LOCAL
MESH2 = jax.make_mesh((NPROC, LOCAL), ("host", "local"))
MESH1 = jax.make_mesh((N,), ("i",))
checks, failures = 0, []


def data(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith(("int", "uint")):
        return rng.integers(0, 100, shape).astype(dtype)
    if dtype == "bfloat16":
        return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    if dtype.startswith("complex"):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def placed(x, mesh, spec):
    """The global array x (leading axes: the mesh's) on the mesh."""
    return jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda i: x[i])


def local(a):
    return [np.asarray(s.data) for s in a.addressable_shards]


def check(name, ours, ref, magnitude=None, exact=False):
    """ours and ref (lists of local shards: jax_blink's and lax's sums of the same values)
    agree: exactly (integers, copies, max/min), or per element within both summation
    orders' bounds (jax_blink.numerics), ``magnitude`` being the same reduction of |x|."""
    global checks
    checks += 1
    try:
        mags = magnitude if magnitude is not None else [None] * len(ours)
        for o, r, m in zip(ours, ref, mags):
            assert o.dtype == r.dtype and o.shape == r.shape, (o.dtype, r.dtype, o.shape, r.shape)
            if exact or o.dtype.kind in "iub":
                np.testing.assert_array_equal(o, r)
            else:
                # across processes the partial sums travel between the phases in the value's own
                # dtype, and gloo adds float16/bfloat16 in it: bound both by that dtype
                half = o.dtype.name in ("float16", "bfloat16")
                acc = o.dtype.name if half else None
                wrong = numerics.wrong_vs_reference(o, r, m, N, accumulate=acc,
                                                    reference_accumulate=acc)
                assert wrong == 0, f"{wrong} element(s) outside the summation-order bound"
    except Exception as e:  # noqa: BLE001 (reported, then the next case)
        failures.append(f"{name}: {type(e).__name__}: {str(e)[:400]}")


def check_grad(name, ours, ref):
    """Gradients through a sum: per element within a relative 1e-4 (float32: the sum's
    rounding, carried through sin and products) or 1e-6 of the largest gradient."""
    global checks
    checks += 1
    try:
        for o, r in zip(ours, ref):
            np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-6 * float(np.abs(r).max()))
    except Exception as e:  # noqa: BLE001
        failures.append(f"{name}: {type(e).__name__}: {str(e)[:400]}")


def run(name, ours_fn, ref_fn, mesh, in_spec, out_spec, x, check_vma=True, exact=False):
    try:
        xs = jax.tree.map(lambda a: placed(a, mesh, in_spec), x)
        f = lambda fn: jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_spec,
                                             out_specs=out_spec, check_vma=check_vma))(xs)
        ours, ref = f(ours_fn), f(ref_fn)
        mags = [None] * len(jax.tree.leaves(ours))
        if not exact:  # the same (linear) reduction of |x|: each element's sum of |summands|
            absx = jax.tree.map(lambda a: placed(np.abs(np.asarray(a)).astype(np.float64), mesh, in_spec), x)
            mags = jax.tree.leaves(jax.jit(jax.shard_map(ref_fn, mesh=mesh, in_specs=in_spec, out_specs=out_spec,
                                                         check_vma=check_vma))(absx))
        for o, r, m in zip(jax.tree.leaves(ours), jax.tree.leaves(ref), mags):
            check(name, local(o), local(r), None if m is None else local(m), exact)
    except Exception:  # noqa: BLE001
        failures.append(f"{name}: {traceback.format_exc()[-1500:]}")


def explained(name, *texts):
    global checks
    checks += 1
    last = jax_blink.explain()
    if not all(t in last for t in texts):
        failures.append(f"{name}: explain() lacks {texts}:\n{last}")


DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint32", "int8",
          "bool", "complex64"]


def cases():
    both, one = ("host", "local"), "i"
    for k, dtype in enumerate(DTYPES):
        x = data(dtype, (NPROC, LOCAL, 37), k)  # 37: not a multiple of the device counts
        run(f"psum {dtype} over {both}", lambda v: jax_blink.psum(v, both),
            lambda v: lax.psum(v, both), MESH2, P("host", "local"), P(), x)
        run(f"psum {dtype} over {one}", lambda v: jax_blink.psum(v, one),
            lambda v: lax.psum(v, one), MESH1, P("i"), P(), x.reshape(N, 37))
    explained("hierarchical over both", "hierarchical (2 processes" if NPROC == 2 else
              "hierarchical (", "plan on shm:")
    for op in ("pmax", "pmin"):
        for dtype in ("float32", "int32", "bfloat16"):
            x = data(dtype, (NPROC, LOCAL, 19), 7)
            run(f"{op} {dtype} over {both}", lambda v: getattr(jax_blink, op)(v, both),
                lambda v: getattr(lax, op)(v, both), MESH2, P("host", "local"), P(), x,
                exact=True)
            run(f"{op} {dtype} over {one}", lambda v: getattr(jax_blink, op)(v, one),
                lambda v: getattr(lax, op)(v, one), MESH1, P("i"), P(), x.reshape(N, 19),
                exact=True)
        explained(f"{op} over one axis falls back", f"lax.{op}", "no grouped")
    x = data("float32", (NPROC, LOCAL, 11), 3)
    run("pmean", lambda v: jax_blink.pmean(v, both), lambda v: lax.pmean(v, both),
        MESH2, P("host", "local"), P(), x)
    # the process-local axis alone: today's in-process path in every process
    run("psum over local", lambda v: jax_blink.psum(v, "local"), lambda v: lax.psum(v, "local"),
        MESH2, P("host", "local"), P("host"), x)
    explained("in-process path", "plan on shm:")
    # the cross-process axis alone: one device per process, so lax
    run("psum over host", lambda v: jax_blink.psum(v, "host"), lambda v: lax.psum(v, "host"),
        MESH2, P("host", "local"), P(None, "local"), x)
    explained("cross axis alone", "each process owns one of the reduced devices")
    # pytrees of mixed dtypes and shapes, scalars included; check_vma off too
    tree = {"a": data("float32", (NPROC, LOCAL, 3, 5), 1), "b": data("int32", (NPROC, LOCAL), 2),
            "c": [data("float64", (NPROC, LOCAL, 1000), 4), data("float32", (NPROC, LOCAL, 7), 5)]}
    for vma in (True, False):
        run(f"pytree check_vma={vma}", lambda v: jax_blink.psum(v, both),
            lambda v: lax.psum(v, both), MESH2, P("host", "local"), P(), tree, check_vma=vma)
    # every in-process phase below min_bytes: the phases' lax fallbacks (an
    # empty leaf too), still typed as lax.psum's result
    small = {"a": data("float32", (NPROC, LOCAL, 9), 11), "e": np.zeros((NPROC, LOCAL, 0), np.float32)}
    for op in ("psum", "pmax"):
        run(f"{op} below min_bytes over {both}",
            lambda v: getattr(jax_blink, op)(v, both, min_bytes=1 << 30),
            lambda v: getattr(lax, op)(v, both), MESH2, P("host", "local"), P(), small,
            exact=op == "pmax")
    run(f"psum below min_bytes over {one}", lambda v: jax_blink.psum(v, one, min_bytes=1 << 30),
        lambda v: lax.psum(v, one), MESH1, P("i"), P(), small["a"].reshape(N, 9))
    explained("phases below min_bytes", "below min_bytes")
    # psum_scatter and all_gather: the per-size choice on CPU (small
    # reduce-scatters go to lax, small all-gathers are hierarchical) ...
    x = data("float32", (NPROC, LOCAL, N * 3), 6)
    run("psum_scatter auto", lambda v: jax_blink.psum_scatter(v, both, scatter_dimension=2, tiled=True),
        lambda v: lax.psum_scatter(v, both, scatter_dimension=2, tiled=True),
        MESH2, P("host", "local"), P("host", "local"), x)
    explained("psum_scatter auto", "lax.psum_scatter", "lax predicted faster", "CPU_CROSS_PROCESS_BYTES")
    # ... and JAX_BLINK_ALGO=lax sends every collective across processes to lax
    os.environ["JAX_BLINK_ALGO"] = "lax"
    run("psum with JAX_BLINK_ALGO=lax", lambda v: jax_blink.psum(v, both),
        lambda v: lax.psum(v, both), MESH2, P("host", "local"), P(), x)
    explained("JAX_BLINK_ALGO=lax", "lax.psum (JAX_BLINK_ALGO=lax)")
    # hierarchical (JAX_BLINK_ALGO=blink) over both layouts, the axes in either
    # order (which reorders the ranks)
    os.environ["JAX_BLINK_ALGO"] = "blink"
    layouts = ((("host", "local"), MESH2, P("host", "local"), (NPROC, LOCAL)),
               (("local", "host"), MESH2, P("host", "local"), (NPROC, LOCAL)),
               (("i",), MESH1, P("i"), (N,)))
    for axes, mesh, spec, lead in layouts:
        # every dtype in the first layout; the others reorder the same ranks (the executor
        # handles a dtype alike in any order), so float32 there
        dtypes = ("float32", "int32", "bfloat16", "complex64") if axes == layouts[0][0] else ("float32",)
        for k, dtype in enumerate(dtypes):
            x = data(dtype, lead + (N * 3, 2), 20 + k)
            for tiled in (True, False):
                xx = x if tiled else x[..., :N, :]
                run(f"psum_scatter {dtype} over {axes} tiled={tiled}",
                    lambda v: jax_blink.psum_scatter(v, axes, scatter_dimension=len(lead),
                                                     tiled=tiled),
                    lambda v: lax.psum_scatter(v, axes, scatter_dimension=len(lead), tiled=tiled),
                    mesh, spec, spec, xx)
                run(f"all_gather {dtype} over {axes} tiled={tiled}",
                    lambda v: jax_blink.all_gather(v, axes, axis=len(lead) + 1, tiled=tiled),
                    lambda v: lax.all_gather(v, axes, axis=len(lead) + 1, tiled=tiled),
                    mesh, spec, spec, x, exact=True)
        explained(f"all_gather over {axes}", "all_gather over", "hierarchical (")
        # gradients through the pair (each the other's transpose)
        w = data("float32", (N * 3,), 30)
        x = data("float32", lead + (N * 3,), 31)
        for vma in (True, False):
            def loss(scatter, gather, v, axes=axes, mesh=mesh, spec=spec, nlead=len(lead)):
                def body(a):
                    s = scatter(a, axes, scatter_dimension=nlead, tiled=True)
                    return (gather(jnp.sin(s), axes, axis=nlead, tiled=True) * w).sum(
                        keepdims=True)
                return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec,
                                     check_vma=vma)(v).sum()
            try:
                xs = placed(x, mesh, spec)
                ours = jax.jit(jax.grad(lambda v: loss(jax_blink.psum_scatter,
                                                       jax_blink.all_gather, v)))(xs)
                ref = jax.jit(jax.grad(lambda v: loss(lax.psum_scatter, lax.all_gather, v)))(xs)
                check_grad(f"grad scatter/gather over {axes} check_vma={vma}", local(ours),
                           local(ref))
            except Exception:  # noqa: BLE001
                failures.append(f"grad scatter/gather over {axes} check_vma={vma}: "
                                f"{traceback.format_exc()[-1500:]}")
    del os.environ["JAX_BLINK_ALGO"]
    # across processes, lax: an invariant gather (said by explain())
    both = ("host", "local")
    x = data("float32", (NPROC, LOCAL, N * 3), 6)
    run("all_gather invarying", lambda v: jax_blink.all_gather(v, both, axis=2, to="invarying"),
        lambda v: lax.all_gather(v, both, axis=2, to="invarying"),
        MESH2, P("host", "local"), P(), x)
    explained("invarying falls back", "lax.all_gather", "span processes")
    # broadcast: the hierarchical allreduce of the root's value, exactly the root's value
    # (NaN and inf kept; -0.0 arrives as 0.0, as from lax.psum of the masked value)
    root = 5 % N
    for dtype in ["float32", "bfloat16", "int8", "bool", "complex64", "float64"]:
        for mesh, spec, axes, shape in ((MESH2, P("host", "local"), both, (NPROC, LOCAL, 37)),
                                        (MESH1, P("i"), "i", (N, 37))):
            x = data(dtype, shape, 10)
            if dtype == "float32":
                x.reshape(N, -1)[root, :3] = [-0.0, np.inf, np.nan]
            run(f"broadcast {dtype} over {axes}", lambda v, axes=axes: jax_blink.broadcast(v, axes, root=root),
                lambda v, axes=axes: jax.tree.map(
                    lambda a: jnp.broadcast_to(lax.all_gather(a, axes, tiled=True)[root], a.shape), v),
                mesh, spec, spec, x, exact=True)
    explained("broadcast hierarchical", "broadcast over", "hierarchical")
    grads()
    permuted_mesh()


def permuted_mesh():
    """A mesh whose rows are not processes (devices out of jax.devices() order): jax_blink
    took "local" to be process-local from the abstract mesh, and refuses when lowering,
    in every process, before anything waits."""
    global checks
    checks += 1
    devices = np.array(sorted(jax.devices(), key=lambda d: d.id)).reshape(NPROC, LOCAL).T.reshape(NPROC, LOCAL)
    mesh = jax.sharding.Mesh(devices, ("host", "local"))
    x = placed(data("float32", (NPROC, LOCAL, 8), 7), mesh, P("host", "local"))
    f = jax.jit(jax.shard_map(lambda v: jax_blink.psum(v, "local"), mesh=mesh, in_specs=P("host", "local"),
                              out_specs=P("host")))
    try:
        jax.block_until_ready(f(x))
        failures.append("permuted mesh: jax_blink ran over a mesh that is not jax.devices() in order")
    except ValueError as e:
        if "not jax.devices() in id order" not in str(e):
            failures.append(f"permuted mesh: unexpected error {str(e)[:500]}")


def grads():
    """Gradients through the hierarchical psum and broadcast equal lax's."""
    both = ("host", "local")
    x = data("float32", (NPROC, LOCAL, 13), 8)
    w = data("float32", (13,), 9)
    root = 3 % N
    pairs = {"psum": (jax_blink.psum, lax.psum),
             "broadcast": (lambda a, axes: jax_blink.broadcast(a, axes, root=root),
                           lambda a, axes: lax.psum(jnp.where(lax.axis_index(axes) == root, a, 0), axes))}
    for vma in (True, False):
        for mesh, spec, axes, shape in ((MESH2, P("host", "local"), both, x.shape),
                                        (MESH1, P("i"), "i", (N, 13))):
            def loss(psum, v, axes=axes, mesh=mesh, spec=spec):
                body = lambda a: (jnp.sin(psum(a * a, axes)) * w).sum(keepdims=True)
                out = jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=P(),
                                    check_vma=vma)(v)
                return out.sum()
            xs = placed(x.reshape(shape), mesh, spec)
            for what, (mine, theirs) in pairs.items():
                try:
                    ours = jax.jit(jax.grad(lambda v: loss(mine, v)))(xs)
                    ref = jax.jit(jax.grad(lambda v: loss(theirs, v)))(xs)
                    check_grad(f"grad {what} over {axes} check_vma={vma}", local(ours), local(ref))
                except Exception:  # noqa: BLE001
                    failures.append(f"grad {what} over {axes} check_vma={vma}: "
                                    f"{traceback.format_exc()[-1500:]}")


def host():
    """Over the host transport (one schedule over every device, shared memory between the
    processes): each collective against lax's, on both meshes and every layout of the
    reduced devices over processes."""
    both, one = ("host", "local"), "i"
    for k, dtype in enumerate(DTYPES):
        x = data(dtype, (NPROC, LOCAL, 37), k)
        run(f"host psum {dtype} over {both}", lambda v: jax_blink.psum(v, both),
            lambda v: lax.psum(v, both), MESH2, P("host", "local"), P(), x)
        run(f"host psum {dtype} over {one}", lambda v: jax_blink.psum(v, one),
            lambda v: lax.psum(v, one), MESH1, P("i"), P(), x.reshape(N, 37))
    # several devices per process: trees packed on the processes' memories (reduce inside a
    # process before crossing); one each: shm:N
    explained("host transport", "shared memory of this host's processes",
              f"plan on shm:{N} in {NPROC} processes" if LOCAL > 1 else f"plan on shm:{N}:")
    for op in ("pmax", "pmin"):
        for dtype in ("float32", "int32", "bfloat16"):
            x = data(dtype, (NPROC, LOCAL, 19), 7)
            run(f"host {op} {dtype} over {one}", lambda v: getattr(jax_blink, op)(v, one),
                lambda v: getattr(lax, op)(v, one), MESH1, P("i"), P(), x.reshape(N, 19),
                exact=True)
    # in place: the sum of an intermediate takes its buffer, and a rank's writes of a chunk wait
    # for its copy into the arena for the other processes' ranks (several chunks per tree);
    # float16 accumulates in float32, so it does not run in place and copies its input whole
    for k, dtype in enumerate(("float32", "int32", "float16")):
        x = data(dtype, (N, 200_003), 30 + k)
        fn = lambda v: jax_blink.psum(v * 3, one)
        lowered = jax.jit(jax.shard_map(fn, mesh=MESH1, in_specs=P("i"), out_specs=P())).lower(
            placed(x, MESH1, P("i"))).as_text()
        if "output_operand_aliases" not in lowered:
            failures.append(f"host psum in place {dtype}: the custom call is not aliased")
            continue
        run(f"host psum in place {dtype}", fn, lambda v: lax.psum(v * 3, one), MESH1, P("i"), P(), x)
    x = data("float32", (NPROC, LOCAL, 11), 3)
    run("host pmean", lambda v: jax_blink.pmean(v, both), lambda v: lax.pmean(v, both),
        MESH2, P("host", "local"), P(), x)
    # the cross-process axis alone: one group per local index, each across the processes
    run("host psum over host", lambda v: jax_blink.psum(v, "host"), lambda v: lax.psum(v, "host"),
        MESH2, P("host", "local"), P(None, "local"), x)
    explained("cross axis alone", "shared memory", f"shm:{NPROC}")
    # the process-local axis alone: still in-process
    if LOCAL > 1:
        run("host psum over local", lambda v: jax_blink.psum(v, "local"),
            lambda v: lax.psum(v, "local"), MESH2, P("host", "local"), P("host"), x)
        explained("in-process path", f"plan on shm:{LOCAL}")
    # axis_index_groups whose groups span processes (lax takes them under check_vma=False)
    groups = [list(range(0, N, 2)), list(range(1, N, 2))]
    run("host psum in groups", lambda v: jax_blink.psum(v, one, axis_index_groups=groups),
        lambda v: lax.psum(v, one, axis_index_groups=groups), MESH1, P("i"), P("i"),
        data("float32", (N, 23), 12), check_vma=False)
    # pytrees of mixed dtypes and shapes (several buckets), check_vma both ways
    tree = {"a": data("float32", (NPROC, LOCAL, 3, 5), 1), "b": data("int32", (NPROC, LOCAL), 2),
            "c": [data("float64", (NPROC, LOCAL, 1000), 4), data("float32", (NPROC, LOCAL, 7), 5)]}
    for vma in (True, False):
        run(f"host pytree check_vma={vma}", lambda v: jax_blink.psum(v, both),
            lambda v: lax.psum(v, both), MESH2, P("host", "local"), P(), tree, check_vma=vma)
    host_segments()
    lateness()
    # psum_scatter, all_gather, broadcast
    x = data("float32", (N, N * 3, 2), 20)
    for tiled in (True, False):
        xx = x if tiled else x[:, :N]
        run(f"host psum_scatter tiled={tiled}",
            lambda v: jax_blink.psum_scatter(v, one, scatter_dimension=1, tiled=tiled),
            lambda v: lax.psum_scatter(v, one, scatter_dimension=1, tiled=tiled),
            MESH1, P("i"), P("i"), xx)
        run(f"host all_gather tiled={tiled}",
            lambda v: jax_blink.all_gather(v, one, axis=1, tiled=tiled),
            lambda v: lax.all_gather(v, one, axis=1, tiled=tiled), MESH1, P("i"), P("i"), x,
            exact=True)
    root = 5 % N
    x = data("float32", (N, 37), 10)
    run("host broadcast", lambda v: jax_blink.broadcast(v, one, root=root),
        lambda v: jnp.broadcast_to(lax.all_gather(v, one, tiled=True)[root], v.shape),
        MESH1, P("i"), P("i"), x, exact=True)
    # a call site inside a loop: the generations pair calls in order across processes
    x = data("float32", (N, 64), 13)
    run("host psum in a scan", lambda v: lax.scan(lambda c, _: (jax_blink.psum(c, one) / N, None),
                                                 v, None, length=5)[0],
        lambda v: lax.scan(lambda c, _: (lax.psum(c, one) / N, None), v, None, length=5)[0],
        MESH1, P("i"), P("i"), x, check_vma=False)
    grads()


def lateness():
    """jax_blink.stats() in every process names the ranks of the process that calls late."""
    global checks
    checks += 1
    x = placed(data("float32", (N, 1000), 40), MESH1, P("i"))
    f = jax.jit(jax.shard_map(lambda v: jax_blink.psum(v, "i"), mesh=MESH1, in_specs=P("i"),
                              out_specs=P()))
    jax.block_until_ready(f(x))
    jax_blink.stats(reset=True)
    for _ in range(4):
        if pid == NPROC - 1:
            time.sleep(0.04)
        jax.block_until_ready(f(x))
    got = jax_blink.stats().get(N)
    late = sorted(r for r, d in enumerate(MESH1.devices.flat) if d.process_index == NPROC - 1)
    seen = [] if got is None else [r for r, t in enumerate(got["mean_late_ms"]) if t > 20]
    if got is None or got["calls"] != 4 or seen != late:
        failures.append(f"stats(): want ranks {late} late in 4 calls, got {got}")


def host_segments():
    """A bucket's leaves as separate operands of one call over the host transport: leaves
    whose edges cut chunks anywhere, chunks that only their rank's process reads (in its
    output segments) among them; float32, bfloat16 (a float32 accumulator in the arena) and
    int32. Against lax, and bit for bit against the same bucket concatenated
    (JAX_BLINK_SEGMENTED=0: the same schedule sums in the same order); then random pytrees
    against lax."""
    global checks
    both = ("host", "local")
    shapes = ((1,), (37,), (50_003,), (3, 1000), (9_999,))
    os.environ["JAX_BLINK_ALGO"] = "blink"  # the plan, whatever this machine's profile says
    for dtype in ("float32", "bfloat16", "int32"):
        tree = [data(dtype, (NPROC, LOCAL) + shape, 40 + k) for k, shape in enumerate(shapes)]
        name = f"host segments {dtype}"
        run(name, lambda v: jax_blink.psum(v, both), lambda v: lax.psum(v, both),
            MESH2, P("host", "local"), P(), tree)
        explained(name, f"({len(shapes)} leaves as separate operands of one call)")
        xs = jax.tree.map(lambda a: placed(a, MESH2, P("host", "local")), tree)
        sums = {}
        for flag in ("1", "0"):
            os.environ["JAX_BLINK_SEGMENTED"] = flag
            try:  # a new function each time: a trace of its own
                fn = jax.jit(jax.shard_map(lambda v: jax_blink.psum(v, both), mesh=MESH2,
                                           in_specs=P("host", "local"), out_specs=P()))
                sums[flag] = [b for leaf in fn(xs) for b in local(leaf)]
            except Exception:  # noqa: BLE001
                failures.append(f"{name} ({flag}): {traceback.format_exc()[-1500:]}")
            finally:
                del os.environ["JAX_BLINK_SEGMENTED"]
        checks += 1
        if len(sums) == 2 and any(a.tobytes() != b.tobytes() for a, b in zip(sums["1"], sums["0"])):
            failures.append(f"{name}: the segmented sums differ from the concatenated bucket's")
    # random pytrees (the same draws in every process): mixed dtypes, odd leaf sizes, random
    # bucket sizes (segmented buckets, leaves alone, one bucket)
    rng = np.random.default_rng(7)
    for case in range(4):
        tree = []
        for k in range(int(rng.integers(2, 8))):
            dtype = ("float32", "bfloat16", "int32", "float64", "int8")[int(rng.integers(5))]
            size = int(rng.integers(1, 40_000)) if rng.random() < 0.3 else int(rng.integers(1, 300))
            tree.append(data(dtype, (NPROC, LOCAL, size), 100 * case + k))
        bucket = (None, 64, 4096, 1 << 16)[int(rng.integers(4))]
        run(f"host random pytree {case} (bucket_bytes={bucket})",
            lambda v, b=bucket: jax_blink.psum(v, both, bucket_bytes=b), lambda v: lax.psum(v, both),
            MESH2, P("host", "local"), P(), tree)
    del os.environ["JAX_BLINK_ALGO"]


def two_hosts():
    """Processes 0..NPROC/2-1 and the rest labelled as two hosts: a collective over every
    device takes the hierarchical path across the hosts, its in-host phases over the host
    transport."""
    one = "i"
    for k, dtype in enumerate(("float32", "int32", "bfloat16", "float64")):
        x = data(dtype, (N, 37), k)
        run(f"hosts psum {dtype}", lambda v: jax_blink.psum(v, one), lambda v: lax.psum(v, one),
            MESH1, P("i"), P(), x)
    explained("across hosts", f"hierarchical (2 hosts x {N // 2} devices", "in-host groups")
    run("hosts pmean", lambda v: jax_blink.pmean(v, one), lambda v: lax.pmean(v, one),
        MESH1, P("i"), P(), data("float32", (N, 11), 3))
    x = data("float32", (N, N * 3, 2), 20)
    os.environ["JAX_BLINK_ALGO"] = "blink"  # the hierarchical path at every size
    run("hosts psum_scatter", lambda v: jax_blink.psum_scatter(v, one, scatter_dimension=1, tiled=True),
        lambda v: lax.psum_scatter(v, one, scatter_dimension=1, tiled=True), MESH1, P("i"), P("i"), x)
    run("hosts all_gather", lambda v: jax_blink.all_gather(v, one, axis=1, tiled=True),
        lambda v: lax.all_gather(v, one, axis=1, tiled=True), MESH1, P("i"), P("i"), x, exact=True)
    del os.environ["JAX_BLINK_ALGO"]
    root = 5 % N
    run("hosts broadcast", lambda v: jax_blink.broadcast(v, one, root=root),
        lambda v: jnp.broadcast_to(lax.all_gather(v, one, tiled=True)[root], v.shape),
        MESH1, P("i"), P("i"), data("float32", (N, 37), 10), exact=True)
    # the in-host phases ran over shared memory (the last recorded decisions: all_gather's)
    run("hosts psum again", lambda v: jax_blink.psum(v, one), lambda v: lax.psum(v, one),
        MESH1, P("i"), P(), data("float32", (N, 1000), 4))
    explained("in-host phases", "one schedule over the shared memory of this host's processes")


def killed():
    """Process 1 is killed (SIGKILL) inside a psum: its rank has joined the call and waits
    for process 0's, which arrives a second later. The other ranks fail with an error that
    names the exited process, within about twice the timeout, not a hang."""
    global checks
    checks += 1
    x = placed(data("float32", (N, 1 << 16), 0), MESH1, P("i"))
    f = jax.jit(jax.shard_map(lambda v: jax_blink.psum(v, "i", timeout_s=3),
                              mesh=MESH1, in_specs=P("i"), out_specs=P()))
    jax.block_until_ready(f(x))  # compiled and run once by everyone
    print("EXPLAIN", jax_blink.explain().splitlines()[-1], flush=True)
    if pid == 1:
        # its ranks join and wait for process 0's (from a thread: with one device per process
        # the call may not return before the collective does)
        threading.Thread(target=f, args=(x,), daemon=True).start()
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1.0)
    start = time.monotonic()
    try:
        jax.block_until_ready(f(x))
        failures.append("killed: the collective returned although process 1 was killed")
    except Exception as e:  # noqa: BLE001
        print(f"ERROR after {time.monotonic() - start:.1f} s {type(e).__name__}: {str(e)[:2000]}",
              flush=True)
    for msg in failures:
        print("FAIL", msg, flush=True)
    print(f"CHECKS {checks} FAILED {len(failures)}", flush=True)
    # the job's coordination service would wait for the dead process at exit
    os._exit(1 if failures else 0)


def absent(after_one=False, dies=False):
    """Process 1 never calls the collective (``after_one``: after one call
    that both made; ``dies``: it exits there): process 0 must fail with an
    error, not hang."""
    global checks
    checks += 1
    x = placed(data("float32", (NPROC, LOCAL, 64), 0), MESH2, P("host", "local"))
    f = jax.jit(jax.shard_map(lambda v: jax_blink.psum(v, ("host", "local"), timeout_s=5),
                              mesh=MESH2, in_specs=P("host", "local"), out_specs=P()))
    if after_one:
        jax.block_until_ready(f(x))
    if pid == 1:
        if dies:
            os._exit(3)
        return
    try:
        jax.block_until_ready(f(x))
        failures.append("absent: the collective returned although process 1 never called it")
    except Exception as e:  # noqa: BLE001
        print(f"ERROR {type(e).__name__}: {str(e)[:2000]}", flush=True)


def obey():
    """Every op over the devices of this host's processes runs what the machine profile
    (JAX_BLINK_PROFILE, written by the test) measured faster, JAX_BLINK_EXPECT ("blink":
    jax_blink's custom call in the program; "lax": none), and gives lax's result."""
    global checks
    want, one = os.environ["JAX_BLINK_EXPECT"], "i"
    ops = {"psum": (lambda v: jax_blink.psum(v, one), lambda v: lax.psum(v, one), P()),
           "pmax": (lambda v: jax_blink.pmax(v, one), lambda v: lax.pmax(v, one), P()),
           "pmin": (lambda v: jax_blink.pmin(v, one), lambda v: lax.pmin(v, one), P()),
           "pmean": (lambda v: jax_blink.pmean(v, one), lambda v: lax.pmean(v, one), P()),
           "psum_scatter": (lambda v: jax_blink.psum_scatter(v, one, scatter_dimension=1, tiled=True),
                            lambda v: lax.psum_scatter(v, one, scatter_dimension=1, tiled=True), P("i")),
           "all_gather": (lambda v: jax_blink.all_gather(v, one, axis=1, tiled=True),
                          lambda v: lax.all_gather(v, one, axis=1, tiled=True), P("i")),
           "broadcast": (lambda v: jax_blink.broadcast(v, one, root=0),
                         lambda v: jnp.broadcast_to(lax.all_gather(v, one, tiled=True)[0], v.shape), P("i"))}
    for count in (N * 500, N * 60_000):
        x = data("float32", (N, count), count)
        for name, (ours, ref, out) in ops.items():
            hlo = jax.jit(jax.shard_map(ours, mesh=MESH1, in_specs=P("i"), out_specs=out)).lower(
                placed(x, MESH1, P("i"))).as_text()
            ran = "blink" if "jax_blink_collective" in hlo else "lax"
            checks += 1
            if ran != want:
                failures.append(f"obey {name} {count}: ran {ran}, the profile says {want}:\n"
                                f"{jax_blink.explain()}")
            run(f"obey {name} {count}", ours, ref, MESH1, P("i"), out, x,
                exact=name in ("pmax", "pmin", "all_gather", "broadcast"))


if __name__ == "__main__":
    {"cases": cases, "host": host, "hosts": two_hosts, "killed": killed, "absent": absent, "obey": obey,
     "absent-later": lambda: absent(after_one=True),
     "dies": lambda: absent(after_one=True, dies=True)}[sys.argv[1]]()
    for f in failures:
        print("FAIL", f, flush=True)
    print(f"CHECKS {checks} FAILED {len(failures)}", flush=True)
    sys.stdout.flush()
    if sys.argv[1] in ("cases", "host", "hosts", "obey"):
        jax.distributed.shutdown()
    sys.exit(1 if failures else 0)
