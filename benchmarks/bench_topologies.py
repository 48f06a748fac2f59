"""Blink's allreduce plans against the baselines on simulated GPU topologies.

Pure Python: nothing runs on a device, the numbers depend on the simulator's model
(default :class:`jax_blink.sim.SimModel`), not on this machine (except planning times).

* ``baselines``: every allocation of 2..8 GPUs of ``dgx1-v100`` and ``dgx1-p100`` against
  NCCL-style rings, trees and NCCL's own tuner model, and the crossover size per preset;
* ``asymmetric``: topologies whose links are faster one way than the other, where the
  planner's ``split`` family (reduce into a root, broadcast out of it over other trees)
  competes with the families that reduce and broadcast over the same trees;
* ``damaged``: DGX-1 machines with one or two NVLink pairs removed: the plan certified
  optimal on what is left, against NCCL's model of the same machine.

Each writes ``benchmarks/results/<name>_<machine>.{json,md}`` (``baselines``: named
``blink_vs_baselines``, with a ``.png``), ``<machine>`` being this machine's tag
(``harness.machine_tag``) unless ``--machine`` names another. Run from the repository root:

    python benchmarks/bench_topologies.py baselines [--jobs 2] [--crossover-only] [--machine NAME]
    python benchmarks/bench_topologies.py asymmetric [--count 24] [--machine NAME]
    python benchmarks/bench_topologies.py damaged [--pairs N] [--machine NAME]
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import sys
import time

import numpy as np

import harness

SIZE = 2**28  # the size every comparison but the crossover is made at


def geomean(values) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def nccl_ring_or_tree(algorithms: dict) -> float:
    """NCCL's choice among simulated baselines (``compare``'s rows): the faster of ring and
    double binary tree."""
    return min(algorithms["nccl-ring"]["time_us"], algorithms["nccl-dbtree"]["time_us"])


# --- baselines ---------------------------------------------------------------------------

SWEEP_PRESETS = ("dgx1-v100", "dgx1-p100")
SWEEP_SIZES = (2**20, 2**28)
#: Whole machines for the crossover (dgx2's 16 ranks make its large sizes slow to simulate).
CROSSOVER_PRESETS = ("dgx1-v100", "dgx1-p100", "dgx-a100", "hgx-h100", "pcie")
CROSSOVER_SIZES = "1K:256M:4"


def crossover(topology, sizes, model):
    """Smallest size of ``sizes`` from which Blink is never slower than NCCL (the
    faster of ring and double binary tree) at any larger size; ``inf`` if NCCL
    is faster at the largest size."""
    from jax_blink.sim import compare

    rows = [(size, compare(topology, size, "float32", model)) for size in sizes]
    slower = [i for i, (_, r) in enumerate(rows) if r["blink"]["time_us"] > nccl_ring_or_tree(r)]
    if not slower:
        return sizes[0], rows
    if slower[-1] + 1 == len(sizes):
        return math.inf, rows  # NCCL is predicted faster at the largest size
    return sizes[slower[-1] + 1], rows


def plot_baselines(results, crossovers, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from jax_blink.cli.sizes import format_size

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axes[0]
    for preset in SWEEP_PRESETS:
        if not results[preset].get("allocations"):  # a kept sweep whose rows were not recorded
            ax.text(0.5, 0.5 - 0.1 * SWEEP_PRESETS.index(preset), f"{preset}: per-allocation rows not kept",
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
    for ax, preset in zip(axes[1:], SWEEP_PRESETS):
        rows = crossovers[preset]["rows"]
        sizes = [r["size_bytes"] for r in rows]
        for name in rows[0]["algorithms"]:
            ax.plot(sizes, [r["algorithms"][name]["busbw_gbps"] for r in rows], marker="o", ms=2,
                    lw=2.5 if name == "blink" else 1.2, label=name)
        drawn = math.isfinite(crossovers[preset]["crossover_bytes"])
        if drawn:
            ax.axvline(crossovers[preset]["crossover_bytes"], color="k", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ticks = sizes[::2]
        ax.set_xticks(ticks)
        ax.set_xticklabels([format_size(s) for s in ticks], rotation=45)
        ax.set_xlabel("size per GPU")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{preset}, all 8 GPUs" + (" (dotted: crossover)" if drawn else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def baselines_markdown(results, crossovers, info, model, seconds):
    from jax_blink.cli.sizes import format_size

    lines = [
        "# Blink vs NCCL-style baselines (simulated)",
        "",
        f"Machine: {info['cpu']}, {info['cores']} cores, Python {info['python']} ({info['note']}). "
        f"Model: `SimModel({', '.join(f'{k}={v!r}' for k, v in model.items())})` "
        f"(per-kind latency defaults in `jax_blink.planning.cost.LATENCY_US`). "
        f"Run time {seconds / 60:.1f} min"
        + (" (the crossover only: the sweep is kept from the previous run, `--crossover-only`)"
           if "sweep_kept_from" in info else "")
        + ". Reproduce: `python benchmarks/bench_topologies.py baselines`.",
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
    for preset in SWEEP_PRESETS:
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
            return by_size[size]["blink"]["time_us"] / nccl_ring_or_tree(by_size[size])

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


def baselines(args) -> int:
    """Blink plans against NCCL-style baselines on every DGX-1 allocation (simulated).

    1. Over every allocation of 2..8 GPUs of ``dgx1-v100`` and ``dgx1-p100`` at 1 MB and
       256 MB: geometric mean and maximum speedup of the Blink plan (lowered by
       :func:`jax_blink.sim.tune`) over the NCCL-style ring baseline, and over the best
       baseline.
    2. How many allocations Blink is slower than any baseline, before and after the
       per-call fallback to ``lax.psum`` (NCCL: the faster of its ring and double binary
       tree), and than NCCL's own tuner model.
    3. The crossover size per preset (whole machine) below which ``lax.psum`` (as above) is
       predicted faster than Blink.

    Writes ``blink_vs_baselines_<machine>.{json,md,png}``."""
    from tqdm import tqdm

    from jax_blink.cli.sizes import format_size, parse_sizes
    from jax_blink.sim import SimModel, sweep_subsets
    from jax_blink.topo import Topology

    info = harness.machine(note="simulated: the numbers depend on the model, not on this machine")
    model = SimModel()
    out = harness.RESULTS / f"blink_vs_baselines_{args.machine or harness.machine_tag()}"
    start = time.perf_counter()
    results = {}
    if args.crossover_only:
        kept = json.loads(out.with_suffix(".json").read_text())
        # older files keep only the summaries ({preset: {size: summary}})
        results = {preset: sweep if "summary" in sweep else {"summary": sweep, "allocations": []}
                   for preset, sweep in kept["sweep"].items()}
        info["sweep_kept_from"] = kept["machine"].get("sweep_kept_from", kept["machine"])
    for preset in SWEEP_PRESETS if not args.crossover_only else ():
        summary, rows = sweep_subsets(Topology.preset(preset), list(SWEEP_SIZES), model=model, jobs=args.jobs,
                                      progress=lambda it, total: tqdm(it, total=total, desc=preset, file=sys.stderr,
                                                                      leave=False, disable=None))
        results[preset] = {"summary": {str(k): v for k, v in summary.items()}, "allocations": rows}
        print(preset, json.dumps(summary, indent=1), flush=True)
    crossovers = {}
    for preset in CROSSOVER_PRESETS:
        cross, rows = crossover(Topology.preset(preset), parse_sizes(CROSSOVER_SIZES), model)
        crossovers[preset] = {"crossover_bytes": cross,
                              "nccl_faster_sizes": [s for s, r in rows if r["blink"]["time_us"] > nccl_ring_or_tree(r)],
                              "rows": [{"size_bytes": s, "algorithms": r} for s, r in rows]}
        print(preset, "crossover", format_size(cross), flush=True)
    seconds = time.perf_counter() - start
    model_dict = {"latency_us": model.latency_us, "step_overhead_us": model.step_overhead_us,
                  "reduce_gbps": model.reduce_gbps, "channels": model.channels}
    out.with_suffix(".json").write_text(json.dumps({"machine": info, "model": model_dict, "seconds": seconds,
                                                    "sweep": results, "crossover": crossovers}, indent=1))
    plot_baselines(results, crossovers, out.with_suffix(".png"))
    out.with_suffix(".md").write_text(baselines_markdown(results, crossovers, info, model_dict, seconds))
    print(f"wrote {out}.{{json,png,md}}")
    return 0


# --- asymmetric --------------------------------------------------------------------------

def random_asymmetric(seed):
    """A random topology whose link directions differ: 5 to 8 ranks, a ring backbone plus
    random chords, each direction drawn independently from 5..40 GB/s; every third one with
    a PCIe-like switch at 12 GB/s up and 16 down."""
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
    chunking (``sim.tune_baseline``: the search Blink's plans get from ``sim.tune``), or None
    where the topology routes neither."""
    from jax_blink.sim import tune_baseline
    from jax_blink.topo import TopologyError

    times = []
    for name in ("nccl-ring", "nccl-dbtree"):
        try:
            times.append(tune_baseline(name, t, SIZE).result.time_s)
        except TopologyError:
            pass
    return min(times) if times else None


