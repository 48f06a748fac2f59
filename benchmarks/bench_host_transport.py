"""One process per device on one host: jax_blink's host transport against lax.

Launches local jax.distributed jobs (jax_blink.launch.run_local: 127.0.0.1,
gloo for lax) of P processes x L CPU devices, for (P, L) in (2, 1), (4, 1)
and (2, 4), and times, per float32 size per device, with the calls
interleaved:

* ``blink``: ``jax_blink.psum`` over every device of the job, one schedule
  over the host's shared memory (the host transport, the default);
* ``lax``: ``lax.psum`` in the same processes (gloo across processes);
* ``old``: ``jax_blink.psum`` with ``JAX_BLINK_HOST_TRANSPORT=0`` (lax with one
  device per process, the hierarchical path with several), what jax_blink did
  before the host transport.

A ``1 x P*L`` run (one process with every device) gives the in-process
reference the issue compares P x L against. ``alone`` times ``blink`` again
with no other collective between its calls: the gloo calls of ``lax`` and
``old`` slow the next call of a job of several processes (2 x 4 at 1e3
elements: 0.75 ms interleaved, 0.51 ms alone, in the recorded run), and a
one-process job makes none, so P x L is compared with 1 x P*L on these.
Every result is checked per element against lax's (jax_blink.numerics); the
``step`` rows time an MLP training step (8 layers of 512 x 512) with each psum,
its gradients summed leaf by leaf (one call per leaf, as loops written for
lax.psum often do; XLA merges lax's) and as one pytree (one call, in buckets);
the pytree's row times ``concat`` too: the same psum with each bucket's leaves
concatenated into one vector first (``JAX_BLINK_SEGMENTED=0``) instead of
passed as separate operands.

    python benchmarks/bench_host_transport.py
    python benchmarks/bench_host_transport.py --layouts 2x1 --sizes 1e6 --json out.json

Results: benchmarks/results/host_transport_<machine>.json, with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _jobs  # noqa: E402
import _machine  # noqa: E402


def child(sizes, reps, step_layers):
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

    def timed(fns, args, count):
        for f in fns.values():  # warm: gloo sets up its contexts in the first calls
            for _ in range(3):
                jax.block_until_ready(f(*args))
        times = {k: [] for k in fns}
        names = list(fns)
        for i in range(count):
            for k in (names if i % 2 == 0 else names[::-1]):
                t0 = time.perf_counter()
                jax.block_until_ready(fns[k](*args))
                times[k].append(time.perf_counter() - t0)
        return {k: float(np.median(v)) for k, v in times.items()}

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
                     **{f"{k}_ms": 1e3 * v for k, v in med.items()}, "blink_alone_ms": 1e3 * alone,
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
        wrong = {k: sum(int((np.abs(np.asarray(a.addressable_shards[0].data)
                                    - np.asarray(b.addressable_shards[0].data)) > 1e-5).sum())
                        for a, b in zip(jax.tree.leaves(v), ref))
                 for k, v in finals.items() if k not in ("lax", "none")}
        med = timed(steps, (rep, xb), max(5, reps))
        alone = timed({"blink": steps["blink"]}, (rep, xb), max(5, reps))["blink"]
        how = "per-leaf psum" if per_leaf else "one psum of the pytree"
        rows.append({"what": f"step ({step_layers} x {width}x{width} MLP, {how})",
                     "size": sum(w.size + b.size for w, b in params), "reps": max(5, reps),
                     "wrong": wrong, **{f"{k}_ms": 1e3 * v for k, v in med.items()},
                     "blink_alone_ms": 1e3 * alone})
    if pid == 0:
        from jax_blink.choice import predict_cpu

        profile = predict_cpu.cpu_allreduce(4, jax.process_count(), jax.local_device_count()).source
        print("RESULT " + json.dumps({"processes": jax.process_count(),
                                      "devices_per_process": jax.local_device_count(),
                                      "profile": profile, "rows": rows}), flush=True)
    if jax.process_count() > 1:
        jax.distributed.shutdown()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", nargs="+", default=["2x1", "4x1", "2x4", "1x8"],
                    help="processes x devices per process (1xN: the in-process reference)")
    ap.add_argument("--sizes", nargs="+", type=float, default=[1, 1e2, 1e3, 1e4, 1e5, 1e6, 4e6],
                    help="float32 elements per device")
    ap.add_argument("--reps", type=int, default=50, help="timed calls per size (at most)")
    ap.add_argument("--layers", type=int, default=8, help="MLP layers of the step rows")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes]
    if os.environ.get("JAX_BLINK_COORDINATOR") or os.environ.get("JAX_BLINK_BENCH_CHILD"):
        child(sizes, args.reps, args.layers)
        return 0
    from jax_blink.launch import run_local

    command = [sys.executable, os.path.abspath(__file__), "--sizes", *map(str, sizes),
               "--reps", str(args.reps), "--layers", str(args.layers)]
    results = []
    for layout in args.layouts:
        p, d = (int(v) for v in layout.split("x"))
        if p == 1:  # one process: no job to join
            import subprocess
            env = dict(os.environ, JAX_BLINK_BENCH_CHILD="1",
                       XLA_FLAGS=f"--xla_force_host_platform_device_count={d}")
            proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
            outs = [(proc.returncode == 0, proc.stdout, proc.stderr)]
        else:
            rs = run_local(command, p, devices_per_process=d, timeout_s=1800)
            outs = [(r.ok, r.stdout, r.stderr) for r in rs]
        res = _jobs.result(outs)
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": _machine.machine(), "command": "python benchmarks/bench_host_transport.py "
                       + " ".join(argv if argv is not None else sys.argv[1:]),
                       "results": results}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
