"""Collects what ``benchmarks/gpu_check.sh`` left in its output folder into one results
file, ``benchmarks/results/gpu_check_<gpu>.json``, the file the GPU goal tables read:

* ``stress``: per executor and process count, the calls, the wrong elements, the calls
  that failed, and for the device executor the fresh executors whose first call was
  checked (``gpu_stress_<executor>.json``);
* ``executors``: the stream and device executors side by side at each size per rank,
  the median time of each over the runs of ``bench_cuda_executors*.json``;
* ``suite``: the jax the image has, and the suite's passed, failed and skipped counts
  (``suite.log``, ``suite_gpu_env.log``).

The ``bench`` stage's allreduce runs (``bench_cuda_<name>.json``) go to
``benchmarks/results/cuda_<gpu>.json`` (``runs``, by name: the table docs/performance.md
quotes) and its CUDA IPC run (``bench_cuda_ipc.json``) to ``cuda_ipc_<gpu>.json``.

Sections missing from the folder keep what the results file already holds, so the
check's two calls (see gpu_check.sh) each add their part. It commits nothing. It is the
gpu suite's last step (``python -m benchmarks run --suite gpu``), which regenerates the
tables after it.

    python benchmarks/gpu_record.py OUTDIR [--results benchmarks/results]
    python benchmarks/gpu_record.py OUTDIR --describe   # machine.txt and commit.txt alone
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def gpu_tag(machine_txt: str) -> str:
    """``h200`` for "NVIDIA H200, 143771 MiB, ..." and ``h100`` for "NVIDIA H100 80GB HBM3, ..."
    (nvidia-smi's first CSV row: the model after the vendor), ``gpu`` where there is none."""
    for line in machine_txt.splitlines():
        words = line.split(",")[0].split()
        if len(words) >= 2 and words[0] in ("NVIDIA", "Tesla"):
            return re.sub(r"[^a-z0-9]+", "-", words[1].lower()).strip("-") or "gpu"
    return "gpu"


def pytest_counts(log: str) -> dict:
    """passed, failed, skipped and errors from pytest's closing line (0 where absent)."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    lines = [ln for ln in log.splitlines() if re.search(r"\b(passed|failed|error)", ln)]
    if not lines:
        return counts
    for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?)", lines[-1]):
        counts["errors" if what.startswith("error") else what] = int(n)
    return counts


def stress(out: Path) -> list:
    rows = []
    for path in sorted(out.glob("gpu_stress_*.json")):
        doc = json.loads(path.read_text())
        for r in doc["rows"]:
            rows.append({"executor": doc.get("executor", "stream"), "processes": r["processes"],
                         "calls": r["calls"], "wrong_elements": r["wrong_elements"],
                         "wrong_calls": r["wrong_calls"], "errors": r.get("errors", 0),
                         "failed_processes": len(r["failures"]),
                         "fresh_executors": r.get("fresh_executors", 0)})
    return rows


def executors(out: Path) -> list:
    times: dict[tuple, list] = {}
    for path in sorted(out.glob("bench_cuda_executors*.json")):
        for r in json.loads(path.read_text())["allreduce"]:
            times.setdefault((r["bytes_per_rank"], r["executor"]), []).append(r["seconds"])
    rows = []
    for size in sorted({s for s, _ in times}):
        row = {"bytes_per_rank": size}
        for e in ("stream", "device"):
            if (size, e) in times:
                row[f"{e}_ms"] = statistics.median(times[(size, e)]) * 1e3
                row[f"{e}_runs"] = len(times[(size, e)])
        if "stream_ms" in row and "device_ms" in row:
            row["device_over_stream"] = row["device_ms"] / row["stream_ms"]
        rows.append(row)
    return rows


def suite(out: Path, machine_txt: str) -> dict | None:
    logs = {name: out / f"{name}.log" for name in ("suite", "suite_gpu_env")}
    if not any(p.exists() for p in logs.values()):
        return None
    jax = re.search(r"^jax (\S+) jaxlib (\S+)", machine_txt, re.M)
    res = {"jax": jax.group(1) if jax else "unknown", "jaxlib": jax.group(2) if jax else "unknown"}
    for name, path in logs.items():
        if path.exists():
            res[name] = pytest_counts(path.read_text())
    return res


def bench_runs(out: Path, results: Path, gpu: str, commit: str) -> list:
    """The ``bench`` stage's results into ``cuda_<gpu>.json`` (runs replaced by name, others
    kept) and ``cuda_ipc_<gpu>.json``; the paths written."""
    written = []
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("bench_cuda_*.json"))
            if not p.stem.startswith(("bench_cuda_executors", "bench_cuda_ipc"))}
    if runs:
        target = results / f"cuda_{gpu}.json"
        doc = json.loads(target.read_text()) if target.exists() else {}
        doc.setdefault("runs", {}).update(runs)
        doc["commit"] = commit
        target.write_text(json.dumps(doc, indent=1) + "\n")
        written.append(target)
    ipc = out / "bench_cuda_ipc.json"
    if ipc.exists():
        target = results / f"cuda_ipc_{gpu}.json"
        target.write_text(json.dumps({**json.loads(ipc.read_text()), "commit": commit}, indent=1) + "\n")
        written.append(target)
    return written


#: what describe() records of the machine: the GPU, its links, the compiler and the jax
MACHINE_COMMANDS = (
    ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,pci.bus_id", "--format=csv"],
    ["nvidia-smi", "topo", "-m"],
    ["nvcc", "--version"],
    [sys.executable, "-c", "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, "
                           "jax.devices())"],
)


def describe(out: Path) -> str:
    """Write ``machine.txt`` (MACHINE_COMMANDS' output; nvcc's last line) and ``commit.txt``
    (git's HEAD) into ``out``; the machine's text."""
    lines = []
    for command in MACHINE_COMMANDS:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
            text = (done.stdout + done.stderr).strip()
        except (OSError, subprocess.SubprocessError) as e:
            text = f"{command[0]}: {e}"
        lines.append(text.splitlines()[-1] if command[0] == "nvcc" and text else text)
    machine_txt = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "machine.txt").write_text(machine_txt)
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True,
                                timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    (out / "commit.txt").write_text((commit or "unknown") + "\n")
    return machine_txt


def record(out: Path, results: Path) -> Path:
    """Collect ``out`` into the results files (describing the machine first where no
    gpu_check call has); the gpu_check file's path."""
    machine_txt = (out / "machine.txt").read_text() if (out / "machine.txt").exists() else describe(out)
    target = results / f"gpu_check_{gpu_tag(machine_txt)}.json"
    doc = json.loads(target.read_text()) if target.exists() else {}
    commit = (out / "commit.txt").read_text().strip() if (out / "commit.txt").exists() else "unknown"
    sections = {"stress": stress(out), "executors": executors(out), "suite": suite(out, machine_txt)}
    for name, value in sections.items():
        if value:
            doc[name] = value
            doc.setdefault("commits", {})[name] = commit
    doc["machine"] = machine_txt.strip().splitlines()
    results.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(doc, indent=1) + "\n")
    bench_runs(out, results, gpu_tag(machine_txt), commit)
    return target


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--results", default=str(HERE / "results"))
    ap.add_argument("--describe", action="store_true",
                    help="only write OUTDIR/machine.txt and commit.txt, and print the machine")
    args = ap.parse_args(argv)
    if args.describe:
        print(describe(Path(args.outdir)), end="")
        return
    print("gpu_record: wrote", record(Path(args.outdir), Path(args.results)))


if __name__ == "__main__":
    main()
