"""jax_blink's collectives over CPU devices of several processes of one host, against lax's.

Each subcommand launches local jax.distributed jobs (jax_blink.launch.run_local:
127.0.0.1, gloo for lax) of P processes x L CPU devices, for each ``--layouts PxL``,
whose processes run this script again (``SUB --worker``) and report to this one
(harness.print_result). Calls are timed interleaved (harness.interleaved: each round
calls every arm once, alternating the order), medians reported, and every result is
checked per element against lax's (jax_blink.numerics.wrong_vs_reference: within both
summation orders' bounds).

* ``host_transport``: one schedule over the host's shared memory (the default path of
  processes of one host). Per float32 size per device, over a mesh ("i",) of every device:
  ``blink`` = ``jax_blink.psum``; ``lax`` = ``lax.psum`` in the same processes; ``old`` =
  ``jax_blink.psum`` with ``JAX_BLINK_HOST_TRANSPORT=0`` (lax with one device per process,
  the hierarchical path with several). A ``1xN`` layout is one process with every device:
  the in-process reference P x L is compared with. ``alone`` times ``blink`` again with
  no other collective between its calls: gloo's calls of ``lax`` and ``old`` slow the
  next call of a job of several processes, and a one-process job makes none, so P x L
  is compared with 1 x P*L on these. The ``step`` rows time an MLP training step (8
  layers of 512 x 512) with each psum, its gradients summed leaf by leaf (one call per
  leaf, as loops written for lax.psum often do; XLA merges lax's) and as one pytree
  (one call, in buckets); the pytree's row times ``concat`` too: the same psum with
  each bucket's leaves concatenated into one vector first (``JAX_BLINK_SEGMENTED=0``)
  instead of passed as separate operands.
* ``multiprocess``: the path of processes on different hosts
  (``JAX_BLINK_HOST_TRANSPORT=0``), over a mesh ("host", "local"): ``jax_blink.psum(x,
  ("host", "local"))`` (Blink reduce-scatter in each process, gloo allreduce of the
  shards across processes, Blink all-gather) against ``lax.psum``, per float32 size per
  device; likewise ``psum_scatter`` (tiled), ``all_gather`` (tiled) and ``broadcast``
  from the last device (against lax's equivalent, the psum of the root's value) with
  ``--ops``. all_gather and broadcast count any difference from lax's as wrong.

    python benchmarks/bench_processes.py host_transport [--layouts 2x1 4x1 2x4 1x8] [--sizes 1 1e3 1e6]
        [--reps 50] [--layers 8] [--json OUT]
    python benchmarks/bench_processes.py multiprocess [--layouts 2x4 4x2] [--sizes 1e3 1e5]
        [--ops psum psum_scatter all_gather broadcast] [--reps 20] [--json OUT]

Each writes ``benchmarks/results/<SUB>_<machine>.json`` (``--machine``: another name;
``--json``: another file), with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import harness

#: The collective decide's ``across`` prices each op as (psum and broadcast: allreduce).
COLLECTIVE = {"psum_scatter": "reduce_scatter", "all_gather": "allgather"}
OPS = ["psum", "psum_scatter", "all_gather", "broadcast"]


def _medians_ms(times: dict) -> dict:
    import numpy as np

    return {k: 1e3 * float(np.median(v)) for k, v in times.items()}


def host_transport_worker(sizes, reps, step_layers):
    from jax_blink.launch import initialize

    pid = initialize()
    import numpy as np

    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_blink
    from jax_blink import numerics

    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("i",))

    def placed(x):
        return jax.make_array_from_callback(x.shape, NamedSharding(mesh, P("i")), lambda i: x[i])

    #: what each arm turns off when it is traced
    off = {"old": "JAX_BLINK_HOST_TRANSPORT", "concat": "JAX_BLINK_SEGMENTED"}

    def traced(f, arm, *args):
        """Runs ``f`` once (tracing it) with what ``arm`` turns off set to 0."""
        if arm not in off:
            return f(*args)
        os.environ[off[arm]] = "0"
        try:
            return f(*args)
        finally:
            os.environ.pop(off[arm])

    def fn(reduce):
        return jax.jit(jax.shard_map(lambda v: reduce(v, "i"), mesh=mesh, in_specs=P("i"),
                                     out_specs=P()))

    def timed(fns, args, rounds):
        calls = {k: (lambda f=f: jax.block_until_ready(f(*args))) for k, f in fns.items()}
        harness.interleaved(calls, 3)  # warm: gloo sets up its contexts in the first calls
        return _medians_ms(harness.interleaved(calls, rounds))

    rows = []
    for size in sizes:
        rng = np.random.default_rng(size)
        x = rng.standard_normal((n, size)).astype(np.float32)
        xs = placed(x)
        fns = {"blink": fn(jax_blink.psum), "lax": fn(lax.psum)}
        if jax.process_count() > 1:
            fns["old"] = fn(jax_blink.psum)
        outs = {}
        for k, f in fns.items():
            outs[k] = np.asarray(traced(f, k, xs).addressable_shards[0].data)
            if k == "blink":
                explained = jax_blink.explain()
        mag = np.asarray(fns["lax"](placed(np.abs(x))).addressable_shards[0].data)
        wrong = {k: int(numerics.wrong_vs_reference(outs[k], outs["lax"], mag, n))
                 for k in fns if k != "lax"}
        count = max(10, min(reps, int(2e9 // (size * 4 * jax.local_device_count()))))
        med = timed(fns, (xs,), count)
        alone = timed({"blink": fns["blink"]}, (xs,), count)["blink"]
        rows.append({"what": "psum", "size": size, "reps": count, "wrong": wrong,
                     **{f"{k}_ms": v for k, v in med.items()}, "blink_alone_ms": alone,
                     "explain": explained.splitlines()[-1][:300]})
    # an MLP step, its grads summed leaf by leaf (as many data-parallel loops do) or as one pytree
    width = 512
    params = [(np.full((width, width), 0.01, np.float32), np.zeros((width,), np.float32))
              for _ in range(step_layers)]
    batch = np.random.default_rng(0).standard_normal((n * 8, width)).astype(np.float32)
    pspec = jax.tree.map(lambda _: P(), params)

    def make_step(reduce, per_leaf):
        def loss(ps, xb):
            h = xb
            for w, b in ps:
                h = jnp.tanh(h @ w + b)
            return (h * h).mean()

        def body(ps, xb):
            g = jax.grad(loss)(ps, xb)
            if reduce is not None:
                g = jax.tree.map(lambda leaf: reduce(leaf, "i"), g) if per_leaf else reduce(g, "i")
            return jax.tree.map(lambda p, d: p - 0.1 * d, ps, g)

        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(pspec, P("i")),
                                     out_specs=pspec, check_vma=False))

    rep = jax.tree.map(lambda a: jax.device_put(a, NamedSharding(mesh, P())), params)
    xb = placed(batch)
    for per_leaf in (True, False):
        steps = {"blink": make_step(jax_blink.psum, per_leaf), "lax": make_step(lax.psum, per_leaf),
                 "none": make_step(None, per_leaf)}
        if jax.process_count() > 1:
            steps["old"] = make_step(jax_blink.psum, per_leaf)
        if not per_leaf:
            steps["concat"] = make_step(jax_blink.psum, per_leaf)
        finals = {k: traced(f, k, rep, xb) for k, f in steps.items()}  # compiles
        ref = jax.tree.leaves(finals["lax"])
        # parameters after one update, not sums: lax's within 1e-5 (an update scales the sum by 0.1)
        wrong = {k: sum(int((np.abs(np.asarray(a.addressable_shards[0].data)
                                    - np.asarray(b.addressable_shards[0].data)) > 1e-5).sum())
                        for a, b in zip(jax.tree.leaves(v), ref))
                 for k, v in finals.items() if k not in ("lax", "none")}
        med = timed(steps, (rep, xb), max(5, reps))
        alone = timed({"blink": steps["blink"]}, (rep, xb), max(5, reps))["blink"]
        how = "per-leaf psum" if per_leaf else "one psum of the pytree"
        rows.append({"what": f"step ({step_layers} x {width}x{width} MLP, {how})",
                     "size": sum(w.size + b.size for w, b in params), "reps": max(5, reps),
                     "wrong": wrong, **{f"{k}_ms": v for k, v in med.items()},
                     "blink_alone_ms": alone})
    if pid == 0:
        from jax_blink.choice import predict_cpu

        profile = predict_cpu.cpu_allreduce(4, jax.process_count(), jax.local_device_count()).source
        harness.print_result({"processes": jax.process_count(),
                              "devices_per_process": jax.local_device_count(),
                              "profile": profile, "rows": rows})
    if jax.process_count() > 1:
        jax.distributed.shutdown()


def multiprocess_worker(sizes, reps, ops):
    from jax_blink.launch import initialize

    pid = initialize()
    import numpy as np

    import jax
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_blink
    from jax_blink import numerics
    from jax_blink.choice.decide import across

    nproc, local = jax.process_count(), jax.local_device_count()
    mesh = jax.make_mesh((nproc, local), ("host", "local"))
    axes = ("host", "local")
    root = nproc * local - 1
    pairs = {"psum": (jax_blink.psum, lax.psum),
             "psum_scatter": (lambda v, a: jax_blink.psum_scatter(v, a, tiled=True),
                              lambda v, a: lax.psum_scatter(v, a, tiled=True)),
             "all_gather": (lambda v, a: jax_blink.all_gather(v, a, tiled=True),
                            lambda v, a: lax.all_gather(v, a, tiled=True)),
             "broadcast": (lambda v, a: jax_blink.broadcast(v, a, root=root),
                           lambda v, a: lax.psum(jax.numpy.where(lax.axis_index(a) == root, v, 0), a))}

    def placed(x):
        return jax.make_array_from_callback(x.shape, NamedSharding(mesh, P("host", "local")), lambda i: x[i])

    rows = []
    for op in ops:
        ours, ref = pairs[op]
        for size in sizes:
            size -= size % (nproc * local)  # psum_scatter's tiled split
            rng = np.random.default_rng(size)
            x = rng.standard_normal((nproc, local, size)).astype(np.float32)
            xs = placed(x)
            if op in ("psum", "broadcast"):  # (1, 1, size) per device in, the replicated result out
                fns = {name: jax.jit(jax.shard_map(lambda v, f=f: f(v, axes), mesh=mesh,
                                                   in_specs=P("host", "local"), out_specs=P()))
                       for name, f in (("blink", ours), ("lax", ref))}
            else:  # each device's shard or gathered vector
                fns = {name: jax.jit(jax.shard_map(lambda v, f=f: f(v[0, 0], axes)[None, None],
                                                   mesh=mesh, in_specs=P("host", "local"),
                                                   out_specs=P("host", "local")))
                       for name, f in (("blink", ours), ("lax", ref))}
            outs = {k: [np.asarray(s.data) for s in f(xs).addressable_shards]
                    for k, f in fns.items()}
            if op in ("all_gather", "broadcast"):  # no arithmetic: lax's bits exactly
                wrong = sum(int((a != b).sum()) for a, b in zip(outs["blink"], outs["lax"]))
            else:  # the magnitude: lax's same reduction of |x|
                mag = [np.asarray(s.data) for s in fns["lax"](placed(np.abs(x))).addressable_shards]
                wrong = sum(numerics.wrong_vs_reference(a, b, m, nproc * local)
                            for a, b, m in zip(outs["blink"], outs["lax"], mag))
            n = max(3, min(reps, int(2e8 // (size * 4 * local))))
            med = _medians_ms(harness.interleaved(
                {k: (lambda f=f: jax.block_until_ready(f(xs))) for k, f in fns.items()}, n))
            # what jax_blink ran: the library's own choice for this op and size
            choice = across(op, axes, "lax", COLLECTIVE.get(op, "allreduce"), {"float32": size}, nproc,
                            local).chosen
            rows.append({"op": op, "size": size, "bytes_per_device": size * 4, "reps": n,
                         "runs": "lax" if choice == "lax" else "hierarchical",
                         "blink_ms": med["blink"], "lax_ms": med["lax"],
                         "ratio": med["blink"] / med["lax"], "wrong": int(wrong)})
    if pid == 0:
        harness.print_result({"processes": nproc, "devices_per_process": local, "rows": rows})
    jax.distributed.shutdown()


def _layouts(layouts):
    return [tuple(int(v) for v in layout.split("x")) for layout in layouts]


def _job(argv, processes, devices, env=None, alone=False):
    """Process 0's result of ``argv`` as a local job (None after printing why not); with
    ``alone``, one process outside any job (nothing to join), with ``devices`` CPU devices."""
    from jax_blink.launch import run_local

    if alone:
        env = dict(os.environ if env is None else env,
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
        return harness.job_result([(proc.returncode == 0, proc.stdout, proc.stderr)])
    rs = run_local(argv, processes, devices_per_process=devices, timeout_s=1800, env=env)
    return harness.job_result([(r.ok, r.stdout, r.stderr) for r in rs])


def _write(args, sub: str, results: list, **extra) -> None:
    import jax

    path = args.json or str(harness.RESULTS / f"{sub}_{args.machine or harness.machine_tag()}.json")
    command = "python benchmarks/bench_processes.py " + " ".join(args.argv)
    with open(path, "w") as f:
        json.dump({"machine": harness.machine(jax=jax.__version__), "command": command, **extra,
                   "results": results}, f, indent=1)
    print(f"wrote {path}")


def host_transport(args) -> int:
    sizes = [int(s) for s in args.sizes]
    if args.worker:
        host_transport_worker(sizes, args.reps, args.layers)
        return 0
    command = [sys.executable, os.path.abspath(__file__), "host_transport", "--worker",
               "--sizes", *map(str, sizes), "--reps", str(args.reps), "--layers", str(args.layers)]
    results = []
    for p, d in _layouts(args.layouts):
        res = _job(command, p, d, alone=p == 1)
        if res is None:
            return 1
        results.append(res)
        print(f"\n{p} processes x {d} CPU devices, float32, medians; jax_blink.psum (auto) chooses from "
              f"{res.get('profile', 'the recorded costs')}")
        print(f"{'what':>10} {'elements':>10} {'blink ms':>9} {'alone ms':>9} {'lax ms':>9} "
              f"{'old ms':>9} {'blink/lax':>9} {'old/lax':>8}  wrong")
        for row in res["rows"]:
            old = row.get("old_ms")
            print(f"{row['what'][:10]:>10} {row['size']:>10} {row['blink_ms']:>9.3f} "
                  f"{row['blink_alone_ms']:>9.3f} "
                  f"{row['lax_ms']:>9.3f} {old if old is not None else float('nan'):>9.3f} "
                  f"{row['blink_ms'] / row['lax_ms']:>9.2f} "
                  f"{(old / row['lax_ms']) if old else float('nan'):>8.2f}  {row['wrong']}"
                  + (f"  none {row['none_ms']:.3f} ms" if "none_ms" in row else "")
                  + (f"  concat {row['concat_ms']:.3f} ms (blink/concat {row['blink_ms'] / row['concat_ms']:.2f})"
                     if "concat_ms" in row else ""))
    _write(args, "host_transport", results)
    return 0


def multiprocess(args) -> int:
    sizes = [int(s) for s in args.sizes]
    if args.worker:
        multiprocess_worker(sizes, args.reps, args.ops)
        return 0
    command = [sys.executable, os.path.abspath(__file__), "multiprocess", "--worker",
               "--sizes", *map(str, sizes), "--reps", str(args.reps), "--ops", *args.ops]
    results = []
    for p, d in _layouts(args.layouts):
        res = _job(command, p, d, env=dict(os.environ, JAX_BLINK_HOST_TRANSPORT="0"))
        if res is None:
            return 1
        results.append(res)
        print(f"\n{p} processes x {d} CPU devices, over ('host', 'local'), float32")
        print(f"{'op':>13} {'elements/device':>16} {'bytes/device':>13} {'jax_blink runs':>15} "
              f"{'blink ms':>10} {'lax ms':>10} {'blink/lax':>10} {'wrong':>6}")
        for row in res["rows"]:
            print(f"{row['op']:>13} {row['size']:>16} {row['bytes_per_device']:>13} "
                  f"{row['runs']:>15} {row['blink_ms']:>10.3f} {row['lax_ms']:>10.3f} "
                  f"{row['ratio']:>10.2f} {row['wrong']:>6}")
    _write(args, "multiprocess", results)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="sub", required=True)

    def common(p):
        p.add_argument("--json", help="write the results here (default: benchmarks/results/<SUB>_<machine>.json)")
        p.add_argument("--machine", help="the machine's name in the default results file (default: this one's)")
        p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # a process of the job

    ht = sub.add_parser("host_transport", help="the host transport against lax and the path without it")
    ht.add_argument("--layouts", nargs="+", default=["2x1", "4x1", "2x4", "1x8"],
                    help="processes x devices per process (1xN: the in-process reference)")
    ht.add_argument("--sizes", nargs="+", type=float, default=[1, 1e2, 1e3, 1e4, 1e5, 1e6, 4e6],
                    help="float32 elements per device")
    ht.add_argument("--reps", type=int, default=50, help="timed calls per size (at most)")
    ht.add_argument("--layers", type=int, default=8, help="MLP layers of the step rows")
    common(ht)
    ht.set_defaults(run=host_transport)
    mp = sub.add_parser("multiprocess", help="the path of processes on different hosts against lax")
    mp.add_argument("--layouts", nargs="+", default=["2x4", "4x2"], help="processes x devices per process")
    mp.add_argument("--sizes", nargs="+", type=float, default=[1e3, 1e4, 1e5, 1e6, 1e7],
                    help="float32 elements per device")
    mp.add_argument("--reps", type=int, default=20, help="timed calls per op and size (at most)")
    mp.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    common(mp)
    mp.set_defaults(run=multiprocess)
    args = ap.parse_args(argv)
    args.argv = argv
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
