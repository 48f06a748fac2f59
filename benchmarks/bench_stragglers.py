"""A late rank on 8 CPU devices: the time from its arrival to the allreduce's end, per plan.

One rank (``--late``, default 3) arrives late by 1, 5 or 20 ms (and 0, to show what each
plan costs when nobody is late); the others are there at once. Three lowerings of the
``shm:8`` allreduce run, interleaved call by call:

* ``plain``:   the plan psum uses without ``slow_ranks`` (every rank roots a star of
  an eighth of the vector and is a child in the seven others);
* ``ordered``: the same trees, but every parent reduces the late rank after its other
  children (``plan(slow_ranks=...)`` where leaves cost more rate than it allows);
* ``leaves``:  trees in which the late rank is a leaf (``plan(slow_ranks=...,
  tolerance=0.1)``: seven stars at 13/14 of the optimum rate), reduced last too.

``psum`` names the one ``psum(slow_ranks=...)`` runs on this machine.

**The collective alone** runs through the CPU executor with one thread per rank (the
``run_ranks`` harness of the test module, the executor XLA's CPU devices run): the late
rank's thread sleeps before each call (test scaffolding, never the production path), and
the harness records when each rank's call began and returned. *After arrival* is the
last return minus the late rank's start.

**A training step** (``--step``): a jitted data-parallel step of an MLP on 8 CPU devices
whose gradients are summed by ``jax_blink.psum`` with and without ``slow_ranks``, on the
plan (``JAX_BLINK_ALGO=blink``), and by ``lax.psum``; one device's host callback sleeps before the loss (test scaffolding in the
program). Its *after arrival* is the step time minus the delay; the step without the
sleep is reported as well.

Writes ``benchmarks/results/stragglers_<machine>.{json,md}`` (``--machine``: another name,
``--results``: another folder).

    python benchmarks/bench_stragglers.py [--sizes 1e5 1e6] [--delays 0 1 5 20] [--rounds 15] [--step]
"""

from __future__ import annotations

import os

import harness

harness.cpu_devices(8)  # before jax is imported
os.environ.setdefault("JAX_BLINK_ALGO", "blink")  # the step's psum on the plan, not lax, at every size

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np


N = 8
TIMEOUT_MS = 60000
#: The rate the ``leaves`` plan may give up (``plan``'s ``tolerance``): shm:8's leaf stars reach 13/14.
LEAF_TOLERANCE = 0.1


def schedules(count: int, late: int) -> dict:
    """The three lowerings of the shm:8 allreduce of ``count`` float32, and which psum runs."""
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
    return {name: (p, p.lower(size, "float32")) for name, p in
            (("plain", plain), ("ordered", ordered), ("leaves", leaves))}, picked


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


def collective_rows(sizes, delays, late, rounds, calls) -> tuple:
    from jax_blink import _ffi

    _ffi.configure_cpu()  # the JAX_BLINK_* executor settings, as a jitted psum gets them
    rows = []
    picked = None
    for count in sizes:
        lowered, picked = schedules(count, late)
        for delay in delays:
            got = {name: [] for name in lowered}
            for _ in range(rounds):  # interleaved: each round runs every plan once
                for name, (_, schedule) in lowered.items():
                    got[name] += time_collective(schedule, count, late, delay, calls)
            row = {"count": count, "delay_ms": delay}
            for name, samples in got.items():
                row[f"{name}_after_ms"] = statistics.median(a for a, _ in samples)
                row[f"{name}_call_ms"] = statistics.median(c for _, c in samples)
            row["ordered_over_plain"] = row["ordered_after_ms"] / row["plain_after_ms"]
            row["leaves_over_plain"] = row["leaves_after_ms"] / row["plain_after_ms"]
            row["psum_over_plain"] = row[f"{picked}_after_ms"] / row["plain_after_ms"]
            rows.append(row)
            print(f"{count:>9} {delay:>6g} ms  after arrival: plain {row['plain_after_ms']:7.3f}  ordered "
                  f"{row['ordered_after_ms']:7.3f} ({row['ordered_over_plain']:.2f})  leaves "
                  f"{row['leaves_after_ms']:7.3f} ({row['leaves_over_plain']:.2f}) ms", flush=True)
    return rows, picked


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


def markdown(result) -> str:
    lines = [f"# A late rank on {N} CPU devices", "",
             f"Machine: {result['machine']['cpu']}, {result['machine']['cores']} cores; commit "
             f"{result['machine']['commit']}. Rank {result['late']} late; medians of "
             f"{result['rounds']} rounds x {result['calls']} calls, plans interleaved.", "",
             "| elements | late by | plain after arrival | ordered | leaves | leaves / plain | whole call, nobody late: plain / leaves |",
             "|---|---|---|---|---|---|---|"]
    on_time = {r["count"]: r for r in result["collective"] if r["delay_ms"] == 0}
    for r in result["collective"]:
        if r["delay_ms"] == 0:
            continue
        base = on_time.get(r["count"])
        calm = f"{base['plain_call_ms']:.3f} / {base['leaves_call_ms']:.3f} ms" if base else "-"
        lines.append(f"| {r['count']:.0e} | {r['delay_ms']:g} ms | {r['plain_after_ms']:.3f} ms | "
                     f"{r['ordered_after_ms']:.3f} ms | {r['leaves_after_ms']:.3f} ms | "
                     f"**{r['leaves_over_plain']:.2f}** | {calm} |")
    lines += ["", f"psum(slow_ranks=...) runs `{result['psum_runs']}` here.", ""]
    if result.get("step"):
        s = result["step_model"]
        lines += [f"Training step: MLP {s['depth']} x {s['width']}, batch {s['batch']} per device.", "",
                  "| late by | lax.psum step | psum step | psum(slow_ranks) step | after arrival: slow_ranks / plain |",
                  "|---|---|---|---|---|"]
        for r in result["step"]:
            lines.append(f"| {r['delay_ms']:g} ms | {r['lax_step_ms']:.2f} ms | {r['plain_step_ms']:.2f} ms | "
                         f"{r['slow_ranks_step_ms']:.2f} ms | {r['slow_ranks_over_plain_after']:.2f} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["1e5", "1e6"], help="float32 elements per device")
    ap.add_argument("--delays", nargs="+", type=float, default=[0, 1, 5, 20], help="ms")
    ap.add_argument("--late", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=4, help="calls per run_ranks run")
    ap.add_argument("--step", action="store_true", help="also time a training step")
    ap.add_argument("--step-rounds", type=int, default=21)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--machine", default=harness.machine_tag(), help="result file name (default: this machine's)")
    ap.add_argument("--results", default=str(harness.RESULTS), help="the folder to write them to")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    sizes = [int(float(s)) for s in args.sizes]
    print(f"# {harness.machine()}")
    rows, picked = collective_rows(sizes, args.delays, args.late, args.rounds, args.calls)
    result = {"machine": harness.machine(), "late": args.late, "rounds": args.rounds, "calls": args.calls,
              "psum_runs": picked, "collective": rows, "method": __doc__.split("\n\n")[2:4]}
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
