"""What the tree-count MILP's time limit buys: trees, planning time and the tuned allreduce's time.

After the packing LP, the planner picks the fewest trees that keep the optimal rate
with a time-limited MILP (``jax_blink.planning.fewest.MILP_TIME_LIMIT_S``; HiGHS
keeps its best incumbent). This plans the allreduce of every GPU preset and of
every allocation of 3 to 7 GPUs of a DGX-1 V100 afresh at each limit given, and
reports how many plans differ from the last limit's, have more or fewer trees, the
planning seconds, and for the plans that differ the tuned lowering's predicted
time on the CUDA executor (``tune(..., executor=CUDA_STREAM, simulate_top=tune_simulate_top(size))``,
what psum runs on GPUs) at 1, 16 and 256 MB, as a ratio to the last limit's plan.
Planning times count the HiGHS incumbent search, so run it on a quiet machine.

Writes ``benchmarks/results/milp_limit_<machine>.{json,md}``.

Usage: ``python benchmarks/bench_milp_limit.py [--limits 0.1 0.25] [--machine NAME]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

from _machine import RUN_COMMIT, machine

ROOT = Path(__file__).resolve().parent.parent
SIZES = (1 << 20, 16 << 20, 256 << 20)


def main() -> int:
    sys.path.insert(0, str(ROOT))
    import cvxpy  # noqa: F401  (imported before the timing: not planning time)

    from jax_blink import Topology
    from jax_blink.choice.requests import tune_simulate_top
    from jax_blink.planning import fewest, planner
    from jax_blink.planning.cost import CUDA_STREAM
    from jax_blink.sim import tune

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limits", nargs="+", type=float, default=[0.1, 0.25],
                        help="MILP time limits in seconds; the last is the reference")
    parser.add_argument("--machine", default="amd-epyc-2core")
    args = parser.parse_args()
    full = Topology.preset("dgx1-v100")
    topologies = [Topology.preset(p) for p in ("dgx1-v100", "dgx1-p100", "dgx-a100", "hgx-h100", "dgx2", "pcie")]
    topologies += [full.subset(list(c)) for k in range(3, 8) for c in itertools.combinations(range(8), k)]
    planner._plan_uncached(topologies[-1], "allreduce", None, None, 0.0, "all")  # first-solve costs
    rows = []
    saved = fewest.MILP_TIME_LIMIT_S
    try:
        for topology in topologies:
            plans = {}
            for limit in args.limits:
                fewest.MILP_TIME_LIMIT_S = limit
                start = time.perf_counter()
                plans[limit] = planner._plan_uncached(topology, "allreduce", None, None, 0.0, "all")[0]
                seconds = time.perf_counter() - start
                p = plans[limit]
                rows.append({"topology": topology.name, "limit_s": limit, "seconds": seconds, "family": p.family,
                             "trees": len(p.trees), "depth": max(t.depth for t in p.trees),
                             "same_as_reference": None, "tuned_ratio": None})
            reference = plans[args.limits[-1]]
            tuned = {}
            for row in rows[-len(args.limits):]:
                p = plans[row["limit_s"]]
                row["same_as_reference"] = p.trees == reference.trees
                if not row["same_as_reference"]:
                    for q in (p, reference):
                        if id(q) not in tuned:
                            tuned[id(q)] = [tune(q, s, executor=CUDA_STREAM, simulate_top=tune_simulate_top(s)).seconds
                                            for s in SIZES]
                    row["tuned_ratio"] = [a / b for a, b in zip(tuned[id(p)], tuned[id(reference)])]
            print(topology.name, [(r["limit_s"], r["trees"], round(r["seconds"], 3)) for r in rows[-len(args.limits):]],
                  flush=True)
    finally:
        fewest.MILP_TIME_LIMIT_S = saved
    out = ROOT / "benchmarks" / "results"
    info = machine(name=args.machine)
    (out / f"milp_limit_{args.machine}.json").write_text(json.dumps(
        {"machine": info, "commit": RUN_COMMIT, "sizes": list(SIZES), "rows": rows}, indent=1) + "\n")
    lines = [f"# The tree-count MILP's time limit ({info['cpu']}, {info['cores']} cores)", "",
             f"Commit {RUN_COMMIT}. The allreduce of {len(topologies)} topologies (every GPU preset and every "
             "allocation of 3 to 7 GPUs of a DGX-1 V100) planned afresh at each limit; against the plans at "
             f"{args.limits[-1]} s: how many differ, have more or fewer trees, and the tuned lowering's "
             "predicted time on the CUDA executor at 1, 16 and 256 MB for the plans that differ "
             "(ratio to the reference plan's; geometric mean and range). "
             "`python benchmarks/bench_milp_limit.py` writes this.", "",
             "| MILP limit (s) | plans differ | more trees | fewer trees | tuned ratio geomean | tuned ratio range "
             "| median plan s | max plan s | total plan s |", "|---|---|---|---|---|---|---|---|---|"]
    ref = {r["topology"]: r for r in rows if r["limit_s"] == args.limits[-1]}
    for limit in args.limits:
        sel = [r for r in rows if r["limit_s"] == limit]
        ratios = [x for r in sel if r["tuned_ratio"] for x in r["tuned_ratio"]]
        secs = sorted(r["seconds"] for r in sel)
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else 1.0
        span = f"{min(ratios):.3f}-{max(ratios):.3f}" if ratios else "-"
        more = sum(r["trees"] > ref[r["topology"]]["trees"] for r in sel)
        fewer = sum(r["trees"] < ref[r["topology"]]["trees"] for r in sel)
        lines.append(f"| {limit:g} | {sum(not r['same_as_reference'] for r in sel)} | {more} | {fewer} | {geo:.3f} "
                     f"| {span} | {secs[len(secs) // 2]:.3f} | {secs[-1]:.2f} | {sum(secs):.1f} |")
    (out / f"milp_limit_{args.machine}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
