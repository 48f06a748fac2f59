"""How close psum's trace-time tuning comes to the exhaustive simulated search, and how much faster it is.

psum tunes a plan's lowering for the CUDA executor at trace time by ranking every
candidate (tree subsets at chunk scales 1/1024 to 64) with the analytic estimate
``jax_blink.sim.tuning.estimate_seconds`` and simulating only the best few
(``jax_blink.choice.requests.tune_simulate_top``; ``tune(..., simulate_top=...)``). This
compares its choice with ``tune``'s exhaustive search (every subset, doubling and
halving the chunks by simulation) on every GPU preset and every allocation of 2 to 8
GPUs of a DGX-1 V100 (247), at each size: the ratio of the predicted times
(1.0: the same choice or an equally fast one) and the seconds each search took.
tests/sim/test_estimates.py checks a sample of the same within 2%.

Writes ``benchmarks/results/tune_estimate_<machine>.{json,md}``.

With ``--simulate-top 4 8`` it also reports those counts: how many simulations a
trace-time choice needs.

Usage: ``python benchmarks/bench_tune_estimate.py [--sizes 1M 16M 256M] [--simulate-top N ...] [--machine NAME]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

from _machine import RUN_COMMIT, machine

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from jax_blink import Topology, plan
    from jax_blink.cli.sizes import format_size, parse_size
    from jax_blink.choice.requests import tune_simulate_top
    from jax_blink.planning.cost import CUDA_STREAM
    from jax_blink.sim import tune

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["1M", "16M", "256M"])
    parser.add_argument("--simulate-top", nargs="+", type=int, default=[],
                        help="simulation counts to compare besides psum's (tune_simulate_top)")
    parser.add_argument("--machine", default="amd-epyc-2core")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes]
    full = Topology.preset("dgx1-v100")
    topologies = [Topology.preset(p) for p in ("dgx1-v100", "dgx1-p100", "dgx-a100", "hgx-h100", "pcie")]
    topologies += [full.subset(list(c)) for k in range(2, 8) for c in itertools.combinations(range(8), k)]
    rows = []
    for topology in topologies:
        p = plan(topology)
        for size in sizes:
            start = time.perf_counter()
            exhaustive = tune(p, size, executor=CUDA_STREAM)
            exhaustive_s = time.perf_counter() - start
            for top in ["psum"] + args.simulate_top:
                start = time.perf_counter()
                fast = tune(p, size, executor=CUDA_STREAM,
                            simulate_top=tune_simulate_top(size) if top == "psum" else top)
                rows.append({"topology": topology.name, "size_bytes": size, "simulate_top": top,
                             "ratio": fast.seconds / exhaustive.seconds,
                             "exhaustive_us": exhaustive.seconds * 1e6, "fast_us": fast.seconds * 1e6,
                             "exhaustive_chunks": list(exhaustive.chunks), "fast_chunks": list(fast.chunks),
                             "exhaustive_simulations": exhaustive.candidates, "fast_simulations": fast.candidates,
                             "exhaustive_s": exhaustive_s, "fast_s": time.perf_counter() - start})
        these = rows[-len(sizes) * (1 + len(args.simulate_top)):]
        print(f"{topology.name}: worst {max(r['ratio'] for r in these):.3f}", flush=True)
    commit = RUN_COMMIT
    out = ROOT / "benchmarks" / "results"
    info = machine(name=args.machine)
    (out / f"tune_estimate_{args.machine}.json").write_text(  # a row per line: thousands of rows
        '{"machine": ' + json.dumps(info) + ', "commit": ' + json.dumps(commit) + ', "rows": [\n'
        + ",\n".join(json.dumps(r) for r in rows) + "\n]}\n")
    extra = f" --simulate-top {' '.join(map(str, args.simulate_top))}" if args.simulate_top else ""
    lines = [f"# Trace-time tuning against the exhaustive search ({info['cpu']}, {info['cores']} cores)", "",
             f"Commit {commit}. Predicted time of `tune(simulate_top=N)`'s choice over the exhaustive "
             "search's (CUDA executor costs), and the seconds each search took; N = psum is psum's "
             "own count at that size (`choice.requests.tune_simulate_top`). `python benchmarks/bench_tune_estimate.py"
             f" --sizes {' '.join(args.sizes)}{extra}` "
             "writes this.", "",
             "| size | N | topologies | worst ratio (where) | ratio > 1.01 | ratio > 1.02 | median exhaustive s "
             "| median fast s | max fast s |", "|---|---|---|---|---|---|---|---|---|"]
    for size in sizes:
        for top in ["psum"] + args.simulate_top:
            sel = [r for r in rows if r["size_bytes"] == size and r["simulate_top"] == top]
            label = f"psum ({tune_simulate_top(size)})" if top == "psum" else str(top)
            worst = max(sel, key=lambda r: r["ratio"])
            med = lambda key: sorted(r[key] for r in sel)[len(sel) // 2]  # noqa: E731
            lines.append(f"| {format_size(size)} | {label} | {len(sel)} | {worst['ratio']:.3f} ({worst['topology']}) "
                         f"| {sum(r['ratio'] > 1.01 for r in sel)} | {sum(r['ratio'] > 1.02 for r in sel)} "
                         f"| {med('exhaustive_s'):.2f} | {med('fast_s'):.3f} | {max(r['fast_s'] for r in sel):.2f} |")
    (out / f"tune_estimate_{args.machine}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
