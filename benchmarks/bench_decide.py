"""How long psum's trace-time decision takes on GPU topologies, with an empty and a warm cache.

On a GPU topology every allreduce call of a new size predicts NCCL (its tuner's model),
and where a schedule of ours might beat it plans (or loads the plan), tunes the plan's
lowering for the CUDA executor by simulation and simulates the baselines
(``jax_blink.choice.decide.decide``, what psum runs at trace time). This times that
decision for every preset's whole machine and for partial DGX-1 V100 allocations at
each size: first in a fresh process with an empty cache directory of its own (so
that every size pays for planning where it plans: the goal, 1 s), then in a second
fresh process that finds the plans, tuned choices and predictions on disk (the
decision's goal there: 10 ms). The libraries a process's first decision imports are
imported before the timing and timed apart. Nothing runs on a GPU: the decision is
pure Python (the platform is given as ``"gpu"``).

Writes ``benchmarks/results/decide_<machine>.{json,md}``, ``<machine>`` being this machine's
tag (``harness.machine_tag``) unless ``--machine`` names another.

Usage: ``python benchmarks/bench_decide.py [--sizes 1M 256M] [--machine NAME]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile

import harness

#: The topologies: every GPU preset's whole machine, and DGX-1 V100 allocations with and
#: without an NVLink ring (the case Blink is for).
TOPOLOGIES = [("dgx1-v100", None), ("dgx1-p100", None), ("dgx-a100", None), ("hgx-h100", None),
              ("dgx2", None), ("pcie", None), ("dgx1-v100", [0, 1, 2, 5]), ("dgx1-v100", [0, 1, 2, 3, 4]),
              ("dgx1-v100", [0, 3, 5, 6]), ("dgx1-v100", [0, 1, 2, 3, 4, 5])]

_CHILD = """
import json, sys, time
from jax_blink import Topology
from jax_blink.choice import decide
start = time.perf_counter()
import cvxpy, networkx, scipy.optimize  # what a process's first decision imports; timed apart
import jax
jax.devices()  # psum decides while tracing, its backend up: so does this (the machine's key reads it)
print(json.dumps({"imports_s": time.perf_counter() - start}), flush=True)
preset, gpus = sys.argv[1], json.loads(sys.argv[2])
topology = Topology.preset(preset) if gpus is None else Topology.preset(preset).subset(gpus)
for size in map(int, sys.argv[3:]):
    start = time.perf_counter()
    d = decide.decide(size // 4, "float32", topology.n, topology=topology, platform="gpu")
    print(json.dumps({"topology": topology.name, "size_bytes": size, "seconds": time.perf_counter() - start,
                      "uses_blink": d.uses_blink, "decision": d.text}), flush=True)
"""


def main() -> int:
    from jax_blink.cli.sizes import format_size, parse_size

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["1K", "1M", "16M", "64M", "256M"])
    parser.add_argument("--machine", default=None, help="name in the results files (default: this machine's tag)")
    args = parser.parse_args()
    sizes = [str(parse_size(s)) for s in args.sizes]
    rows, imports = [], []
    for (preset, gpus), size in itertools.product(TOPOLOGIES, sizes):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "JAX_BLINK_CACHE_DIR": cache, "JAX_PLATFORMS": "cpu"}
            for run in ("empty cache", "warm cache"):
                out = subprocess.run([sys.executable, "-c", _CHILD, preset, json.dumps(gpus), size],
                                     env=env, cwd=harness.ROOT, capture_output=True, text=True, check=True).stdout
                for line in out.splitlines():
                    row = {"run": run, **json.loads(line)}
                    if "imports_s" in row:
                        imports.append(row["imports_s"])
                        continue
                    rows.append(row)
                    print(f"{row['topology']:>22} {run}: {format_size(row['size_bytes']):>5} in "
                          f"{row['seconds']:7.3f} s, {'jax_blink' if row['uses_blink'] else 'lax.psum'}",
                          flush=True)
    commit = harness.RUN_COMMIT
    name = args.machine or harness.machine_tag()
    info = harness.machine(name=name)
    out = harness.RESULTS / f"decide_{name}"
    out.with_suffix(".json").write_text(json.dumps({"machine": info, "commit": commit, "imports_s": imports,
                                                               "rows": rows}, indent=1))
    lines = [f"# psum's decision time on GPU topologies ({info['cpu']}, {info['cores']} cores)", "",
             f"`python benchmarks/bench_decide.py`, commit {commit}. Seconds per new size, in a fresh "
             "process with an empty plan cache of its own (planning included where the decision plans), "
             "and again with the cache the first process left; "
             "the choice (jax_blink's schedule or lax.psum, NCCL) as psum makes it. The libraries a "
             "process's first decision imports (cvxpy, networkx, scipy) are imported, and jax's backend started "
             "(psum decides while tracing), before the timing: "
             f"{sorted(imports)[len(imports) // 2]:.2f} s (median), once per process.", "",
             "| topology | size | empty cache (s) | warm cache (s) | runs |", "|---|---|---|---|---|"]
    by = {}
    for r in rows:
        by.setdefault((r["topology"], r["size_bytes"]), {})[r["run"]] = r
    for (name, size), runs in by.items():
        cold, warm = runs["empty cache"], runs["warm cache"]
        lines.append(f"| {name} | {format_size(size)} | {cold['seconds']:.3f} | {warm['seconds']:.3f} | "
                     f"{'jax_blink' if cold['uses_blink'] else 'lax.psum (NCCL)'} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}.json and .md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
