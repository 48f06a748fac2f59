"""A late rank on 8 CPU devices and across processes: early start against the barrier, and the plans.

One rank (``--late``, default 3) arrives late by 1, 5 or 20 ms (and 0, to show what each
arm costs when nobody is late); the others are there at once. Four arms of the ``shm:8``
allreduce run, interleaved call by call:

* ``plain``:   the plan psum uses without ``slow_ranks`` (every rank roots a star of
  an eighth of the vector and is a child in the seven others), the executor starting
  early (its default: a rank runs each step once the peers it touches are there);
* ``barrier``: the same schedule, every rank waiting for all before any data moves
  (``JAX_BLINK_BARRIER=1``, configure(barrier=True): the executor before early start);
* ``ordered``: the same trees, but every parent reduces the late rank after its other
  children (``plan(slow_ranks=...)`` where leaves cost more rate than it allows);
* ``leaves``:  trees in which the late rank is a leaf (``plan(slow_ranks=...,
  tolerance=0.1)``: seven stars at 13/14 of the optimum rate), reduced last too.

``psum`` names the one ``psum(slow_ranks=...)`` runs on this machine.

**The collective alone** runs through the CPU executor with one thread per rank (the
``run_ranks`` harness of the test module, the executor XLA's CPU devices run): the late
rank's thread sleeps before each call (test scaffolding, never the production path), and
the harness records when each rank's call began and returned. *After arrival* is the
last return minus the late rank's start. ``after_arrival_early_over_barrier`` is
plain's over barrier's; ``--punctual`` times the two with nobody late from 1 to 1e7
floats per device.

**Across processes** (``--processes``): jobs of 4 x 1 and 2 x 1 processes
(jax_blink.launch.run_local) sum a float32 vector per device with a jitted
``jax_blink.psum`` over the host transport. Each call follows a gloo ``lax.psum`` that
every process makes after switching the mode (so that all ranks of a call run the same);
the last process then sleeps before its call, and its call's duration is *after
arrival* (its return is the call's end: no rank returns before all are done).

**A training step** (``--step``): a jitted data-parallel step of an MLP on 8 CPU devices
whose gradients are summed by ``jax_blink.psum`` with and without ``slow_ranks``, on the
plan (``JAX_BLINK_ALGO=blink``), and by ``lax.psum``; one device's host callback sleeps before the loss (test scaffolding in the
program). Its *after arrival* is the step time minus the delay; the step without the
sleep is reported as well. ``--topologies`` compares the plans where trees are deeper than
a star (a ring, a chain and a DGX-1 V100 over 8 CPU devices), all early. ``--mlps`` times the training steps of
``benchmarks/bench_steps.py`` (its MLPs, the 4 x 2048² among them, with psum's default
buckets) early against barrier, and with no communication and lax.psum.

Writes ``benchmarks/results/stragglers_<machine>.{json,md}`` (``--machine``: another name,
``--results``: another folder).

    python benchmarks/bench_stragglers.py [--sizes 1e5 1e6 4e6] [--delays 0 1 5 20] [--rounds 15]
        [--punctual] [--topologies] [--processes] [--step] [--mlps]
"""

from __future__ import annotations

import os

import harness

harness.cpu_devices(8)  # before jax is imported
os.environ.setdefault("JAX_BLINK_ALGO", "blink")  # the step's psum on the plan, not lax, at every size

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


N = 8
TIMEOUT_MS = 60000
#: The rate the ``leaves`` plan may give up (``plan``'s ``tolerance``): shm:8's leaf stars reach 13/14.
LEAF_TOLERANCE = 0.1
#: The arms that run the plain plan: early start (the executor's default) and the barrier.
MODES = {"plain": False, "barrier": True}


def set_barrier(on: bool) -> None:
    """The executor's mode for the calls that follow (none may be running)."""
    from jax_blink import _ffi

    ext = _ffi.load_extension()
    ext.configure(**dict(ext.configuration(), barrier=on))


