"""psum across GPU processes: which path the model takes, Blink's three phases or NCCL over all GPUs.

For each configuration (hosts x preset, its network bandwidth per host) and size,
``jax_blink.ops.decide.across_hosts`` predicts, as psum does at trace time, the
three phases (the in-process reduce-scatter and all-gather tuned for the CUDA
executor, with its measured costs, and NCCL across hosts by its tuner's model)
and NCCL over every GPU (the same model), and psum runs the faster. These are
predictions: no GPU runs here, and none of them was checked against a multi-host
run (none was available). Also prints the seconds each first decision took, with
an empty plan cache.

Writes ``benchmarks/results/across_hosts_<machine>.{json,md}``.

Usage: ``python benchmarks/bench_across_hosts.py [--sizes 4K 1M 64M 256M] [--machine NAME]``
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


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from jax_blink.cli.sizes import format_size, parse_size

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["4K", "1M", "64M", "256M"])
    parser.add_argument("--machine", default="amd-epyc-2core")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes]
    os.environ["JAX_BLINK_CACHE_DIR"] = tempfile.mkdtemp(prefix="jax_blink_across_hosts_")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import cvxpy, networkx, scipy.optimize  # noqa: F401,E401  (imported before the timing)
    from jax_blink.ops import decide

    rows = []
    for preset, hosts, network in CONFIGS:
        os.environ["JAX_BLINK_NETWORK_GBPS"] = str(network)
        for size in sizes:
            start = time.perf_counter()
            lax_faster, why = decide.across_hosts([(size // 4, "float32")], hosts, 8, topology=preset)
            seconds = time.perf_counter() - start
            three = float(re.search(r"three phases ([0-9.e+]+) us", why).group(1))
            lax = float(re.search(r"GPUs ([0-9.e+]+) us", why).group(1))
            phases = [float(x) for x in re.search(r"reduce-scatter ([0-9.e+]+), across \d+ hosts ([0-9.e+]+), "
                                                  r"all-gather ([0-9.e+]+)", why).groups()]
            rows.append({"preset": preset, "hosts": hosts, "network_gbps": network, "size_bytes": size,
                         "three_phases_us": three, "phases_us": phases, "nccl_us": lax,
                         "runs": "lax.psum (NCCL)" if lax_faster else "three phases",
                         "decision_s": seconds})
            print(f"{hosts} x {preset} {network:g} GB/s {format_size(size):>5}: three phases {three:9.1f} us, "
                  f"NCCL {lax:9.1f} us -> {rows[-1]['runs']} ({seconds:.2f} s)", flush=True)
    info = machine(name=args.machine)
    out = ROOT / "benchmarks" / "results"
    (out / f"across_hosts_{args.machine}.json").write_text(json.dumps(
        {"machine": info, "commit": RUN_COMMIT, "rows": rows}, indent=1) + "\n")
    lines = [f"# psum across GPU processes: predicted paths ({info['cpu']}, {info['cores']} cores)", "",
             f"`python benchmarks/bench_across_hosts.py`, commit {RUN_COMMIT}. float32 allreduce over "
             "hosts of 8 GPUs, each a process, as `jax_blink.ops.decide.across_hosts` predicts it "
             "(predictions, not measurements); decision seconds with an empty plan cache.", "",
             "| hosts | network per host | size | three phases us (reduce-scatter + across + all-gather) "
             "| NCCL over all GPUs us | runs | decision s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["phases_us"]
        lines.append(f"| {r['hosts']} x {r['preset']} | {r['network_gbps']:g} GB/s | {format_size(r['size_bytes'])} "
                     f"| {r['three_phases_us']:.4g} ({p[0]:.4g} + {p[1]:.4g} + {p[2]:.4g}) | {r['nccl_us']:.4g} "
                     f"| {r['runs']} | {r['decision_s']:.2f} |")
    (out / f"across_hosts_{args.machine}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
