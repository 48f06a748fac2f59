"""Several GPU hosts, simulated and predicted: Blink's phases against NCCL's collectives.

No GPU runs here, and none of these numbers was checked against a multi-host run.

* ``multihost``: for each configuration (hosts x preset, NICs per host, NIC bandwidth)
  it plans the three phases of the allreduce (``jax_blink.planning.plan_hosts``) and
  simulates them beside NCCL's flat ring over all GPUs and its hierarchical tree
  (``jax_blink.sim.compare_hosts``) at each size, with nccl-tests' columns; ``speedup``
  is the faster NCCL algorithm's time over the three phases' time, in the same run. It
  also times planning 128 DGX-1Vs (1,024 GPUs) cold: in a fresh process, with an empty
  plan cache.
* ``across``: for each configuration (hosts x preset, its network bandwidth per host),
  collective and size, which path ``jax_blink.choice.across_hosts.across_hosts``
  predicts, as psum, psum_scatter and all_gather do at trace time: Blink's phases (the
  in-process reduce-scatter and/or all-gather tuned for the CUDA executor, with its
  measured costs, and NCCL across hosts by its tuner's model: three phases for the
  allreduce, two for the others) or NCCL's collective over every GPU (the same model).
  A size is the whole vector of each device, as NCCL counts it: the allreduce's and the
  reduce-scatter's input, the all-gather's output. Also the seconds each first decision
  took, with an empty plan cache.

    python benchmarks/bench_hosts.py multihost [--sizes 1M,256M] [--machine NAME] [--results DIR]
    python benchmarks/bench_hosts.py across [--sizes 4K 1M 64M 256M]
        [--collectives allreduce reduce_scatter allgather] [--machine NAME] [--results DIR]

Writes ``benchmarks/results/multihost_<machine>.{json,md}`` and
``across_hosts_<machine>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

#: (preset, hosts, NICs per host, GB/s per NIC): 4 x DGX-1V on one 100 Gb/s NIC each,
#: then DGX-1's real four 100 Gb/s NICs, and DGX A100s on eight 200 Gb/s NICs.
MULTIHOST_CONFIGS = [("dgx1-v100", 4, 1, 12.5), ("dgx1-v100", 4, 4, 12.5), ("dgx-a100", 4, 8, 25.0)]

#: (preset, hosts, network GB/s per host): 4 DGX-1Vs on one 100 Gb/s NIC each and on their
#: four, DGX A100s on eight 200 Gb/s NICs, HGX H100s on eight 400 Gb/s NICs.
ACROSS_CONFIGS = [("dgx1-v100", 4, 12.5), ("dgx1-v100", 4, 50.0), ("dgx-a100", 4, 200.0), ("hgx-h100", 4, 400.0)]
#: The collectives across_hosts predicts, and the lax collective each op runs instead.
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")
LAX = {"allreduce": "lax.psum", "reduce_scatter": "lax.psum_scatter", "allgather": "lax.all_gather"}

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
                             timeout=600, check=True, cwd=harness.ROOT)
    return json.loads(out.stdout)


def multihost(args) -> int:
    from jax_blink.cli.sizes import format_size, parse_sizes
    from jax_blink.planning import plan_hosts
    from jax_blink.sim import compare_hosts
    from jax_blink.topo import Topology

    sizes = parse_sizes(args.sizes)
    results = {"machine": harness.machine(name=args.machine), "configs": [], "cold_plan_1024_gpus": cold_plan_1024()}
    lines = [f"# Several hosts, simulated ({args.machine})", "",
             "`python benchmarks/bench_hosts.py multihost`; speedup = the faster NCCL algorithm's time / the "
             "three phases' time. Phases: in-host reduce-scatter + across hosts + in-host all-gather.", "",
             "| hosts | NICs | size | three-phase us (phases) | flat ring us | hierarchical tree us | speedup |",
             "|---|---|---|---|---|---|---|"]
    for preset, hosts, nics, gbps in MULTIHOST_CONFIGS:
        topology = Topology.multi_host(preset, hosts, nic_gbps=gbps, nics=nics)
        host_plan = plan_hosts(topology)
        config = {"topology": topology.name, "hosts": hosts, "nics": nics, "nic_gbps": gbps,
                  "network_gbps": host_plan.network_gbps, "bandwidth_rate_gbps": host_plan.rate_gbps, "rows": []}
        for size in sizes:
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
    out = Path(args.results) / f"multihost_{args.machine}"
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}.json and .md", file=sys.stderr)
    return 0


def across(args) -> int:
    from jax_blink.cli.sizes import format_size, parse_size

    sizes = [parse_size(s) for s in args.sizes]
    os.environ["JAX_BLINK_CACHE_DIR"] = tempfile.mkdtemp(prefix="jax_blink_across_hosts_")  # first decisions
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import cvxpy, networkx, scipy.optimize  # noqa: F401,E401  (imported before the timing)
    from jax_blink.choice import across_hosts as _hosts

    rows = []
    for collective in args.collectives:
        for preset, hosts, network in ACROSS_CONFIGS:
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
    info = harness.machine(name=args.machine)
    out = Path(args.results)
    (out / f"across_hosts_{args.machine}.json").write_text(json.dumps(
        {"machine": info, "commit": harness.RUN_COMMIT, "rows": rows}, indent=1) + "\n")
    lines = [f"# Collectives across GPU processes: predicted paths ({info['cpu']}, {info['cores']} cores)", "",
             f"`python benchmarks/bench_hosts.py across`, commit {harness.RUN_COMMIT}. float32 collectives over "
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="sub", required=True)

    def common(p):
        p.add_argument("--machine", default=None, help="the machine's name in the results files (default: this one's)")
        p.add_argument("--results", default=str(harness.RESULTS), help="the folder to write them to")

    mh = sub.add_parser("multihost", help="the three phases against NCCL's ring and tree, simulated")
    mh.add_argument("--sizes", default="1M,256M", help="bytes per GPU, comma-separated (1M,256M)")
    common(mh)
    mh.set_defaults(run=multihost)
    ac = sub.add_parser("across", help="the path psum and its kin predict across hosts")
    ac.add_argument("--sizes", nargs="+", default=["4K", "1M", "64M", "256M"])
    ac.add_argument("--collectives", nargs="+", default=list(COLLECTIVES), choices=list(COLLECTIVES))
    common(ac)
    ac.set_defaults(run=across)
    args = ap.parse_args(argv)
    args.machine = args.machine or harness.machine_tag()
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