def schedules(count: int, late: int) -> dict:
    """The arms' lowerings of the shm:8 allreduce of ``count`` float32, and which psum runs."""
    from jax_blink import Topology
    from jax_blink.choice.requests import SLOW_TOLERANCE
    from jax_blink.planning import plan

    topology = Topology.preset(f"shm:{N}")
    size = count * 4
    plain = plan(topology)
    ordered = plan(topology, slow_ranks=[late])
    leaves = plan(topology, slow_ranks=[late], tolerance=LEAF_TOLERANCE)
    if leaves.family != "tree":
        raise SystemExit(f"no leaf plan within tolerance {LEAF_TOLERANCE}: {leaves.note}")
    runs = plan(topology, slow_ranks=[late], tolerance=SLOW_TOLERANCE)  # what psum(slow_ranks=) plans
    picked = "leaves" if runs.trees == leaves.trees else "ordered"
    return {name: p.lower(size, "float32") for name, p in
            (("plain", plain), ("barrier", plain), ("ordered", ordered), ("leaves", leaves))}, picked


def time_collective(schedule, count: int, late: int, delay_ms: float, calls: int) -> list:
    """Per call, ``(after arrival, whole call)`` in ms: the last rank's return minus the late
    rank's start, and minus the first rank's start; the sum is checked."""
    from jax_blink import _ffi

    harness = _ffi.load_testing()
    rng = np.random.default_rng(count + late)
    inputs = [rng.integers(-8, 9, count).astype(np.float32) for _ in range(N)]
    outputs = [np.zeros(count, np.float32) for _ in range(N)]
    times = np.zeros((N, calls, 2), np.int64)
    delays = [0.0] * N
    delays[late] = delay_ms
    errors = harness.run_ranks(schedule.encode(), inputs, outputs, TIMEOUT_MS, repeat=calls,
                               delays_ms=delays, times_ns=times)
    if any(errors):
        raise SystemExit(f"run_ranks failed: {errors}")
    want = np.sum(inputs, axis=0)  # small integers: every order sums exactly
    wrong = [r for r, out in enumerate(outputs) if not np.array_equal(out, want)]
    if wrong:
        raise SystemExit(f"wrong sums on ranks {wrong}")
    end = times[:, :, 1].max(axis=0)
    return [((end[k] - times[late, k, 0]) / 1e6, (end[k] - times[:, k, 0].min()) / 1e6) for k in range(calls)]


def early_over_barrier(early: list, barrier: list) -> dict:
    """The median ratio of paired samples (early's over barrier's, interleaved) and whether
    their difference lies beyond its spread (harness.paired_spread)."""
    diffs = np.asarray(early) - np.asarray(barrier)
    return {"ratio": statistics.median(early) / statistics.median(barrier),
            "beyond_spread": bool(abs(float(np.median(diffs))) > harness.paired_spread(diffs))}


def collective_rows(sizes, delays, late, rounds, calls, arms=("plain", "barrier", "ordered", "leaves")) -> tuple:
    from jax_blink import _ffi

    _ffi.configure_cpu()  # the JAX_BLINK_* executor settings, as a jitted psum gets them
    rows = []
    picked = None
    try:
        for count in sizes:
            lowered, picked = schedules(count, late)
            for delay in delays:
                got = {name: [] for name in arms}
                for k in range(rounds):  # interleaved: each round runs every arm once
                    for name in (arms if k % 2 == 0 else arms[::-1]):
                        set_barrier(name == "barrier")
                        got[name] += time_collective(lowered[name], count, late, delay, calls)
                row = {"count": count, "delay_ms": delay}
                for name, samples in got.items():
                    row[f"{name}_after_ms"] = statistics.median(a for a, _ in samples)
                    row[f"{name}_call_ms"] = statistics.median(c for _, c in samples)
                vs = early_over_barrier([a for a, _ in got["plain"]], [a for a, _ in got["barrier"]])
                row["after_arrival_early_over_barrier"] = vs["ratio"]
                row["after_arrival_beyond_spread"] = vs["beyond_spread"]
                vs = early_over_barrier([c for _, c in got["plain"]], [c for _, c in got["barrier"]])
                row["call_early_over_barrier"] = vs["ratio"]
                row["call_beyond_spread"] = vs["beyond_spread"]
                for name in ("ordered", "leaves"):
                    if name in got:
                        row[f"{name}_over_plain"] = row[f"{name}_after_ms"] / row["plain_after_ms"]
                if picked in got:
                    row["psum_over_plain"] = row[f"{picked}_after_ms"] / row["plain_after_ms"]
                rows.append(row)
                print(f"{count:>9} {delay:>6g} ms  after arrival: early {row['plain_after_ms']:7.3f}  barrier "
                      f"{row['barrier_after_ms']:7.3f} ms ({row['after_arrival_early_over_barrier']:.2f})"
                      + "".join(f"  {n} {row[f'{n}_after_ms']:7.3f}" for n in ("ordered", "leaves") if n in got)
                      + f"  whole call early/barrier {row['call_early_over_barrier']:.2f}", flush=True)
    finally:
        set_barrier(False)
    return rows, picked


