"""The simulator against its closed forms at 256 MB (docs/simulator.md's tables).

For every 8-GPU preset: the NCCL-style ring, reduce-scatter + all-gather,
the double binary tree and the chain, simulated over their busiest arc
(``jax_blink.sim.closed_form.busiest_arc_s``, counted from the schedule's
steps); Blink's plan simulated over its busiest arc and over its slowest
tree's pipeline form (``slowest_tree_s``). Then, over several hosts, NCCL's
flat ring and hierarchical tree over their busiest arc. All with the reducer
out of the way (``reduce_gbps=inf``) and, for the single machines, with the
default model as well.

Writes ``benchmarks/results/sim_fidelity_<machine>.{json,md}``.

Usage: ``python benchmarks/sim_fidelity.py [--machine NAME]``
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from _machine import machine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIZE = 2**28
PRESETS = ["dgx-a100", "hgx-h100", "dgx1-v100", "dgx1-p100", "pcie"]
HOSTS = [("dgx1-v100", 4, 1, 12.5), ("dgx1-v100", 4, 4, 12.5), ("dgx-a100", 4, 8, 25.0)]


def main() -> int:
    from jax_blink.planning import plan, plan_hosts
    from jax_blink.sim import SimModel, simulate
    from jax_blink.sim.baselines import chain, double_binary_tree, ring_allreduce, rs_ag
    from jax_blink.sim.closed_form import busiest_arc_s, slowest_tree_s
    from jax_blink.sim.hosts import flat_ring, hierarchical_tree
    from jax_blink.topo import Topology

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", default="amd-epyc-2core")
    args = parser.parse_args()
    models = {"free reducer": SimModel(reduce_gbps=math.inf), "default": SimModel()}
    rows = []
    for preset in PRESETS:
        t = Topology.preset(preset)
        p = plan(t)
        chunks = p.chunks_for(SIZE)
        schedules = {"blink": p.lower(SIZE, "float32", chunks=chunks)}
        for name, build in (("nccl-ring", ring_allreduce), ("rs-ag", rs_ag),
                            ("nccl-dbtree", double_binary_tree), ("chain", chain)):
            schedules[name] = build(t, SIZE, model=models["free reducer"])
        for name, s in schedules.items():
            arc = busiest_arc_s(s, t)
            row = {"topology": preset, "schedule": name, "busiest_arc_us": arc * 1e6}
            for label, model in models.items():
                row[f"sim_over_arc ({label})"] = simulate(s, t, model=model).time_s / arc
            if name == "blink":
                row["sim_over_slowest_tree (free reducer)"] = (
                    simulate(s, t, model=models["free reducer"]).time_s / slowest_tree_s(p, chunks, SIZE))
            rows.append(row)
            print(json.dumps(row), flush=True)
    for preset, hosts, nics, gbps in HOSTS:
        t = Topology.multi_host(preset, hosts, nic_gbps=gbps, nics=nics)
        hp = plan_hosts(t)
        for name, build in (("nccl-ring", flat_ring), ("nccl-tree", hierarchical_tree)):
            s = build(t, SIZE, host_plan=hp, model=models["free reducer"])
            arc = busiest_arc_s(s, t)
            rows.append({"topology": f"{t.name}, {nics} x {gbps:g} GB/s", "schedule": name,
                         "busiest_arc_us": arc * 1e6,
                         "sim_over_arc (free reducer)": simulate(s, t, model=models["free reducer"]).time_s / arc})
            print(json.dumps(rows[-1]), flush=True)
    columns = ["sim_over_arc (free reducer)", "sim_over_arc (default)", "sim_over_slowest_tree (free reducer)"]
    lines = [f"# The simulator against its closed forms, 256 MB ({args.machine})", "",
             "`python benchmarks/sim_fidelity.py`: simulated time / closed form. The busiest arc is counted from "
             "the schedule's steps (`jax_blink.sim.closed_form.busiest_arc_s`); Blink's slowest tree is "
             "`slowest_tree_s`. Simulated numbers: they depend on the model, not on this machine.", "",
             "| topology | schedule | busiest arc, us | " + " | ".join(columns) + " |",
             "|---|---|---|" + "---|" * len(columns)]
    for r in rows:
        lines.append(f"| {r['topology']} | {r['schedule']} | {r['busiest_arc_us']:.0f} | "
                     + " | ".join(f"{r[c]:.3f}" if c in r else "" for c in columns) + " |")
    out = ROOT / "benchmarks" / "results" / f"sim_fidelity_{args.machine}"
    out.with_suffix(".json").write_text(json.dumps({"machine": machine(name=args.machine), "size_bytes": SIZE,
                                                    "rows": rows}, indent=1))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}.json and .md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
