"""jax_blink's collectives against lax's on 8 virtual CPU devices, per call, and the CPU
executor alone.

* ``psum``: ``jax_blink.psum`` (forced onto the plan, and as psum chooses) against
  ``lax.psum``, and what each adds to a program without it: the data of the CPU cost model
  (``planning.cost.CPU_ALLREDUCE_US``);
* ``collectives``: every other jax_blink collective against its lax equivalent;
* ``executor``: the C++ CPU executor running psum's schedule without jax, against a
  numpy copy of the same bytes.

``psum`` and ``collectives`` time each call alone, a sync after it, the programs compared
taking turns (``harness.interleaved``): the medians are one call's latency, not a burst's
throughput. Run on an otherwise idle machine. Each writes ``benchmarks/results/<name>_<machine>``
(``psum_cpu.json``, ``collectives_cpu.{json,md}``, ``executor_cpu.json``), ``<machine>``
being this machine's tag (``harness.machine_tag``) unless ``--machine`` names another;
``--out`` (and ``--md``) write elsewhere. Run from the repository root:

    python benchmarks/bench_cpu.py psum [--sizes 1,1e2,...] [--rounds 41] [--out FILE]
    python benchmarks/bench_cpu.py collectives [--sizes 1e2,1e3,...] [--ops psum_scatter,...] [--rounds 41]
        [--out FILE.json] [--md FILE.md]
    python benchmarks/bench_cpu.py executor [--sizes 1e4,1e5,1e6,1e7] [--ranks 8] [--dtype float32]
        [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import numpy as np

import harness


def counts(text: str) -> list:
    """Element counts from ``1,1e2,...``."""
    return [int(float(s)) for s in text.split(",")]


def default_out(args, stem: str, ext: str) -> str:
    return str(harness.RESULTS / f"{stem}_{args.machine or harness.machine_tag()}.{ext}")


# --- psum --------------------------------------------------------------------------------

def psum(args) -> int:
    """jax_blink.psum against lax.psum on 8 virtual CPU devices, per call: the CPU model's data.

    For each per-device size (float32 elements) four jitted programs run, interleaved, one
    call at a time with a sync after each, measured by
    :func:`jax_blink.measure.calibration.measure_allreduce` (the function
    ``python -m jax_blink calibrate`` measures a machine's profile with):

    * ``none``:  ``x * 2``, the program without a collective;
    * ``blink``: ``jax_blink.psum(x * 2)`` forced onto the plan (``JAX_BLINK_ALGO=blink``);
    * ``lax``:   ``lax.psum(x * 2)``;
    * ``auto``:  ``jax_blink.psum(x * 2)`` as users call it: the plan or lax, as psum's
      choice takes it from this machine's profile (``calibrate``), else from the recorded
      costs.

    (The collective's input is a value the program computes, as a gradient is, not a
    parameter: XLA would copy a parameter before jax_blink's in-place allreduce.) The medians
    are reported per call, and the collectives' own cost as the median of each round's
    difference with ``none`` (``*_added_us``): what adding the collective costs a program.
    ``planning.cost.CPU_ALLREDUCE_US`` (the recorded costs psum uses without a profile) is
    that added cost, copied from this benchmark's recorded results, which a test replays
    (tests/test_cost_model.py). ``#wrong`` counts elements outside the summation-order bound
    (jax_blink.numerics).

    Writes ``psum_cpu_<machine>.json``."""
    harness.cpu_devices()
    import jax

    import jax_blink
    from jax_blink.choice import predict_cpu
    from jax_blink.measure.calibration import measure_allreduce

    out = args.out or default_out(args, "psum_cpu", "json")
    n = jax.device_count()
    info = harness.machine(jax=jax.__version__, devices=f"{n} x {jax.devices()[0].platform}")
    source = predict_cpu.cpu_allreduce(4, devices=n).source
    print(f"# {info}\n# auto: psum's choice from {source}")
    print(f"{'count':>10} {'none_us':>9} {'blink_us':>9} {'lax_us':>9} {'auto_us':>9} {'blink_added':>11} "
          f"{'lax_added':>9} {'added ratio':>11} {'auto/lax':>8} {'#wrong':>6}")
    rows = []
    for size in counts(args.sizes):  # one at a time, to print as it goes
        row = measure_allreduce([size], args.rounds, ("none", "blink", "lax", "auto"))[0]
        row.update(ratio_blink_over_lax=row["blink_us"] / row["lax_us"],
                   added_ratio_blink_over_lax=row["blink_added_us"] / row["lax_added_us"],
                   ratio_auto_over_lax=row["auto_us"] / row["lax_us"],
                   decision=jax_blink.explain(jax.ShapeDtypeStruct((size,), np.float32), n))
        rows.append(row)
        print(f"{size:>10} {row['none_us']:>9.1f} {row['blink_us']:>9.1f} {row['lax_us']:>9.1f} "
              f"{row['auto_us']:>9.1f} {row['blink_added_us']:>11.1f} {row['lax_added_us']:>9.1f} "
              f"{row['added_ratio_blink_over_lax']:>11.2f} {row['ratio_auto_over_lax']:>8.2f} {row['wrong']:>6}")
    with open(out, "w") as f:
        json.dump({"machine": info, "commit": harness.RUN_COMMIT, "rounds": args.rounds, "profile": source,
                   "method": "per call, a sync after each, programs interleaved; *_added_us: "
                             "the median over rounds of the program's time minus the same "
                             "program's without the collective in that round; blink forced onto "
                             "the plan, auto as psum chooses",
                   "rows": rows}, f, indent=1)
    print(f"wrote {out}", file=sys.stderr)
    return 0


# --- collectives -------------------------------------------------------------------------

ROOT_RANK = 0  # broadcast's


def collective_ops(n):
    """name -> (jax_blink fn, lax fn, expected(x rows) -> per-device rows, bus factor)."""
    import jax.numpy as jnp
    from jax import lax

    import jax_blink

    return {
        "psum_scatter": (
            lambda v: jax_blink.psum_scatter(v, "x", tiled=True),
            lambda v: lax.psum_scatter(v, "x", tiled=True),
            lambda x: x.sum(0).reshape(n, -1), (n - 1) / n),
        "all_gather": (
            lambda v: jax_blink.all_gather(v, "x", tiled=True),
            lambda v: lax.all_gather(v, "x", tiled=True),
            lambda x: np.broadcast_to(x.reshape(-1), (n, x.size)), (n - 1) / n),
        "pmax": (
            lambda v: jax_blink.pmax(v, "x"), lambda v: lax.pmax(v, "x"),
            lambda x: np.broadcast_to(x.max(0), x.shape), 2 * (n - 1) / n),
        "pmin": (
            lambda v: jax_blink.pmin(v, "x"), lambda v: lax.pmin(v, "x"),
            lambda x: np.broadcast_to(x.min(0), x.shape), 2 * (n - 1) / n),
        "broadcast": (
            lambda v: jax_blink.broadcast(v, "x", root=ROOT_RANK),
            lambda v: lax.psum(jnp.where(lax.axis_index("x") == ROOT_RANK, v, 0), "x"),
            lambda x: np.broadcast_to(x[ROOT_RANK], x.shape), 1.0),
    }


def collectives(args) -> int:
    """Every jax_blink collective against its lax equivalent on 8 virtual CPU devices.

    For each collective and per-device size (float32 elements), times jax_blink's op and the
    lax op in the same process after compilation, one call at a time with a sync after
    each, the two taking turns (the median per-call latency, not a burst's throughput), and
    reports the ratio blink/lax, nccl-tests' bus bandwidth of the jax_blink run and the
    number of wrong elements (inputs are small integers, so every correct result is exact:
    compared for equality, with the expected result and with lax's).

    The lax equivalents: psum_scatter -> lax.psum_scatter(tiled=True), all_gather ->
    lax.all_gather(tiled=True), pmax/pmin -> lax.pmax/lax.pmin, broadcast -> lax.psum of the
    root's value (lax has no broadcast). Sizes are elements of one device's input
    (psum_scatter: the whole vector; all_gather: one shard).

    Writes ``collectives_cpu_<machine>.json`` and ``.md`` (the tables docs/performance.md
    quotes)."""
    harness.cpu_devices()
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_blink

    out = args.out or default_out(args, "collectives_cpu", "json")
    md = args.md or default_out(args, "collectives_cpu", "md")
    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("x",))
    info = harness.machine(jax=jax.__version__, devices=f"{n} x {jax.devices()[0].platform}")
    print(f"# {info}")
    table = collective_ops(n)

    def shard(fn):
        return jax.jit(jax.shard_map(lambda v: fn(v[0])[None], mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                     check_vma=False))

    results = {}
    for name in args.ops.split(","):
        blink_fn, lax_fn, expected_fn, bus = table[name]
        print(f"\n## {name}\n{'count':>10} {'lax_us':>10} {'blink_us':>10} {'ratio':>6} "
              f"{'busbw':>7} {'#wrong':>6}")
        rows = []
        for size in counts(args.sizes):
            size -= size % n  # psum_scatter splits the vector into n shards
            x = np.random.default_rng(size).integers(-8, 8, (n, size)).astype(np.float32)
            xs = jax.device_put(x, NamedSharding(mesh, P("x")))
            f_blink, f_lax = shard(blink_fn), shard(lax_fn)
            got = np.asarray(f_blink(xs))  # compiled and run once each before the timing
            wrong = int(np.sum(got != expected_fn(x))) + int(np.sum(np.asarray(f_lax(xs)) != got))
            times = harness.interleaved({"lax": lambda: jax.block_until_ready(f_lax(xs)),
                                         "blink": lambda: jax.block_until_ready(f_blink(xs))},
                                        args.rounds if size < 10**7 else max(5, args.rounds // 4))
            tl, tb = float(np.median(times["lax"])), float(np.median(times["blink"]))
            nbytes = size * 4 * (n if name == "all_gather" else 1)  # nccl-tests: the whole vector
            busbw = nbytes / tb / 1e9 * bus
            rows.append({"count": size, "lax_us": tl * 1e6, "blink_us": tb * 1e6,
                         "ratio_blink_over_lax": tb / tl, "busbw_gbps": busbw, "wrong": wrong,
                         "decision": jax_blink.explain(jax.ShapeDtypeStruct((size,), np.float32), n, op=name)})
            print(f"{size:>10} {tl*1e6:>10.1f} {tb*1e6:>10.1f} {tb/tl:>6.2f} {busbw:>7.2f} {wrong:>6}")
        results[name] = rows
    commit = harness.RUN_COMMIT
    with open(out, "w") as f:
        json.dump({"machine": info, "commit": commit, "method": "per call, a sync after each, "
                   "jax_blink and lax alternating; median", "results": results}, f, indent=1)
    with open(md, "w") as f:
        f.write(f"Machine: {info['cpu']}, {info['cores']} cores, jax {info['jax']}, "
                f"{info['devices']}; commit {commit}; `python benchmarks/bench_cpu.py collectives`.\n")
        for name, rows in results.items():
            f.write(f"\n**{name}** (float32; per call, median of {args.rounds} calls each, "
                    f"alternating)\n\n| elements per device | lax (us) | "
                    f"jax_blink (us) | blink / lax | wrong |\n|---|---|---|---|---|\n")
            for r in rows:
                f.write(f"| {r['count']:.0e} | {r['lax_us']:.1f} | {r['blink_us']:.1f} | "
                        f"{r['ratio_blink_over_lax']:.2f} | {r['wrong']} |\n")
    print(f"wrote {out} and {md}", file=sys.stderr)
    return 0


# --- executor ----------------------------------------------------------------------------

def numpy_copy_seconds(nbytes, rounds):
    """Median seconds of a single-thread numpy copy of ``nbytes``, for scale."""
    a = np.ones(nbytes // 4, np.float32)
    b = np.empty_like(a)
    reps = max(3, int(2e8 // max(nbytes, 1)))
    best = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            np.copyto(b, a)
        best.append((time.perf_counter() - t) / reps)
    return float(np.median(best))


def executor(args) -> int:
    """The C++ CPU executor alone (no jax dispatch), against a plain numpy copy.

    Runs the shm:N allreduce schedule that jax_blink.psum uses on N CPU devices through
    ``_blink_testing.run_ranks`` (one thread per rank, ``repeat`` calls on the same threads,
    as a call site inside ``lax.scan``), and reports per call: time, algbw (S/t,
    nccl-tests), the memory traffic the executor must move at least (every rank reads its
    input and writes its output: 2·N·S bytes) as GB/s, and a single-thread numpy copy of the
    same per-rank bytes for scale; ``wrong``: elements of any rank outside the
    summation-order bound (jax_blink.numerics).

    Timings are medians over rounds; on a shared machine they are only as good as the
    machine is idle (the user/sys CPU time columns are less sensitive to other load).

    Writes ``executor_cpu_<machine>.json``."""
    from jax_blink import _ffi
    from jax_blink.planning import plan
    from jax_blink.topo import Topology

    out = args.out or default_out(args, "executor_cpu", "json")
    testing = _ffi.load_testing()
    n = args.ranks
    p = plan(Topology.preset(f"shm:{n}"), "allreduce")
    itemsize = np.dtype(args.dtype).itemsize
    rows = []
    print(f"# executor alone: {n} ranks, {args.dtype}, {os.cpu_count()} cores, {harness.cpu_model()}")
    print(f"{'size(B)':>12} {'count':>10} {'us':>10} {'algbw':>7} {'min_traffic_GB/s':>17} "
          f"{'np_copy_GB/s':>13} {'user_us':>8} {'sys_us':>7}")
    for count in counts(args.sizes):
        schedule = p.lower(count * itemsize, args.dtype)
        enc = np.asarray(schedule.encode())
        rng = np.random.default_rng(0)
        ins = [rng.standard_normal(count).astype(args.dtype) for _ in range(n)]
        outs = [np.empty_like(x) for x in ins]
        reps = max(3, int(3e8 // (count * itemsize * n)))
        assert testing.run_ranks(enc, ins, outs, 60000, repeat=2) == [None] * n
        walls, users, syss = [], [], []
        for _ in range(args.rounds):  # CPU time as well as wall time: not harness.interleaved
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t = time.perf_counter()
            errors = testing.run_ranks(enc, ins, outs, 60000, repeat=reps)
            walls.append((time.perf_counter() - t) / reps)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            users.append((r1.ru_utime - r0.ru_utime) / reps)
            syss.append((r1.ru_stime - r0.ru_stime) / reps)
            assert errors == [None] * n, errors
        t = float(np.median(walls))
        size = count * itemsize
        row = dict(size_bytes=size, count=count, time_us=t * 1e6, algbw_gbps=size / t / 1e9,
                   min_traffic_gbps=2 * n * size / t / 1e9,
                   numpy_copy_gbps=2 * size / numpy_copy_seconds(size, 3) / 1e9,
                   user_us=float(np.median(users)) * 1e6, sys_us=float(np.median(syss)) * 1e6,
                   wrong=harness.wrong_elements(np.stack(outs), np.stack(ins)),
                   chunks=len(schedule.chunks), steps=schedule.num_steps)
        rows.append(row)
        print(f"{size:>12} {count:>10} {row['time_us']:>10.1f} {row['algbw_gbps']:>7.2f} "
              f"{row['min_traffic_gbps']:>17.2f} {row['numpy_copy_gbps']:>13.2f} "
              f"{row['user_us']:>8.0f} {row['sys_us']:>7.0f}")
    with open(out, "w") as f:
        json.dump(dict(machine=harness.machine(), ranks=n, dtype=args.dtype, rows=rows), f, indent=1)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def command(run, help, sizes, rounds, rounds_help):
        p = sub.add_parser(run.__name__, help=help, description=run.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--sizes", default=sizes, help="elements per device, comma-separated")
        p.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
        p.add_argument("--machine", default=None, help="name in the results files (default: this machine's tag)")
        p.add_argument("--out", default=None, help="write the results JSON here instead")
        p.set_defaults(run=run)
        return p

    command(psum, "jax_blink.psum against lax.psum, per call and added to a program",
            "1,1e2,1e3,1e4,1e5,1e6,1e7", 41, "interleaved calls per program (median)")
    p = command(collectives, "every other collective against its lax equivalent",
                "1e2,1e3,1e4,1e5,1e6,1e7", 41, "calls of each op per size (median)")
    p.add_argument("--ops", default="psum_scatter,all_gather,pmax,pmin,broadcast")
    p.add_argument("--md", default=None, help="write the markdown tables here instead")
    p = command(executor, "the CPU executor alone, against a numpy copy", "1e4,1e5,1e6,1e7", 5,
                "timed rounds per size (median)")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
