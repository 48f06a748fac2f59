"""Blink plans against NCCL-style baselines on every DGX-1 allocation (simulated).

Claims this script measures (issue 5):

1. Over every allocation of 2..8 GPUs of ``dgx1-v100`` and ``dgx1-p100`` at
   256 MB: geometric mean and maximum speedup of the Blink plan (lowered by
   :func:`jax_blink.sim.tune`) over the NCCL-style ring baseline.
2. How many allocations Blink is slower than any baseline, at 256 MB and 1 MB,
   before and after the per-call fallback to ``lax.psum`` (NCCL: the faster
   of its ring and double binary tree).
3. The crossover size per preset (whole machine) below which ``lax.psum``
   (NCCL-style, as above) is predicted faster than Blink.

Writes ``benchmarks/results/blink_vs_baselines_<machine>.{json,md}`` and
``.png``. Run from the repository root:

    python benchmarks/bench_blink_vs_baselines.py [--jobs 2] [--machine NAME]
"""

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tqdm import tqdm  # noqa: E402

from _machine import machine  # noqa: E402
from jax_blink.cli.sizes import format_size, parse_sizes  # noqa: E402
from jax_blink.sim import SimModel, compare, sweep_subsets  # noqa: E402
from jax_blink.topo import Topology  # noqa: E402

PRESETS = ("dgx1-v100", "dgx1-p100")
SWEEP_SIZES = (2**20, 2**28)
#: Whole machines for the crossover (dgx2's 16 ranks make its large sizes slow to simulate).
CROSSOVER_PRESETS = ("dgx1-v100", "dgx1-p100", "dgx-a100", "hgx-h100", "pcie")
CROSSOVER_SIZES = "1K:256M:4"


def crossover(topology, sizes, model):
    """Smallest size of ``sizes`` from which Blink is never slower than NCCL (the
    faster of ring and double binary tree) at any larger size; ``inf`` if NCCL
    is faster at the largest size."""
    rows = [(size, compare(topology, size, "float32", model)) for size in sizes]
    nccl = [min(r["nccl-ring"]["time_us"], r["nccl-dbtree"]["time_us"]) for _, r in rows]
    blink = [r["blink"]["time_us"] for _, r in rows]
    slower = [i for i, (b, n) in enumerate(zip(blink, nccl)) if b > n]  # sizes: factor 4
    if not slower:
        return sizes[0], rows
    if slower[-1] + 1 == len(sizes):
        return math.inf, rows  # NCCL is predicted faster at the largest size
    return sizes[slower[-1] + 1], rows


