"""Allreduce over links faster one way than the other: the "split" family against the others.

On random topologies whose links have a different bandwidth per direction
(5 to 8 ranks, a ring backbone plus random chords, each direction drawn
independently from 5..40 GB/s; every third one with a PCIe-like switch at
12 GB/s up and 16 down), and on DGX-1V allocations whose PCIe links carry
12 GB/s toward the CPU and 16 GB/s away from it, compares:

* ``split``: ``plan(t)``, which plans the ``"split"`` family (reduce trees
  into a root, other broadcast trees out of it) where links are asymmetric
  and keeps it where it is faster;
* ``tree``: the best of the families that reduce up and broadcast down the
  same trees (``plan(t, max_trees=64)``, which does not plan ``"split"``),
  the planner's result before it;
* ``forestcoll``: reduce-scatter then all-gather, each planned on its own
  (ForestColl's directed packings), ``1 / (1/rs + 1/ag)``;

as planned rates (GB/s of algbw), and the split plan tuned and simulated at
256 MB against the tree plan and NCCL's choice (the faster of ring and double
binary tree, where the topology routes them).

Writes ``benchmarks/results/asymmetric_<machine>.{json,md}``.

Usage: ``python benchmarks/bench_asymmetric.py [--count 24] [--machine NAME]``
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from _machine import machine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIZE = 2**28


def random_asymmetric(seed):
    """A random topology whose link directions differ (see the module docstring)."""
    from jax_blink.topo import Topology

    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 9))

    def gbps():
        return float(rng.integers(1, 9) * 5)

    links = [(i, (i + 1) % n, gbps(), "nvlink", gbps()) for i in range(n)]
    for u in range(n):
        for v in range(u + 2, n):
            if (u, v) != (0, n - 1) and rng.random() < 0.3:
                links.append((u, v, gbps(), "nvlink", gbps()))
    switches = []
    if seed % 3 == 0:
        switches = ["pcie-switch"]
        links += [(r, n, 12.0, "pcie", 16.0) for r in range(n)]
    return Topology.from_links(n, links, switches, name=f"random-{seed}")


def dgx1v_asymmetric_pcie(gpus):
    """DGX-1V over ``gpus`` with every PCIe link 12 GB/s toward the CPU, 16 GB/s away from it."""
    from jax_blink.topo import Topology

    d = Topology.preset("dgx1-v100")

    def is_cpu(node):
        return node >= d.n and d.switches[node - d.n].startswith("cpu")

    links = []
    for l in d.links:
        if l.kind == "pcie" and not (is_cpu(l.u) and is_cpu(l.v)):  # u is the end nearer the GPU
            links.append((l.u, l.v, 12.0, "pcie", 16.0))
        else:
            links.append((l.u, l.v, l.bandwidth_gbps, l.kind, l.reverse_gbps))
    full = Topology.from_links(d.n, links, d.switches, name="dgx1-v100, PCIe 12/16")
    return full.subset(gpus) if len(gpus) < d.n else full


def nccl_time(t):
    """NCCL's choice simulated: the faster of ring and double binary tree, each at its fastest
    chunking (``sim.tune_baseline``: the search Blink's plans get from ``sim.tune``), or None."""
    from jax_blink.sim import tune_baseline
    from jax_blink.topo import TopologyError

    times = []
    for name in ("nccl-ring", "nccl-dbtree"):
        try:
            times.append(tune_baseline(name, t, SIZE).result.time_s)
        except TopologyError:
            pass
    return min(times) if times else None


def main() -> int:
    from jax_blink.planning import plan
    from jax_blink.sim import tune

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=24, help="random topologies")
    parser.add_argument("--machine", default="amd-epyc-2core")
    args = parser.parse_args()
    topologies = [random_asymmetric(seed) for seed in range(args.count)]
    topologies += [dgx1v_asymmetric_pcie(g) for g in ([0, 1, 2, 5, 7], [0, 1, 4, 5], list(range(8)))]
    rows = []
    for t in topologies:
        start = time.perf_counter()
        split = plan(t, cache=False)
        plan_s = time.perf_counter() - start
        tree = plan(t, max_trees=64, cache=False)
        rs, ag = plan(t, "reduce_scatter", cache=False), plan(t, "allgather", cache=False)
        split_sim = tune(split, SIZE).result.time_s
        tree_sim = tune(tree, SIZE).result.time_s
        nccl = nccl_time(t)
        row = {"topology": t.name, "ranks": t.n, "switch": bool(t.switches), "family": split.family,
               "trees": len(split.trees), "plan_s": plan_s,
               "split_gbps": split.rate_gbps, "bound_gbps": split.bound_gbps, "tree_gbps": tree.rate_gbps,
               "forestcoll_gbps": 1 / (1 / rs.rate_gbps + 1 / ag.rate_gbps),
               "split_sim_us": split_sim * 1e6, "tree_sim_us": tree_sim * 1e6,
               "nccl_sim_us": None if nccl is None else nccl * 1e6}
        rows.append(row)
        print(json.dumps(row), flush=True)
    gains = [r["split_gbps"] / r["tree_gbps"] for r in rows]
    over_fc = [r["split_gbps"] / r["forestcoll_gbps"] for r in rows]
    sim_gain = [r["tree_sim_us"] / r["split_sim_us"] for r in rows]
    over_nccl = [r["nccl_sim_us"] / r["split_sim_us"] for r in rows if r["nccl_sim_us"]]

    def geo(xs):
        return math.exp(statistics.fmean(math.log(x) for x in xs))

    summary = {"topologies": len(rows), "split_chosen": sum(r["family"] == "split" for r in rows),
               "planned_over_tree_geomean": geo(gains), "planned_over_tree_max": max(gains),
               "planned_over_forestcoll_geomean": geo(over_fc), "planned_over_forestcoll_min": min(over_fc),
               "sim_over_tree_geomean": geo(sim_gain), "sim_over_tree_min": min(sim_gain),
               "sim_over_nccl_geomean": geo(over_nccl), "sim_over_nccl_min": min(over_nccl),
               "certified": all(math.isclose(r["split_gbps"], r["bound_gbps"], rel_tol=1e-6) for r in rows)}
    print(json.dumps(summary), flush=True)
    lines = [f"# Allreduce over asymmetric links ({args.machine})", "",
             "`python benchmarks/bench_asymmetric.py`: planned rates (GB/s algbw) and simulated 256 MB times "
             "(us, tuned lowering, default SimModel). `split` is `plan(t)`; `tree` the families that reduce "
             "and broadcast along the same trees; `forestcoll` reduce-scatter then all-gather; `nccl` the "
             "faster of ring and double binary tree. Planning time is this machine's.", "",
             "| topology | ranks | family | trees | plan s | split | tree | forestcoll | bound "
             "| split sim | tree sim | nccl sim |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        nccl = "n/a" if r["nccl_sim_us"] is None else f"{r['nccl_sim_us']:.0f}"
        lines.append(f"| {r['topology']} | {r['ranks']} | {r['family']} | {r['trees']} | {r['plan_s']:.1f} | "
                     f"{r['split_gbps']:.2f} | {r['tree_gbps']:.2f} | {r['forestcoll_gbps']:.2f} | "
                     f"{r['bound_gbps']:.2f} | {r['split_sim_us']:.0f} | {r['tree_sim_us']:.0f} | {nccl} |")
    lines += ["", "Summary: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                         for k, v in summary.items())]
    out = ROOT / "benchmarks" / "results" / f"asymmetric_{args.machine}"
    out.with_suffix(".json").write_text(json.dumps({"machine": machine(name=args.machine), "size_bytes": SIZE,
                                                    "rows": rows, "summary": summary}, indent=1))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}.json and .md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