def asymmetric(args) -> int:
    """Allreduce over links faster one way than the other: the "split" family against the others.

    On ``--count`` random topologies whose links have a different bandwidth per direction
    (:func:`random_asymmetric`), and on DGX-1V allocations whose PCIe links carry 12 GB/s
    toward the CPU and 16 GB/s away from it, compares as planned rates (GB/s of algbw):

    * ``split``: ``plan(t)``, which plans the ``"split"`` family (reduce trees into a root,
      other broadcast trees out of it) where links are asymmetric and keeps it where it is
      faster;
    * ``tree``: the best of the families that reduce up and broadcast down the same trees
      (``plan(t, max_trees=64)``, which does not plan ``"split"``);
    * ``forestcoll``: reduce-scatter then all-gather, each planned on its own (ForestColl's
      directed packings), ``1 / (1/rs + 1/ag)``;

    and the split plan tuned and simulated at 256 MB against the tree plan and NCCL's choice
    (the faster of ring and double binary tree, where the topology routes them).

    Writes ``asymmetric_<machine>.{json,md}``."""
    from jax_blink.planning import plan
    from jax_blink.sim import tune

    name = args.machine or harness.machine_tag()
    topologies = [random_asymmetric(seed) for seed in range(args.count)]
    topologies += [dgx1v_asymmetric_pcie(g) for g in ([0, 1, 2, 5, 7], [0, 1, 4, 5], list(range(8)))]
    rows = []
    for t in topologies:
        start = time.perf_counter()
        split = plan(t, cache=False)
        plan_s = time.perf_counter() - start
        tree = plan(t, max_trees=64, cache=False)
        rs, ag = plan(t, "reduce_scatter", cache=False), plan(t, "allgather", cache=False)
        nccl = nccl_time(t)
        row = {"topology": t.name, "ranks": t.n, "switch": bool(t.switches), "family": split.family,
               "trees": len(split.trees), "plan_s": plan_s,
               "split_gbps": split.rate_gbps, "bound_gbps": split.bound_gbps, "tree_gbps": tree.rate_gbps,
               "forestcoll_gbps": 1 / (1 / rs.rate_gbps + 1 / ag.rate_gbps),
               "split_sim_us": tune(split, SIZE).result.time_s * 1e6,
               "tree_sim_us": tune(tree, SIZE).result.time_s * 1e6,
               "nccl_sim_us": None if nccl is None else nccl * 1e6}
        rows.append(row)
        print(json.dumps(row), flush=True)
    gains = [r["split_gbps"] / r["tree_gbps"] for r in rows]
    over_fc = [r["split_gbps"] / r["forestcoll_gbps"] for r in rows]
    sim_gain = [r["tree_sim_us"] / r["split_sim_us"] for r in rows]
    over_nccl = [r["nccl_sim_us"] / r["split_sim_us"] for r in rows if r["nccl_sim_us"]]
    summary = {"topologies": len(rows), "split_chosen": sum(r["family"] == "split" for r in rows),
               "planned_over_tree_geomean": geomean(gains), "planned_over_tree_max": max(gains),
               "planned_over_forestcoll_geomean": geomean(over_fc), "planned_over_forestcoll_min": min(over_fc),
               "sim_over_tree_geomean": geomean(sim_gain), "sim_over_tree_min": min(sim_gain),
               "sim_over_nccl_geomean": geomean(over_nccl), "sim_over_nccl_min": min(over_nccl),
               "certified": all(math.isclose(r["split_gbps"], r["bound_gbps"], rel_tol=1e-6) for r in rows)}
    print(json.dumps(summary), flush=True)
    lines = [f"# Allreduce over asymmetric links ({name})", "",
             "`python benchmarks/bench_topologies.py asymmetric`: planned rates (GB/s algbw) and simulated "
             "256 MB times (us, tuned lowering, default SimModel). `split` is `plan(t)`; `tree` the families "
             "that reduce and broadcast along the same trees; `forestcoll` reduce-scatter then all-gather; "
             "`nccl` the faster of ring and double binary tree. Planning time is this machine's.", "",
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
    out = harness.RESULTS / f"asymmetric_{name}"
    out.with_suffix(".json").write_text(json.dumps({"machine": harness.machine(name=name), "size_bytes": SIZE,
                                                    "rows": rows, "summary": summary}, indent=1))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}.json and .md", file=sys.stderr)
    return 0


