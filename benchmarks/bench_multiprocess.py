"""jax_blink's collectives against lax's over devices of several processes.

Launches local jax.distributed jobs (jax_blink.launch.run_local: 127.0.0.1,
gloo) of P processes x L CPU devices, over a mesh ("host", "local"), with
``JAX_BLINK_HOST_TRANSPORT=0`` (so that one machine's processes take the path
of processes on different hosts; with the default, they share memory:
benchmarks/bench_host_transport.py), and times
``jax_blink.psum(x, ("host", "local"))`` (the hierarchical path: Blink
reduce-scatter in each process, gloo allreduce of the shards across
processes, Blink all-gather) against ``lax.psum`` on the same inputs, the two
alternating, per float32 size per device; likewise ``psum_scatter`` (tiled),
``all_gather`` (tiled) and ``broadcast`` from the last device (against lax's
equivalent, the psum of the root's value) with ``--ops``. Counts elements
outside the summation-order bound of lax's result (all_gather and
broadcast: any difference).

    python benchmarks/bench_multiprocess.py                 # 2x4 and 4x2, all four ops
    python benchmarks/bench_multiprocess.py --layouts 2x4 --sizes 1e3 1e5 --ops psum
    python benchmarks/bench_multiprocess.py --json out.json

Records the machine with the results (benchmarks/results/multiprocess_cpu.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _jobs  # noqa: E402
import time

COLLECTIVE = {"psum_scatter": "reduce_scatter", "all_gather": "allgather"}  # psum, broadcast: always hierarchical


def child(sizes, reps, ops):
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
    rows = []
    for op in ops:
        ours, ref = pairs[op]
        for size in sizes:
            size -= size % (nproc * local)  # psum_scatter's tiled split
            rng = np.random.default_rng(size)
            x = rng.standard_normal((nproc, local, size)).astype(np.float32)
            xs = jax.make_array_from_callback(x.shape, NamedSharding(mesh, P("host", "local")),
                                              lambda i: x[i])
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
            if op in ("all_gather", "broadcast"):
                wrong = sum(int((a != b).sum()) for a, b in zip(outs["blink"], outs["lax"]))
            else:  # per element, within both summation orders' bounds around lax's sum: the
                # magnitude is lax's same reduction of |x| (jax_blink.numerics)
                absx = jax.make_array_from_callback(x.shape, NamedSharding(mesh, P("host", "local")),
                                                    lambda i: np.abs(x[i]))
                mag = [np.asarray(s.data) for s in fns["lax"](absx).addressable_shards]
                wrong = sum(numerics.wrong_vs_reference(a, b, m, nproc * local)
                            for a, b, m in zip(outs["blink"], outs["lax"], mag))
            n = max(3, min(reps, int(2e8 // (size * 4 * local))))
            times = {"blink": [], "lax": []}
            for i in range(n):
                for k in (("blink", "lax") if i % 2 == 0 else ("lax", "blink")):
                    t0 = time.perf_counter()
                    jax.block_until_ready(fns[k](xs))
                    times[k].append(time.perf_counter() - t0)
            med = {k: float(np.median(v)) for k, v in times.items()}
            # what jax_blink ran: the library's own choice for this op and size
            choice = across(op, axes, "lax", COLLECTIVE.get(op, "allreduce"), {"float32": size}, nproc,
                            local).chosen
            rows.append({"op": op, "size": size, "bytes_per_device": size * 4, "reps": n,
                         "runs": "lax" if choice == "lax" else "hierarchical",
                         "blink_ms": 1e3 * med["blink"], "lax_ms": 1e3 * med["lax"],
                         "ratio": med["blink"] / med["lax"], "wrong": wrong})
    if pid == 0:
        print("RESULT " + json.dumps({"processes": nproc, "devices_per_process": local,
                                      "rows": rows}), flush=True)
    jax.distributed.shutdown()


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", nargs="+", default=["2x4", "4x2"],
                    help="processes x devices per process")
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e3, 1e4, 1e5, 1e6, 1e7],
                    help="float32 elements per device")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per op and size (at most)")
    ap.add_argument("--ops", nargs="+", default=["psum", "psum_scatter", "all_gather", "broadcast"],
                    choices=["psum", "psum_scatter", "all_gather", "broadcast"])
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes]
    if os.environ.get("JAX_BLINK_COORDINATOR"):
        child(sizes, args.reps, args.ops)
        return 0
    from jax_blink.launch import run_local

    results = []
    for layout in args.layouts:
        p, d = (int(v) for v in layout.split("x"))
        rs = run_local([sys.executable, os.path.abspath(__file__), "--sizes",
                        *map(str, sizes), "--reps", str(args.reps), "--ops", *args.ops], p,
                       devices_per_process=d, timeout_s=1800,
                       env=dict(os.environ, JAX_BLINK_HOST_TRANSPORT="0"))
        res = _jobs.result([(r.ok, r.stdout, r.stderr) for r in rs])
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
    machine = {"machine": _cpu_model(), "cpu_cores": os.cpu_count(),
               "python": platform.python_version()}
    try:
        import jax
        machine["jax"] = jax.__version__
    except ImportError:
        pass
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "results": results}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
