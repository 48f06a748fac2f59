"""How long psum's trace-time decision takes on a GPU topology, with an empty and a warm cache.

On GPU topologies every allreduce call of a new size plans (or loads the
plan), tunes the plan's lowering by simulation and simulates the baselines
(``jax_blink.ops.decide.decide``, what psum runs at trace time). This times
that decision for the preset's whole machine at each size, first in a fresh
process with an empty cache directory, then in a second fresh process that
finds the plan and the tuned choice on disk. Nothing runs on a GPU: the
decision is pure Python (the platform is given as ``"gpu"``).

Writes ``benchmarks/results/decide_<machine>.json``.

Usage: ``python benchmarks/bench_decide.py [--preset dgx1-v100] [--sizes 1M 256M] [--machine NAME]``
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

_CHILD = """
import json, sys, time
from jax_blink import Topology
from jax_blink.ops import decide
topology = Topology.preset(sys.argv[1])
for size in map(int, sys.argv[2:]):
    start = time.perf_counter()
    d = decide.decide(size // 4, "float32", topology.n, topology=topology, platform="gpu")
    print(json.dumps({"size_bytes": size, "seconds": time.perf_counter() - start, "decision": d.text}), flush=True)
"""


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from jax_blink.cli.sizes import parse_size

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="dgx1-v100")
    parser.add_argument("--sizes", nargs="+", default=["1M", "256M"])
    parser.add_argument("--machine", default="amd-epyc-2core")
    args = parser.parse_args()
    sizes = [str(parse_size(s)) for s in args.sizes]
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "JAX_BLINK_CACHE_DIR": cache, "JAX_PLATFORMS": "cpu"}
        for run in ("empty cache", "warm cache"):
            out = subprocess.run([sys.executable, "-c", _CHILD, args.preset, *sizes], env=env, cwd=ROOT,
                                 capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                row = {"run": run, **json.loads(line)}
                rows.append(row)
                print(f"{run}: {row['size_bytes']} B in {row['seconds']:.1f} s", flush=True)
    path = ROOT / "benchmarks" / "results" / f"decide_{args.machine}.json"
    path.write_text(json.dumps({"machine": machine(name=args.machine), "preset": args.preset, "rows": rows},
                               indent=1))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
