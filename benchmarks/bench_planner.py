"""Planner benchmark: optimality, ring speed-up, planning time and tree counts.

Checks, on every subset of 2..8 GPUs of ``dgx1-p100`` and ``dgx1-v100`` (247
each) and on every full preset, that the planned rate equals the certified
bound (relative 1e-6) for allreduce and for broadcast from every root, and
that it is never below the ring baseline; reports rate/ring, planning times
(cold, warm from the process cache, warm from the disk cache) and the tree
counts after minimisation, and how long lowering takes as the chunks grow. Writes ``benchmarks/results/planner_<machine>.json``
and a markdown summary next to it.

``<machine>``: this machine's tag (``harness.machine_tag``) unless ``--machine`` names another.

Usage: ``python benchmarks/bench_planner.py [--workers 2] [--machine NAME]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

import harness

RTOL = 1e-6
FULL_PRESETS = ["dgx1-p100", "dgx1-v100", "dgx2", "dgx-a100", "hgx-h100", "pcie", "shm:8"]


def _init_worker(cache_dir):
    os.environ["JAX_BLINK_CACHE_DIR"] = cache_dir
    import cvxpy  # noqa: F401  (import cost is not planning time)


def plan_case(case):
    """Plan one (preset, ranks, collective, root) case cold; return the measurements."""
    from jax_blink.planning import plan
    from jax_blink.topo import Topology

    preset, ranks, collective, root = case
    full = Topology.preset(preset)
    topology = full if ranks is None else full.subset(ranks)
    start = time.perf_counter()
    p = plan(topology, collective, root=root, cache=False)
    seconds = time.perf_counter() - start
    return {"preset": preset, "gpus": ranks, "collective": collective, "root": root,
            "family": p.family, "rate_gbps": p.rate_gbps, "bound_gbps": p.bound_gbps,
            "ring_rate_gbps": p.ring_rate_gbps, "trees": len(p.trees), "seconds": seconds,
            "link_kinds": list(p.link_kinds),
            "optimal": math.isclose(p.rate_gbps, p.bound_gbps, rel_tol=RTOL),
            "not_below_ring": p.rate_gbps >= p.ring_rate_gbps * (1 - RTOL)}


def subset_cases(preset):
    cases = []
    for k in range(2, 9):
        for ranks in itertools.combinations(range(8), k):
            ranks = list(ranks)
            cases.append((preset, ranks, "allreduce", None))
            cases += [(preset, ranks, "broadcast", r) for r in range(k)]
    return cases


def full_cases():
    from jax_blink.topo import Topology

    cases = []
    for preset in FULL_PRESETS:
        n = Topology.preset(preset).n
        cases.append((preset, None, "allreduce", None))
        cases += [(preset, None, "broadcast", r) for r in range(n)]
    return cases


def warm_times(cache_dir):
    """Median warm lookup times (process cache and disk cache) in seconds."""
    os.environ["JAX_BLINK_CACHE_DIR"] = cache_dir
    from jax_blink.planning import clear_memory_cache, plan
    from jax_blink.topo import Topology

    memory, disk = [], []
    for preset in ("dgx1-v100", "dgx1-p100", "dgx2", "shm:8"):
        for ranks in (None, [0, 1, 4, 5], [0, 2, 5]):
            t = Topology.preset(preset)
            t = t if ranks is None or preset == "dgx2" else t.subset(ranks)
            plan(t)  # fill both caches
            for _ in range(5):
                start = time.perf_counter()
                plan(t)
                memory.append(time.perf_counter() - start)
                clear_memory_cache()
                start = time.perf_counter()
                plan(t)
                disk.append(time.perf_counter() - start)
    return {"memory_median_s": statistics.median(memory), "memory_max_s": max(memory),
            "disk_median_s": statistics.median(disk), "disk_max_s": max(disk), "lookups": len(memory)}


def tree_counts():
    """Trees after minimisation per preset: allreduce at the optimum and at 99%, broadcast from 0."""
    from jax_blink.planning import plan
    from jax_blink.topo import Topology

    out = {}
    for preset in FULL_PRESETS:
        t = Topology.preset(preset)
        exact, near = plan(t, cache=False), plan(t, tolerance=0.01, cache=False)
        bcast = plan(t, "broadcast", root=0, cache=False)
        out[preset] = {"allreduce_family": exact.family, "allreduce_trees_optimal": len(exact.trees),
                       "allreduce_trees_99pct": len(near.trees), "allreduce_rate_99pct_gbps": near.rate_gbps,
                       "broadcast_trees": len(bcast.trees)}
    return out


def summarise(rows):
    def median(xs):
        return statistics.median(xs) if xs else None

    out = {}
    for preset in ("dgx1-p100", "dgx1-v100"):
        subset = [r for r in rows if r["preset"] == preset and r["gpus"] is not None]
        allreduce = [r for r in subset if r["collective"] == "allreduce"]
        with_ring = [r for r in allreduce if r["ring_rate_gbps"] > 0]
        ratios = [r["rate_gbps"] / r["ring_rate_gbps"] for r in with_ring]
        out[preset] = {
            "subsets": len(allreduce),
            "plans": len(subset),
            "optimal_plans": sum(r["optimal"] for r in subset),
            "plans_below_ring": sum(not r["not_below_ring"] for r in subset),
            "subsets_without_nvlink_ring": len(allreduce) - len(with_ring),
            "subsets_without_nvlink_connection": sum(r["link_kinds"] != ["nvlink"] for r in allreduce),
            "allreduce_rate_over_ring_geomean": math.exp(statistics.fmean(math.log(x) for x in ratios)),
            "allreduce_rate_over_ring_max": max(ratios),
            "allreduce_rate_over_ring_max_gpus": with_ring[ratios.index(max(ratios))]["gpus"],
            "cold_seconds_median": median([r["seconds"] for r in subset]),
            "cold_seconds_median_allreduce": median([r["seconds"] for r in allreduce]),
            "cold_seconds_max": max(r["seconds"] for r in subset),
        }
    full = [r for r in rows if r["gpus"] is None]
    out["full_presets"] = {
        preset: {
            "allreduce": next(
                {k: r[k] for k in ("family", "rate_gbps", "bound_gbps", "ring_rate_gbps", "trees", "seconds")}
                for r in full if r["preset"] == preset and r["collective"] == "allreduce"),
            "broadcast_all_roots_optimal": all(r["optimal"] for r in full
                                               if r["preset"] == preset and r["collective"] == "broadcast"),
            "broadcast_rate_gbps_root0": next(r["rate_gbps"] for r in full if r["preset"] == preset
                                              and r["collective"] == "broadcast" and r["root"] == 0),
            "cold_seconds_median": median([r["seconds"] for r in full if r["preset"] == preset]),
        } for preset in FULL_PRESETS}
    out["all_optimal"] = all(r["optimal"] for r in rows)
    out["none_below_ring"] = all(r["not_below_ring"] for r in rows)
    small = [r["seconds"] for r in rows if (r["gpus"] is not None or r["preset"] not in ("dgx2",))]
    out["cold_seconds_median_le8"] = median(small)
    out["cold_seconds_dgx2_max"] = max(r["seconds"] for r in full if r["preset"] == "dgx2")
    return out


def lowering_times():
    """Seconds to lower a plan with 125 and 1,000 chunks per tree (DGX-1 V100 over its fast
    links, and shm:8): linear lowering takes about 8x as long for 8x the chunks (a quadratic
    one took 130x), and ``chunks=10**6`` on shm:8 at 500,000 floats (clamped to what fits)."""
    from jax_blink.planning import plan
    from jax_blink.topo import Topology

    out = {}
    for name, p in (("dgx1-v100", plan(Topology.preset("dgx1-v100"), cache=False, links="fast")),
                    ("shm:8", plan(Topology.preset("shm:8"), cache=False))):
        times = {}
        for chunks in (125, 1000):
            count = len(p.trees) * chunks * 16  # room for every tree's chunks, 16 floats each at least
            start = time.perf_counter()
            p.lower(count * 4, "float32", chunks=chunks)
            times[chunks] = time.perf_counter() - start
        out[name] = {"seconds_125": times[125], "seconds_1000": times[1000], "ratio": times[1000] / times[125]}
    start = time.perf_counter()
    plan(Topology.preset("shm:8"), cache=False).lower(500_000 * 4, "float32", chunks=10**6)
    out["shm:8 chunks=1e6 at 500k floats"] = {"seconds": time.perf_counter() - start}
    return out


def markdown(result) -> str:
    s = result["summary"]
    lines = [f"# Planner benchmark on {result['machine']['cpu']} ({result['machine']['cores']} cores)", "",
             f"All plans optimal (rate == certified bound, rel {RTOL}): **{s['all_optimal']}**; "
             f"none below the ring baseline: **{s['none_below_ring']}**.", "",
             "| topology | subsets | plans | optimal | no NVLink ring | rate/ring geomean | rate/ring max |"
             " cold median (s) |", "|---|---|---|---|---|---|---|---|"]
    for preset in ("dgx1-p100", "dgx1-v100"):
        p = s[preset]
        lines.append(f"| {preset} | {p['subsets']} | {p['plans']} | {p['optimal_plans']} | "
                     f"{p['subsets_without_nvlink_ring']} | {p['allreduce_rate_over_ring_geomean']:.3f} | "
                     f"{p['allreduce_rate_over_ring_max']:.3f} ({p['allreduce_rate_over_ring_max_gpus']}) | "
                     f"{p['cold_seconds_median']:.3f} |")
    w = result["warm"]
    lines += ["", f"Planning time: median cold (<= 8 GPUs) {s['cold_seconds_median_le8']:.3f} s; "
              f"dgx2 (16 GPUs) cold max {s['cold_seconds_dgx2_max']:.3f} s; warm from the process cache "
              f"median {w['memory_median_s'] * 1e3:.3f} ms (max {w['memory_max_s'] * 1e3:.3f} ms), "
              f"from the disk cache median {w['disk_median_s'] * 1e3:.3f} ms (max {w['disk_max_s'] * 1e3:.3f} ms).",
              "", "| preset | allreduce family | allreduce GB/s (bound, ring) | trees at optimum | trees at 99% |"
              " broadcast GB/s | broadcast trees |", "|---|---|---|---|---|---|---|"]
    for preset, f in s["full_presets"].items():
        a, t = f["allreduce"], result["trees"][preset]
        lines.append(f"| {preset} | {a['family']} | {a['rate_gbps']:.4g} ({a['bound_gbps']:.4g}, "
                     f"{a['ring_rate_gbps']:.4g}) | {t['allreduce_trees_optimal']} | {t['allreduce_trees_99pct']} | "
                     f"{f['broadcast_rate_gbps_root0']:.4g} | {t['broadcast_trees']} |")
    low = result["lowering"]
    lines += ["", "Lowering 1,000 chunks per tree against 125 (8x the chunks; linear: about 8x the time): "
              + "; ".join(f"{k} {v['seconds_1000']:.2f} s / {v['seconds_125']:.2f} s = {v['ratio']:.1f}x"
                          for k, v in low.items() if "ratio" in v)
              + f"; shm:8 with chunks=10**6 at 500,000 floats {low['shm:8 chunks=1e6 at 500k floats']['seconds']:.1f} s."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--machine", default=None, help="name in the results files (default: this machine's tag)")
    args = parser.parse_args(argv)
    cache_dir = tempfile.mkdtemp(prefix="jax_blink_bench_")
    cases = subset_cases("dgx1-p100") + subset_cases("dgx1-v100") + full_cases()
    start = time.time()
    with ProcessPoolExecutor(args.workers, initializer=_init_worker, initargs=(cache_dir,)) as pool:
        rows = list(pool.map(plan_case, cases, chunksize=4))
    _init_worker(cache_dir)
    summary, warm, trees, lowering = summarise(rows), warm_times(cache_dir), tree_counts(), lowering_times()
    # the machine read only now: that imports jax, which the pool's forked workers need not inherit
    result = {"machine": harness.machine(workers=args.workers), "wall_seconds": time.time() - start,
              "summary": summary, "warm": warm, "trees": trees, "lowering": lowering, "cases": rows}
    out = harness.RESULTS / f"planner_{args.machine or harness.machine_tag()}.json"
    out.write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {out} ({result['wall_seconds']:.0f} s)")
    return 0 if result["summary"]["all_optimal"] and result["summary"]["none_below_ring"] else 1


if __name__ == "__main__":
    sys.exit(main())
