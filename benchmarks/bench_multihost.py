"""Several hosts, simulated: Blink's three-phase allreduce against NCCL's flat ring and hierarchical tree.

For each configuration (hosts x preset, NICs per host, NIC bandwidth) it
plans the three phases (``jax_blink.planning.plan_hosts``) and simulates them
beside NCCL's flat ring over all GPUs and its hierarchical tree
(``jax_blink.sim.compare_hosts``) at each size, with nccl-tests' columns;
the ratio ``speedup`` is the faster NCCL algorithm's time over the three
phases' time, in the same run. It also times planning 128 DGX-1Vs (1,024
GPUs) cold: in a fresh process, with an empty plan cache.

Writes ``benchmarks/results/multihost_<machine>.json`` and ``.md``.

Usage: ``python benchmarks/bench_multihost.py [--sizes 1M,256M] [--machine NAME]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _machine import machine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: (preset, hosts, NICs per host, GB/s per NIC): the issue's 4 x DGX-1V on one
#: 100 Gb/s NIC each, then DGX-1's real four 100 Gb/s NICs, and DGX A100s on
#: eight 200 Gb/s NICs.
CONFIGS = [("dgx1-v100", 4, 1, 12.5), ("dgx1-v100", 4, 4, 12.5), ("dgx-a100", 4, 8, 25.0)]

COLD_PLAN = """
import json, time
start = time.perf_counter()
from jax_blink.planning import plan_hosts
from jax_blink.topo import Topology
imported = time.perf_counter()
hp = plan_hosts(Topology.multi_host("dgx1-v100", 128, nic_gbps=12.5))
done = time.perf_counter()
print(json.dumps({"gpus": hp.topology.n, "hosts": len(hp.hosts), "import_s": imported - start,
                  "plan_s": done - imported, "plan_seconds_reported": hp.plan_seconds,
                  "rate_gbps": hp.rate_gbps}))
"""


def cold_plan_1024():
    """Plan 128 x dgx1-v100 in a fresh process with an empty plan cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "JAX_BLINK_CACHE_DIR": cache}
        out = subprocess.run([sys.executable, "-c", COLD_PLAN], env=env, capture_output=True, text=True,
                             timeout=600, check=True, cwd=ROOT)
    return json.loads(out.stdout)


def main() -> int:
    from jax_blink.cli.sizes import format_size, parse_sizes
    from jax_blink.planning import plan_hosts
    from jax_blink.sim import compare_hosts
    from jax_blink.topo import Topology

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=parse_sizes, default=[2**20, 2**28])
    parser.add_argument("--machine", default="amd-epyc-2core")
    args = parser.parse_args()
    results = {"machine": machine(name=args.machine), "configs": [], "cold_plan_1024_gpus": cold_plan_1024()}
    lines = [f"# Several hosts, simulated ({args.machine})", "",
             "`python benchmarks/bench_multihost.py`; speedup = the faster NCCL algorithm's time / the three "
             "phases' time. Phases: in-host reduce-scatter + across hosts + in-host all-gather.", "",
             "| hosts | NICs | size | three-phase us (phases) | flat ring us | hierarchical tree us | speedup |",
             "|---|---|---|---|---|---|---|"]
    for preset, hosts, nics, gbps in CONFIGS:
        topology = Topology.multi_host(preset, hosts, nic_gbps=gbps, nics=nics)
        host_plan = plan_hosts(topology)
        config = {"topology": topology.name, "hosts": hosts, "nics": nics, "nic_gbps": gbps,
                  "network_gbps": host_plan.network_gbps, "bandwidth_rate_gbps": host_plan.rate_gbps, "rows": []}
        for size in args.sizes:
            rows = compare_hosts(topology, size, host_plan=host_plan)
            config["rows"].append({"size_bytes": size, **rows})
            b = rows["blink-3phase"]
            phases = " + ".join(f"{t:.0f}" for t in b["phases_us"])
            lines.append(f"| {hosts} x {preset} | {nics} x {gbps:g} GB/s | {format_size(size)} | "
                         f"{b['time_us']:.0f} ({phases}) | {rows['nccl-ring']['time_us']:.0f} | "
                         f"{rows['nccl-tree']['time_us']:.0f} | {b['speedup']:.2f} |")
            print(lines[-1], flush=True)
        results["configs"].append(config)
    cold = results["cold_plan_1024_gpus"]
    lines += ["", f"Planning 128 x dgx1-v100 ({cold['gpus']} GPUs) cold, fresh process and empty plan cache: "
                  f"{cold['plan_s']:.1f} s (imports {cold['import_s']:.1f} s more)."]
    print(lines[-1])
    out = ROOT / "benchmarks" / "results" / f"multihost_{args.machine}"
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}.json and .md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