# --- damaged -----------------------------------------------------------------------------

DAMAGED_PRESETS = ("dgx1-v100", "dgx1-p100")
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


def damaged_case(preset: str, removed: tuple) -> dict:
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


def damaged(args) -> int:
    """Allreduce on damaged DGX-1 machines: Blink's plan against NCCL's model, in the simulator.

    For each case, a DGX-1 preset with links removed (``Topology.without``: every link
    between the two GPUs of an NVLink pair, so a V100 pair with two NVLinks loses both):
    every single-pair failure of ``dgx1-v100`` and ``dgx1-p100`` (16 each) and every
    two-pair failure (120 each; ``--pairs N`` keeps the first N per preset, for a quick
    run). It plans the allreduce (``plan(t, cache=False)``, every link kind), checks that
    the rate equals the planner's certified bound (LP duality over the remaining links) and
    that no tree routes over a removed pair, lowers it at 256 MB with its default chunking,
    simulates it and compares it with NCCL's own tuner model on the same damaged machine
    (``jax_blink.sim.nccl.predict``: the faster of its ring and tree algorithms and
    protocols).

    The NVSwitch presets (``dgx-a100``, ``hgx-h100``) have one link per GPU, to the switch:
    removing one disconnects that GPU, so they have no failure a plan can route around.

    Writes ``damaged_<machine>.{json,md}``; exits 1 where a plan is not certified or routes
    over a removed pair."""
    from jax_blink.topo import Topology

    name = args.machine or harness.machine_tag()
    cases = []
    for preset in DAMAGED_PRESETS:
        pairs = nvlink_pairs(Topology.preset(preset))
        cases += [(preset, "one", (pair,)) for pair in pairs]
        cases += [(preset, "two", combo) for combo in list(itertools.combinations(pairs, 2))[:args.pairs]]
    rows = []
    for preset, failure, removed in cases:
        row = dict(damaged_case(preset, removed), failure=failure)
        rows.append(row)
        print(json.dumps(row), flush=True)
    groups = []
    for preset in DAMAGED_PRESETS:
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
    lines = [f"# Allreduce on damaged DGX-1 machines ({name})", "",
             "`python benchmarks/bench_topologies.py damaged`: every single NVLink-pair failure and every "
             "two-pair failure of the DGX-1 presets (`Topology.without`), allreduce planned over every link "
             "kind. `certified`: cases whose rate equals the certified bound; `use removed`: cases whose trees "
             "route over a removed pair; speedup: NCCL's tuner model time over Blink's simulated time at 256 MB "
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
    out = harness.RESULTS / f"damaged_{name}"
    out.with_suffix(".json").write_text(json.dumps({"machine": harness.machine(name=name), "size_bytes": SIZE,
                                                    "summary": summary, "groups": groups, "rows": rows},
                                                   indent=1) + "\n")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0 if summary["certified"] == summary["cases"] and summary["use_removed"] == 0 else 1


def main(argv=None) -> int:
    parser, command = harness.subcommands(__doc__)

    p = command(baselines, "every DGX-1 allocation against NCCL-style baselines, and the crossover sizes")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="simulating processes")
    p.add_argument("--crossover-only", action="store_true",
                   help="re-run only the crossover, keeping the sweep of the existing results file (the "
                        "sweep is the long part: about 20 minutes of the whole run on 2 cores)")
    p = command(asymmetric, "links faster one way than the other: the split family against the others")
    p.add_argument("--count", type=int, default=24, help="random topologies")
    p = command(damaged, "DGX-1 machines with NVLink pairs removed")
    p.add_argument("--pairs", type=int, default=None, help="two-pair failures per preset (default: all)")
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
