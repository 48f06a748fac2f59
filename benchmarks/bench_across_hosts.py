"""Collectives across GPU processes: which path the model takes, Blink's phases or NCCL over all GPUs.

For each configuration (hosts x preset, its network bandwidth per host), collective
and size, ``jax_blink.choice.across_hosts.across_hosts`` predicts, as psum, psum_scatter and
all_gather do at trace time, Blink's phases (the in-process reduce-scatter and/or
all-gather tuned for the CUDA executor, with its measured costs, and NCCL across
hosts by its tuner's model: three phases for the allreduce, two for the others)
and NCCL's collective over every GPU (the same model), and the op runs the faster.
A size is the whole vector of each device, as NCCL counts it: the allreduce's and
the reduce-scatter's input, the all-gather's output. These are
predictions: no GPU runs here, and none of them was checked against a multi-host
run (none was available). Also prints the seconds each first decision took, with
an empty plan cache.

Writes ``benchmarks/results/across_hosts_<machine>.{json,md}``.

Usage: ``python benchmarks/bench_across_hosts.py [--sizes 4K 1M 64M 256M]
[--collectives allreduce reduce_scatter allgather] [--machine NAME]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from _machine import RUN_COMMIT, machine

ROOT = Path(__file__).resolve().parent.parent

#: (preset, hosts, network GB/s per host): 4 DGX-1Vs on one 100 Gb/s NIC each and on their
#: four, DGX A100s on eight 200 Gb/s NICs, HGX H100s on eight 400 Gb/s NICs.
CONFIGS = [("dgx1-v100", 4, 12.5), ("dgx1-v100", 4, 50.0), ("dgx-a100", 4, 200.0), ("hgx-h100", 4, 400.0)]
#: The collectives across_hosts predicts, and the lax collective each op runs instead.
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")
LAX = {"allreduce": "lax.psum", "reduce_scatter": "lax.psum_scatter", "allgather": "lax.all_gather"}


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from jax_blink.cli.sizes import format_size, parse_size

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["4K", "1M", "64M", "256M"])
    parser.add_argument("--collectives", nargs="+", default=list(COLLECTIVES),
                        choices=list(COLLECTIVES))
    parser.add_argument("--machine", default="amd-epyc-2core")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes]
    os.environ["JAX_BLINK_CACHE_DIR"] = tempfile.mkdtemp(prefix="jax_blink_across_hosts_")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import cvxpy, networkx, scipy.optimize  # noqa: F401,E401  (imported before the timing)
    from jax_blink.choice import across_hosts as _hosts

    rows = []
    for collective in args.collectives:
        for preset, hosts, network in CONFIGS:
            os.environ["JAX_BLINK_NETWORK_GBPS"] = str(network)
            for size in sizes:
                # each device's input: the whole vector, but for the all-gather one GPU's block of it
                count = size // 4 // (hosts * 8 if collective == "allgather" else 1)
                start = time.perf_counter()
                lax_faster, why = _hosts.across_hosts([(count, "float32")], hosts, 8, collective=collective,
                                                      topology=preset)
                seconds = time.perf_counter() - start
                ours = float(re.search(r"(?:three|two) phases ([0-9.e+]+) us", why).group(1))
                lax = float(re.search(r"GPUs ([0-9.e+]+) us", why).group(1))
                parts = re.search(r"us \(([^)]*)\), NCCL", why).group(1).split(", ")
                phases = {label.rsplit(" ", 1)[0]: float(label.rsplit(" ", 1)[1]) for label in parts}
                rows.append({"collective": collective, "preset": preset, "hosts": hosts,
                             "network_gbps": network, "size_bytes": size, "phases_total_us": ours,
                             "phases_us": phases, "nccl_us": lax,
                             "runs": f"{LAX[collective]} (NCCL)" if lax_faster else "jax_blink's phases",
                             "decision_s": seconds})
                print(f"{collective} {hosts} x {preset} {network:g} GB/s {format_size(size):>5}: phases "
                      f"{ours:9.1f} us, NCCL {lax:9.1f} us -> {rows[-1]['runs']} ({seconds:.2f} s)", flush=True)
    info = machine(name=args.machine)
    out = ROOT / "benchmarks" / "results"
    (out / f"across_hosts_{args.machine}.json").write_text(json.dumps(
        {"machine": info, "commit": RUN_COMMIT, "rows": rows}, indent=1) + "\n")
    lines = [f"# Collectives across GPU processes: predicted paths ({info['cpu']}, {info['cores']} cores)", "",
             f"`python benchmarks/bench_across_hosts.py`, commit {RUN_COMMIT}. float32 collectives over "
             "hosts of 8 GPUs, each a process, as `jax_blink.choice.across_hosts.across_hosts` predicts them "
             "(predictions, not measurements): jax_blink's phases (in-process reduce-scatter, NCCL's "
             "collective across the hosts, in-process all-gather; the reduce-scatter has no all-gather "
             "and the all-gather no reduce-scatter) against NCCL's collective over all GPUs. A size is "
             "each device's whole vector (the all-gather's output). Decision seconds with an empty plan "
             "cache.", "",
             "| collective | hosts | network per host | size | phases us (reduce-scatter + across + all-gather) "
             "| NCCL over all GPUs us | runs | decision s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["phases_us"]
        split = " + ".join(f"{p[k]:.4g}" if k in p else "-" for k in
                           ("in-process reduce-scatter", f"across {r['hosts']} hosts", "all-gather"))
        lines.append(f"| {r['collective']} | {r['hosts']} x {r['preset']} | {r['network_gbps']:g} GB/s "
                     f"| {format_size(r['size_bytes'])} | {r['phases_total_us']:.4g} ({split}) | {r['nccl_us']:.4g} "
                     f"| {r['runs']} | {r['decision_s']:.2f} |")
    (out / f"across_hosts_{args.machine}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