def topology_rows(count: int, delays, late: int, rounds: int, calls: int) -> list:
    """Trees deeper than a star, all early: on a ring and a chain of 8 and a DGX-1 V100 (over
    CPU devices: the schedules' shapes, not those machines' links), the plain plan, the plan
    that reduces the late rank last (``plan(slow_ranks=...)`` at tolerance 0) and the one
    that makes it a leaf of every tree (tolerance 0.2, where one exists); the barrier's plain
    plan for reference."""
    from jax_blink import Topology
    from jax_blink.planning import plan

    topologies = [Topology(N, [(i, (i + 1) % N, 25.0) for i in range(N)], name=f"ring-{N}"),
                  Topology(N, [(i, i + 1, 25.0) for i in range(N - 1)], name=f"chain-{N}"),
                  Topology.preset("dgx1-v100")]
    rows = []
    try:
        for topology in topologies:
            plans = {"plain": plan(topology), "ordered": plan(topology, slow_ranks=[late], tolerance=0)}
            leaves = plan(topology, slow_ranks=[late], tolerance=0.2)
            if "are leaves of every tree" in (leaves.note or ""):
                plans["leaves"] = leaves
            lowered = {name: p.lower(count * 4, "float32") for name, p in plans.items()}
            lowered["barrier"] = lowered["plain"]
            arms = list(lowered)
            for delay in delays:
                got = {name: [] for name in arms}
                for k in range(rounds):
                    for name in (arms if k % 2 == 0 else arms[::-1]):
                        set_barrier(name == "barrier")
                        got[name] += [a for a, _ in time_collective(lowered[name], count, late, delay, calls)]
                row = {"topology": topology.name, "count": count, "delay_ms": delay, "trees": len(plans["plain"].trees),
                       **{f"{name}_after_ms": statistics.median(v) for name, v in got.items()}}
                for name in ("ordered", "leaves"):
                    if name in got:
                        vs = early_over_barrier(got[name], got["plain"])
                        row[f"{name}_over_plain"] = vs["ratio"]
                        row[f"{name}_beyond_spread"] = vs["beyond_spread"]
                vs = early_over_barrier(got["plain"], got["barrier"])
                row["after_arrival_early_over_barrier"] = vs["ratio"]
                row["after_arrival_beyond_spread"] = vs["beyond_spread"]
                rows.append(row)
                print(f"{topology.name:>10} {delay:>4g} ms: plain {row['plain_after_ms']:.3f}  barrier "
                      f"{row['barrier_after_ms']:.3f}  ordered {row['ordered_after_ms']:.3f} ms"
                      + (f"  leaves {row['leaves_after_ms']:.3f} ms ({row['leaves_over_plain']:.2f})"
                         if "leaves" in got else "  (no leaf trees)"), flush=True)
    finally:
        set_barrier(False)
    return rows


# --- across processes --------------------------------------------------------------------

