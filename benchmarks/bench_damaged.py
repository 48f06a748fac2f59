"""Allreduce on damaged DGX-1 machines: Blink's plan against NCCL's model, in the simulator.

For each case, a DGX-1 preset with links removed (``Topology.without``:
every link between the two GPUs of an NVLink pair, so a V100 pair with two
NVLinks loses both):

* every single-pair failure of ``dgx1-v100`` and ``dgx1-p100`` (16 each);
* every two-pair failure of ``dgx1-v100`` and ``dgx1-p100`` (120 each);
  ``--pairs N`` keeps the first N of them per preset, for a quick run;

it plans the allreduce (``plan(t, cache=False)``, every link kind), checks
that the rate equals the planner's certified bound (LP duality over the
remaining links) and that no tree routes over a removed pair, lowers it at
256 MB with its default chunking, simulates it (``jax_blink.sim.simulate``,
default SimModel) and compares it with NCCL's own tuner model on the same
damaged machine (``jax_blink.sim.nccl.predict``: the faster of its ring and
tree algorithms and protocols).

The NVSwitch presets (``dgx-a100``, ``hgx-h100``) have one link per GPU, to
the switch: removing one disconnects that GPU, so they have no failure a
plan can route around and are not listed.

Writes ``benchmarks/results/damaged_<machine>.{json,md}``.

Usage: ``python benchmarks/bench_damaged.py [--pairs N] [--machine NAME]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

from _machine import machine, machine_tag

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIZE = 2**28
PRESETS = ("dgx1-v100", "dgx1-p100")
RTOL = 1e-6


def nvlink_pairs(topology) -> list:
    """The GPU pairs joined by NVLink, in order."""
    return [(l.u, l.v) for l in topology.links if l.kind == "nvlink" and l.v < topology.n]


def used_pairs(p) -> set:
    """The node pairs any tree of ``p`` routes over (broadcast and reduce paths)."""
    used = set()
    for tree in p.trees:
        for path in tuple(tree.paths) + tuple(tree.reduce_paths):
            used.update((min(a, b), max(a, b)) for a, b in zip(path, path[1:]))
    return used


def run_case(preset: str, removed: tuple) -> dict:
    """Plan, certify, simulate and compare one damaged machine."""
    from jax_blink.planning import plan
    from jax_blink.sim import nccl, simulate
    from jax_blink.topo import Topology

    topology = Topology.preset(preset).without(removed)
    start = time.perf_counter()
    p = plan(topology, cache=False)
    plan_s = time.perf_counter() - start
    schedule = p.lower(SIZE, "float32")
    schedule.validate()
    blink_s = simulate(schedule, topology, SIZE).time_s
    prediction = nccl.predict(topology, SIZE)
    return {"preset": preset, "removed": [list(x) for x in removed], "rate_gbps": p.rate_gbps,
            "bound_gbps": p.bound_gbps, "certified": abs(p.rate_gbps - p.bound_gbps) <= RTOL * p.bound_gbps,
            "uses_removed": sorted(set(removed) & used_pairs(p)) != [], "trees": len(p.trees),
            "ring_rate_gbps": p.ring_rate_gbps, "plan_s": plan_s, "blink_sim_s": blink_s,
            "nccl_s": None if prediction is None else prediction.seconds,
            "nccl_choice": None if prediction is None else f"{prediction.algorithm}/{prediction.protocol}",
            "speedup_vs_nccl": None if prediction is None else prediction.seconds / blink_s}


def geomean(values) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=None, help="two-pair failures per preset (default: all)")
    parser.add_argument("--machine", default=machine_tag(), help="result file name (default: this machine's)")
    args = parser.parse_args()
    from jax_blink.topo import Topology

    cases = []
    for preset in PRESETS:
        pairs = nvlink_pairs(Topology.preset(preset))
        cases += [(preset, "one", (pair,)) for pair in pairs]
        two = list(itertools.combinations(pairs, 2))
        cases += [(preset, "two", combo) for combo in two[:args.pairs]]
    rows = []
    for preset, failure, removed in cases:
        row = dict(run_case(preset, removed), failure=failure)
        rows.append(row)
        print(json.dumps(row), flush=True)
    groups = []
    for preset in PRESETS:
        for failure in ("one", "two"):
            group = [r for r in rows if r["preset"] == preset and r["failure"] == failure]
            if not group:
                continue
            speedups = [r["speedup_vs_nccl"] for r in group if r["speedup_vs_nccl"] is not None]
            groups.append({"preset": preset, "failure": failure, "cases": len(group),
                           "certified": sum(r["certified"] for r in group),
                           "use_removed": sum(r["uses_removed"] for r in group),
                           "rate_min_gbps": min(r["rate_gbps"] for r in group),
                           "rate_max_gbps": max(r["rate_gbps"] for r in group),
                           "geomean_speedup": geomean(speedups) if speedups else None,
                           "min_speedup": min(speedups) if speedups else None,
                           "nccl_cases": len(speedups)})
    speedups = [r["speedup_vs_nccl"] for r in rows if r["speedup_vs_nccl"] is not None]
    summary = {"cases": len(rows), "certified": sum(r["certified"] for r in rows),
               "use_removed": sum(r["uses_removed"] for r in rows),
               "geomean_speedup": geomean(speedups), "min_speedup": min(speedups),
               "slower_than_nccl": sum(s < 1 for s in speedups)}
    print(json.dumps(summary), flush=True)
    lines = [f"# Allreduce on damaged DGX-1 machines ({args.machine})", "",
             "`python benchmarks/bench_damaged.py`: every single NVLink-pair failure and every two-pair failure "
             "of the DGX-1 presets (`Topology.without`), allreduce planned over every link kind. `certified`: "
             "cases whose rate equals the certified bound; `use removed`: cases whose trees route over a "
             "removed pair; speedup: NCCL's tuner model time over Blink's simulated time at 256 MB "
             "(default lowering, default SimModel).", "",
             "| preset | failed pairs | cases | certified | use removed | rate GB/s (min-max) "
             "| speedup vs NCCL geomean | min |",
             "|---|---|---:|---:|---:|---|---:|---:|"]
    for g in groups:
        lines.append(f"| {g['preset']} | {g['failure']} | {g['cases']} | {g['certified']} | {g['use_removed']} "
                     f"| {g['rate_min_gbps']:.1f}-{g['rate_max_gbps']:.1f} | {g['geomean_speedup']:.2f}x "
                     f"| {g['min_speedup']:.2f}x |")
    lines.append(f"| all | | {summary['cases']} | {summary['certified']} | {summary['use_removed']} | "
                 f"| {summary['geomean_speedup']:.2f}x | {summary['min_speedup']:.2f}x |")
    out = ROOT / "benchmarks" / "results" / f"damaged_{args.machine}"
    out.with_suffix(".json").write_text(json.dumps({"machine": machine(name=args.machine), "size_bytes": SIZE,
                                                    "summary": summary, "groups": groups, "rows": rows},
                                                   indent=1) + "\n")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0 if summary["certified"] == summary["cases"] and summary["use_removed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