def plot(results, crossovers, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axes[0]
    for preset in PRESETS:
        if not results[preset].get("allocations"):  # a kept sweep whose rows were not recorded
            ax.text(0.5, 0.5 - 0.1 * PRESETS.index(preset), f"{preset}: per-allocation rows not kept",
                    ha="center", transform=ax.transAxes)
            continue
        speedups = sorted(row["sizes"][str(2**28)]["blink"]["vs_ring"] for row in results[preset]["allocations"])
        ax.plot(range(len(speedups)), speedups, label=preset)
    ax.axhline(1, color="k", lw=0.8)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("allocations, sorted")
    ax.set_ylabel("speedup over NCCL-style rings")
    ax.set_title("256 MB allreduce, every DGX-1 allocation")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    ax.grid(alpha=0.3)
    for ax, preset in zip(axes[1:], PRESETS):
        rows = crossovers[preset]["rows"]
        sizes = [r["size_bytes"] for r in rows]
        for name in rows[0]["algorithms"]:
            ax.plot(sizes, [r["algorithms"][name]["busbw_gbps"] for r in rows], marker="o", ms=2,
                    lw=2.5 if name == "blink" else 1.2, label=name)
        if math.isfinite(crossovers[preset]["crossover_bytes"]):
            ax.axvline(crossovers[preset]["crossover_bytes"], color="k", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ticks = sizes[::2]
        ax.set_xticks(ticks)
        ax.set_xticklabels([format_size(s) for s in ticks], rotation=45)
        ax.set_xlabel("size per GPU")
        ax.set_ylabel("busbw (GB/s)")
        drawn = math.isfinite(crossovers[preset]["crossover_bytes"])
        ax.set_title(f"{preset}, all 8 GPUs" + (" (dotted: crossover)" if drawn else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(results, crossovers, info, model, seconds):
    lines = [
        "# Blink vs NCCL-style baselines (simulated)",
        "",
        f"Machine: {info['cpu']}, {info['cores']} cores, Python {info['python']} ({info['note']}). "
        f"Model: `SimModel({', '.join(f'{k}={v!r}' for k, v in model.items())})` "
        f"(per-kind latency defaults in `jax_blink.planning.cost.LATENCY_US`). "
        f"Run time {seconds / 60:.1f} min"
        + (" (the crossover only: the sweep is kept from the previous run, `--crossover-only`)"
           if "sweep_kept_from" in info else "")
        + ". Reproduce: `python benchmarks/bench_blink_vs_baselines.py`.",
        "",
        "Speedup = baseline time / Blink time; Blink = `jax_blink.sim.tune(plan(topology), size)`. "
        "`#slower` counts allocations where some baseline is faster than Blink; "
        "`w/ fallback` after falling back to NCCL (`lax.psum`: the faster of ring and double binary tree) "
        "where the simulator predicts it faster.",
        "",
        "Every baseline is scored at its fastest chunking (`sim.tune_baseline`, the search Blink's "
        "plans get). The last two columns take the view psum's decision takes on GPUs: Blink tuned "
        "for and run by the CUDA executor (its transfer plus `planning.cost.CUDA_STREAM`: a per-call "
        "cost and a per-step host cost fitted to one H100's and one H200's runs) against NCCL as "
        "its own tuner predicts it (`sim.nccl`, NCCL's `src/graph/tuning.cc`); `#NCCL faster` "
        "counts the allocations where "
        "that model is faster, which psum hands to `lax.psum`.",
        "",
        "| preset | size | allocations | vs ring geomean | vs ring max (allocation) | vs best baseline geomean | "
        "worst vs best | #slower | #slower w/ fallback | vs NCCL model geomean | #NCCL faster |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for preset in PRESETS:
        for size, s in results[preset]["summary"].items():
            model_geo = s.get("geomean_vs_nccl_model")
            lines.append(
                f"| {preset} | {format_size(int(size))} | {s['allocations']} | {s['geomean_vs_ring']:.2f}x | "
                f"{s['max_vs_ring']:.2f}x ({','.join(map(str, s['max_vs_ring_allocation']))}) | "
                f"{s['geomean_vs_best']:.2f}x | {s['min_vs_best']:.3f} | {s['slower']} | {s['slower_with_fallback']} | "
                f"{'-' if model_geo is None else f'{model_geo:.2f}x'} | {s.get('slower_than_nccl_model', '-')} |")
    lines += ["", "Crossover (whole machine, sizes 1K..256M by 4x): the smallest size from which Blink is "
              "predicted at least as fast as NCCL (`lax.psum`: the faster of ring and double binary tree) at "
              "every larger size; `never` when NCCL is faster at 256 MB. The sizes where NCCL wins are listed: "
              "where rings are already bandwidth-optimal (whole DGX-1, PCIe box) they are the large ones.", "",
              "| preset | crossover | sizes where NCCL is predicted faster | Blink/NCCL time at 1 KB | at 1 MB | at 256 MB | "
              "CUDA executor / NCCL model at 1 KB | at 1 MB | at 256 MB |",
              "|---|---|---|---|---|---|---|---|---|"]
    for preset, c in crossovers.items():
        by_size = {r["size_bytes"]: r["algorithms"] for r in c["rows"]}

        def ratio(size):
            a = by_size[size]
            return a["blink"]["time_us"] / min(a["nccl-ring"]["time_us"], a["nccl-dbtree"]["time_us"])

        def model_ratio(size):
            a = by_size[size]
            if "nccl-model" not in a:
                return "-"
            return f"{a['blink']['time_us_cuda_executor'] / a['nccl-model']['time_us']:.2f}"

        cross = c["crossover_bytes"]
        faster = ", ".join(format_size(x) for x in c["nccl_faster_sizes"]) or "none"
        lines.append(f"| {preset} | {format_size(cross) if math.isfinite(cross) else 'never'} | {faster} | {ratio(2**10):.2f} | "
                     f"{ratio(2**20):.2f} | {ratio(2**28):.2f} | {model_ratio(2**10)} | {model_ratio(2**20)} | "
                     f"{model_ratio(2**28)} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--machine", default=None, help="name used in the output files (default: from lscpu)")
    parser.add_argument("--crossover-only", action="store_true",
                        help="re-run only the crossover; keep the sweep of the existing results file (its run "
                             "takes about 40 minutes on 2 cores, the crossover about 10)")
    args = parser.parse_args()
    info = machine(note="simulated: the numbers depend on the model, not on this machine")
    name = args.machine or "-".join(info["cpu"].split()[:2]).lower() + f"-{info['cores']}core"
    model = SimModel()
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"blink_vs_baselines_{name}")
    start = time.perf_counter()
    results = {}
    if args.crossover_only:
        with open(out + ".json") as f:
            kept = json.load(f)
        # older files keep only the summaries ({preset: {size: summary}})
        results = {preset: sweep if "summary" in sweep else {"summary": sweep, "allocations": []}
                   for preset, sweep in kept["sweep"].items()}
        info["sweep_kept_from"] = kept["machine"].get("sweep_kept_from", kept["machine"])
    for preset in PRESETS if not args.crossover_only else ():
        summary, rows = sweep_subsets(Topology.preset(preset), list(SWEEP_SIZES), model=model, jobs=args.jobs,
                                      progress=lambda it, total: tqdm(it, total=total, desc=preset, file=sys.stderr,
                                                                      leave=False, disable=None))
        results[preset] = {"summary": {str(k): v for k, v in summary.items()}, "allocations": rows}
        print(preset, json.dumps(summary, indent=1), flush=True)
    crossovers = {}
    sizes = parse_sizes(CROSSOVER_SIZES)
    for preset in CROSSOVER_PRESETS:
        cross, rows = crossover(Topology.preset(preset), sizes, model)
        nccl_faster = [s for s, r in rows if r["blink"]["time_us"] >
                       min(r["nccl-ring"]["time_us"], r["nccl-dbtree"]["time_us"])]
        crossovers[preset] = {"crossover_bytes": cross, "nccl_faster_sizes": nccl_faster,
                              "rows": [{"size_bytes": s, "algorithms": r} for s, r in rows]}
        print(preset, "crossover", format_size(cross), flush=True)
    seconds = time.perf_counter() - start
    model_dict = {"latency_us": model.latency_us, "step_overhead_us": model.step_overhead_us,
                  "reduce_gbps": model.reduce_gbps, "channels": model.channels}
    with open(out + ".json", "w") as f:
        json.dump({"machine": info, "model": model_dict, "seconds": seconds, "sweep": results,
                   "crossover": crossovers}, f, indent=1)
    plot(results, crossovers, out + ".png")
    with open(out + ".md", "w") as f:
        f.write(markdown(results, crossovers, info, model_dict, seconds))
    print("wrote", out + ".{json,png,md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