def processes_worker(sizes, delays, rounds) -> None:
    """One process of a job: per size and delay, its calls' durations in each mode (the last
    process is the late one)."""
    from jax_blink.launch import initialize

    initialize()
    import jax
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_blink

    n, me = jax.device_count(), jax.process_index()
    late = jax.process_count() - 1
    mesh = jax.make_mesh((n,), ("i",))

    def placed(x):
        return jax.make_array_from_callback(x.shape, NamedSharding(mesh, P("i")), lambda i: x[i])

    def fn(reduce):
        return jax.jit(jax.shard_map(lambda v: reduce(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P()))

    sync, token = fn(lax.psum), placed(np.ones((n, 1), np.float32))
    rows = []
    for size in sizes:
        x = np.random.default_rng(size).integers(-8, 9, (n, size)).astype(np.float32)
        xs, f = placed(x), fn(jax_blink.psum)
        got = np.asarray(f(xs).addressable_shards[0].data)
        if not np.array_equal(got.reshape(-1), x.sum(axis=0)):  # small integers: exact in every order
            raise SystemExit(f"process {me}: wrong sum at {size} elements")
        for delay in delays:
            samples = {mode: [] for mode in MODES}
            for k in range(rounds + 2):  # the first two warm up
                for mode in (list(MODES) if k % 2 == 0 else list(MODES)[::-1]):
                    set_barrier(MODES[mode])
                    jax.block_until_ready(sync(token))  # every process has switched
                    if me == late and delay:
                        time.sleep(delay / 1e3)
                    start = time.perf_counter()
                    jax.block_until_ready(f(xs))
                    if k >= 2:
                        samples[mode].append(1e3 * (time.perf_counter() - start))
            rows.append({"count": size, "delay_ms": delay, **{f"{m}_ms": v for m, v in samples.items()}})
    set_barrier(False)
    harness.print_result({"process": me, "late": me == late, "rows": rows})
    jax.distributed.shutdown()


def processes_rows(layouts, sizes, delays, punctual_sizes, rounds) -> list:
    """After arrival (the late process's call) and punctual calls, early against barrier."""
    from jax_blink.launch import run_local

    out = []
    for procs in layouts:
        jobs = [(sizes, delays)] if procs == 4 else []
        jobs.append((punctual_sizes, [0.0]))
        for job_sizes, job_delays in jobs:
            argv = [sys.executable, str(Path(__file__).resolve()), "--worker", "--sizes",
                    *map(str, job_sizes), "--delays", *map(str, job_delays), "--rounds", str(rounds)]
            results = run_local(argv, procs, devices_per_process=1, timeout_s=3600,
                                env=dict(os.environ, JAX_BLINK_ALGO="blink"))
            if not all(r.ok for r in results):
                for i, r in enumerate(results):
                    print(f"--- process {i}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}", file=sys.stderr)
                raise SystemExit(f"the {procs} x 1 job failed")
            late = harness.read_result(results[-1].stdout)
            for row in late["rows"]:
                vs = early_over_barrier(row["plain_ms"], row["barrier_ms"])
                r = {"layout": f"{procs}x1", "count": row["count"], "delay_ms": row["delay_ms"],
                     "early_ms": statistics.median(row["plain_ms"]),
                     "barrier_ms": statistics.median(row["barrier_ms"]),
                     "early_over_barrier": vs["ratio"], "beyond_spread": vs["beyond_spread"]}
                if row["delay_ms"]:
                    r["after_arrival_early_over_barrier"] = vs["ratio"]
                out.append(r)
                print(f"{procs}x1 {row['count']:>9} {row['delay_ms']:>5g} ms late: early {r['early_ms']:8.3f}  "
                      f"barrier {r['barrier_ms']:8.3f} ms  ({vs['ratio']:.2f}"
                      f"{'' if vs['beyond_spread'] else ', within the spread'})", flush=True)
    return out


# --- training steps ----------------------------------------------------------------------

def step_rows(delays, late, rounds, width, depth, batch) -> list:
    """Step times of an MLP's data-parallel step, gradients summed three ways, one device late."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_blink

    mesh = jax.make_mesh((N,), ("i",))
    rng = np.random.default_rng(0)
    params = [(rng.standard_normal((width, width)).astype(np.float32) / np.sqrt(width),
               np.zeros(width, np.float32)) for _ in range(depth)]
    x = jax.device_put(rng.standard_normal((N * batch, width)).astype(np.float32), NamedSharding(mesh, P("i")))
    y = jax.device_put(rng.standard_normal((N * batch, width)).astype(np.float32), NamedSharding(mesh, P("i")))

    def make(reduce, delay_ms):
        def sleep_on_late(v, rank):
            if int(rank) == late and delay_ms:
                time.sleep(delay_ms / 1e3)
            return v

        def loss(ps, xb, yb):
            h = xb
            for w, b in ps:
                h = jnp.tanh(h @ w + b)
            return jnp.mean((h - yb) ** 2)

        def body(ps, xb, yb):
            xb = jax.pure_callback(sleep_on_late, jax.ShapeDtypeStruct(xb.shape, xb.dtype), xb,
                                   lax.axis_index("i"))
            grads = jax.grad(loss)(ps, xb, yb)
            grads = reduce(grads)
            return jax.tree.map(lambda p, g: p - 0.01 * g / N, ps, grads)

        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P("i"), P("i")), out_specs=P(),
                                     check_vma=False))

    ways = {"lax": lambda g: lax.psum(g, "i"),
            "plain": lambda g: jax_blink.psum(g, "i"),
            "slow_ranks": lambda g: jax_blink.psum(g, "i", slow_ranks=[late])}
    rows = []
    for delay in delays:
        steps = {name: make(way, delay) for name, way in ways.items()}
        for f in steps.values():
            jax.block_until_ready(f(params, x, y))  # compile
        got = harness.interleaved({name: (lambda f=f: jax.block_until_ready(f(params, x, y)))
                                   for name, f in steps.items()}, rounds)
        row = {"delay_ms": delay}
        for name, samples in got.items():
            row[f"{name}_step_ms"] = 1e3 * float(np.median(samples))
            row[f"{name}_after_ms"] = row[f"{name}_step_ms"] - delay
        row["slow_ranks_over_plain_after"] = row["slow_ranks_after_ms"] / row["plain_after_ms"]
        row["slow_ranks_over_lax_step"] = row["slow_ranks_step_ms"] / row["lax_step_ms"]
        rows.append(row)
        print(f"step, {delay:>4g} ms late: lax {row['lax_step_ms']:.2f}  plain {row['plain_step_ms']:.2f}  "
              f"slow_ranks {row['slow_ranks_step_ms']:.2f} ms  (after arrival: slow_ranks/plain "
              f"{row['slow_ranks_over_plain_after']:.2f})", flush=True)
    return rows


def mlp_rows(rounds: int, reps: int = 3) -> list:
    """bench_steps.py's MLP training steps, gradients summed by jax_blink.psum (its default
    buckets) early and at the barrier, by lax.psum and by nothing, interleaved."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from bench_steps import MLPS
    from jax_blink.measure.timing import mlp_step

    mesh = jax.make_mesh((N,), ("data",))
    rows = []
    try:
        for depth, width in MLPS:
            x = jax.device_put(np.random.default_rng(1).normal(size=(N * 64, width)).astype(np.float32),
                               NamedSharding(mesh, P("data")))
            steps = {}
            for variant in ("none", "lax.psum", "jax_blink"):
                steps[variant], params = mlp_step(mesh, depth, width, variant)
                jax.block_until_ready(steps[variant](params, x))  # compiles

            def call(variant, barrier=False):
                def run():
                    set_barrier(barrier)
                    for _ in range(reps):
                        jax.block_until_ready(steps[variant](params, x))
                return run

            times = harness.interleaved({"none": call("none"), "lax": call("lax.psum"),
                                         "early": call("jax_blink"), "barrier": call("jax_blink", True)},
                                        rounds)
            med = {k: 1e3 * statistics.median(v) / reps for k, v in times.items()}
            vs = early_over_barrier(times["early"], times["barrier"])
            row = {"model": f"{depth}x{width}", **{f"{k}_ms": v for k, v in med.items()},
                   "early_over_barrier": vs["ratio"], "beyond_spread": vs["beyond_spread"],
                   "early_over_none": med["early"] / med["none"], "barrier_over_none": med["barrier"] / med["none"],
                   "lax_over_none": med["lax"] / med["none"]}
            rows.append(row)
            print(f"step {row['model']:>8}: none {med['none']:7.1f}  lax {med['lax']:7.1f}  early {med['early']:7.1f}  "
                  f"barrier {med['barrier']:7.1f} ms  early/barrier {vs['ratio']:.3f}"
                  f"{'' if vs['beyond_spread'] else ' (within the spread)'}  early/none {row['early_over_none']:.2f}",
                  flush=True)
    finally:
        set_barrier(False)
    return rows


def markdown(result) -> str:
    m = result["machine"]
    lines = [f"# A late rank on {N} CPU devices and across processes", "",
             f"Machine: {m['cpu']}, {m['cores']} cores; commit {m['commit']}. Rank {result['late']} late; "
             f"medians of {result['rounds']} rounds x {result['calls']} calls, arms interleaved. `early`: the "
             "executor's default; `barrier`: every rank waits for all first (JAX_BLINK_BARRIER=1). "
             "A ratio in parentheses lies within the spread of its paired samples.", "",
             "| elements | late by | after arrival: early | barrier | **early / barrier** | ordered | leaves | "
             "leaves / early |", "|---|---|---|---|---|---|---|---|"]

    def ratio(value, beyond):
        return f"**{value:.2f}**" if beyond else f"({value:.2f})"

    for r in result["collective"]:
        if r["delay_ms"] == 0:
            continue
        lines.append(f"| {r['count']:.0e} | {r['delay_ms']:g} ms | {r['plain_after_ms']:.3f} ms | "
                     f"{r['barrier_after_ms']:.3f} ms | "
                     f"{ratio(r['after_arrival_early_over_barrier'], r['after_arrival_beyond_spread'])} | "
                     f"{r['ordered_after_ms']:.3f} ms | {r['leaves_after_ms']:.3f} ms | {r['leaves_over_plain']:.2f} |")
    lines += ["", f"psum(slow_ranks=...) runs `{result['psum_runs']}` here.", "",
              "Nobody late, the whole call (in-process, 8 ranks; across processes, the last process's call):", "",
              "| where | elements | early | barrier | early / barrier |", "|---|---|---|---|---|"]
    in_process = result.get("punctual", []) + [r for r in result["collective"] if r["delay_ms"] == 0]
    for r in sorted(in_process, key=lambda r: r["count"]):
        lines.append(f"| 1x8 in-process | {r['count']:.0e} | {r['plain_call_ms']:.3f} ms | {r['barrier_call_ms']:.3f} ms | "
                     f"{ratio(r['call_early_over_barrier'], r['call_beyond_spread'])} |")
    for r in result.get("processes", []):
        if r["delay_ms"] == 0:
            lines.append(f"| {r['layout']} processes | {r['count']:.0e} | {r['early_ms']:.3f} ms | {r['barrier_ms']:.3f} ms | "
                         f"{ratio(r['early_over_barrier'], r['beyond_spread'])} |")
    late = [r for r in result.get("processes", []) if r["delay_ms"]]
    if late:
        lines += ["", "Across processes, the last process late, after its arrival:", "",
                  "| layout | elements | late by | early | barrier | **early / barrier** |", "|---|---|---|---|---|---|"]
        for r in late:
            lines.append(f"| {r['layout']} | {r['count']:.0e} | {r['delay_ms']:g} ms | {r['early_ms']:.3f} ms | "
                         f"{r['barrier_ms']:.3f} ms | {ratio(r['early_over_barrier'], r['beyond_spread'])} |")
    if result.get("topologies"):
        lines += ["", "Trees deeper than a star (8 CPU devices, all early; `ordered`: the late rank "
                  "reduced last, tolerance 0; `leaves`: a leaf of every tree, tolerance 0.2), after arrival:", "",
                  "| topology | elements | late by | plain | barrier | ordered | leaves | ordered / plain | "
                  "leaves / plain |", "|---|---|---|---|---|---|---|---|---|"]
        for r in result["topologies"]:
            leaves = f"{r['leaves_after_ms']:.3f} ms" if "leaves_after_ms" in r else "none"
            lv = ratio(r["leaves_over_plain"], r["leaves_beyond_spread"]) if "leaves_over_plain" in r else "-"
            lines.append(f"| {r['topology']} | {r['count']:.0e} | {r['delay_ms']:g} ms | {r['plain_after_ms']:.3f} ms | "
                         f"{r['barrier_after_ms']:.3f} ms | {r['ordered_after_ms']:.3f} ms | {leaves} | "
                         f"{ratio(r['ordered_over_plain'], r['ordered_beyond_spread'])} | {lv} |")
    if result.get("mlps"):
        lines += ["", "Training steps of bench_steps.py (batch 64 per device; psum's default buckets), nobody "
                  "made late:", "",
                  "| MLP | none | lax.psum | psum early | psum barrier | early / barrier | early / none | "
                  "barrier / none | lax / none |", "|---|---|---|---|---|---|---|---|---|"]
        for r in result["mlps"]:
            lines.append(f"| {r['model']} | {r['none_ms']:.1f} ms | {r['lax_ms']:.1f} ms | {r['early_ms']:.1f} ms | "
                         f"{r['barrier_ms']:.1f} ms | {ratio(r['early_over_barrier'], r['beyond_spread'])} | "
                         f"{r['early_over_none']:.2f} | {r['barrier_over_none']:.2f} | {r['lax_over_none']:.2f} |")
    if result.get("step"):
        s = result["step_model"]
        lines += ["", f"Training step, one device late: MLP {s['depth']} x {s['width']}, batch {s['batch']} per device.", "",
                  "| late by | lax.psum step | psum step | psum(slow_ranks) step | after arrival: slow_ranks / plain |",
                  "|---|---|---|---|---|"]
        for r in result["step"]:
            lines.append(f"| {r['delay_ms']:g} ms | {r['lax_step_ms']:.2f} ms | {r['plain_step_ms']:.2f} ms | "
                         f"{r['slow_ranks_step_ms']:.2f} ms | {r['slow_ranks_over_plain_after']:.2f} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["1e5", "1e6", "4e6"], help="float32 elements per device")
    ap.add_argument("--delays", nargs="+", type=float, default=[0, 1, 5, 20], help="ms")
    ap.add_argument("--late", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=4, help="calls per run_ranks run")
    ap.add_argument("--punctual", action="store_true",
                    help="also time nobody late from 1 to 1e7 floats per device, early against barrier")
    ap.add_argument("--punctual-sizes", nargs="+", default=["1", "1e3", "1e5", "1e6", "1e7"])
    ap.add_argument("--topologies", action="store_true",
                    help="also compare the plans on a ring, a chain and a DGX-1 V100 of 8 ranks, all early")
    ap.add_argument("--topology-size", default="1e6", help="float32 elements per device there")
    ap.add_argument("--processes", action="store_true", help="also run 4 x 1 and 2 x 1 processes")
    ap.add_argument("--process-rounds", type=int, default=15)
    ap.add_argument("--step", action="store_true", help="also time a training step with a late device")
    ap.add_argument("--step-rounds", type=int, default=21)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--mlps", action="store_true", help="also time bench_steps.py's MLP steps, early against barrier")
    ap.add_argument("--mlp-rounds", type=int, default=9)
    ap.add_argument("--machine", default=harness.machine_tag(), help="result file name (default: this machine's)")
    ap.add_argument("--results", default=str(harness.RESULTS), help="the folder to write them to")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # a process of --processes' jobs
    args = ap.parse_args()
    sizes = [int(float(s)) for s in args.sizes]
    if args.worker:
        processes_worker(sizes, args.delays, args.rounds)
        return
    print(f"# {harness.machine()}")
    rows, picked = collective_rows(sizes, args.delays, args.late, args.rounds, args.calls)
    result = {"machine": harness.machine(), "late": args.late, "rounds": args.rounds, "calls": args.calls,
              "psum_runs": picked, "collective": rows, "method": __doc__.split("\n\n")[2:6]}
    punctual_sizes = [int(float(s)) for s in args.punctual_sizes]
    if args.punctual:
        result["punctual"] = collective_rows([c for c in punctual_sizes if c not in sizes], [0.0], args.late,
                                             args.rounds, args.calls, arms=("plain", "barrier"))[0]
    if args.topologies:
        result["topologies"] = topology_rows(int(float(args.topology_size)), [d for d in args.delays if d],
                                             args.late, args.rounds, args.calls)
    if args.processes:
        result["processes"] = processes_rows([4, 2], sizes, [d for d in args.delays if d], punctual_sizes,
                                             args.process_rounds)
    if args.mlps:
        result["mlps"] = mlp_rows(args.mlp_rounds)
    if args.step:
        result["step_model"] = {"width": args.width, "depth": args.depth, "batch": args.batch}
        result["step"] = step_rows(args.delays, args.late, args.step_rounds, args.width, args.depth, args.batch)
    if not args.no_write:
        out = Path(args.results) / f"stragglers_{args.machine}"
        out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        out.with_suffix(".md").write_text(markdown(result))
        print(f"wrote {out}.json and .md")


if __name__ == "__main__":
    main()
