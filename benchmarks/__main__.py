"""The benchmark runner: named suites, each of which runs its benchmarks, writes their
results under ``benchmarks/results/`` (named for this machine) and regenerates the tables
docs/performance.md quotes from them.

    python -m benchmarks list
    python -m benchmarks run --suite sim|cpu|processes|robustness|gpu [--only NAME] [--dry-run]
        [--budget SECONDS] [--out DIR]
    python -m benchmarks docs [--check] [--doc PATH]

Run a suite on an otherwise idle machine: every benchmark times jax_blink against its
baseline in the same run, and anything else running moves both. ``run`` exits non-zero
when a benchmark failed (its output says why); the tables of those that passed are
regenerated all the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import harness, tables

HERE = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Step:
    """One benchmark of a suite: ``python benchmarks/<script> <args>`` (``{tag}`` in an
    argument: this machine's :func:`harness.machine_tag`; ``{gpu}``: its GPU's,
    :func:`gpu_record.gpu_tag`; ``{out}``: the run's folder for what a later step collects,
    ``run --out``), writing ``outputs`` (results files, named likewise: the first always, the
    others where the run gave them data) within ``timeout_s`` seconds."""
    script: str
    args: tuple = ()
    outputs: tuple = ()
    timeout_s: int = 1800
    env: tuple = ()  # (name, value) pairs
    label: str = ""  # the name, where the script and its first argument do not tell steps apart

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        return " ".join([self.script.rsplit(".", 1)[0], *self.args[:1]]) if self.args[:1] and not \
            self.args[0].startswith("-") else self.script.rsplit(".", 1)[0]

    def command(self, tags: dict) -> list:
        runner = ["bash"] if self.script.endswith(".sh") else [sys.executable]
        return runner + [str(HERE / self.script), *(a.format(**tags) for a in self.args)]


R = "benchmarks/results/"


def _cuda(name: str, *args: str) -> Step:
    """A run of bench_cuda.py, named ``name``, whose results gpu_record.py collects from the
    run's folder (``bench_cuda_<name>.json``)."""
    return Step("bench_cuda.py", ("--out", f"{{out}}/bench_cuda_{name}.json", *args),
                outputs=(f"{{out}}/bench_cuda_{name}.json",), timeout_s=180, label=name,
                env=(("JAX_PLATFORMS", "cuda,cpu"),))

#: The suites. A step's outputs are the results files its tables in docs/performance.md
#: are made from; after a suite, the markers that quote another machine's copy of one
#: point at this machine's.
SUITES = {
    # the planner, the simulator and trace-time decisions: pure Python, any machine
    "sim": (
        Step("bench_planner.py", outputs=(R + "planner_{tag}.md",)),
        Step("bench_topologies.py", ("baselines",), outputs=(R + "blink_vs_baselines_{tag}.md",),
             timeout_s=3600),  # about 20 minutes on 2 cores
        Step("bench_topologies.py", ("asymmetric",), outputs=(R + "asymmetric_{tag}.md",)),
        Step("bench_topologies.py", ("damaged",), outputs=(R + "damaged_{tag}.md",)),
        Step("bench_simulator.py", ("fidelity",), outputs=(R + "sim_fidelity_{tag}.md",)),
        Step("bench_decide.py", outputs=(R + "decide_{tag}.md",)),
    ),
    # 8 CPU devices in one process: a fresh full calibration first, which every later
    # benchmark's psum chooses from
    "cpu": (
        Step("calibrate", outputs=(R + "profile_{tag}.json",)),
        Step("bench_cpu.py", ("psum",), outputs=(R + "psum_cpu_{tag}.json",)),
        Step("bench_cpu.py", ("collectives",),
             outputs=(R + "collectives_cpu_{tag}.md", R + "collectives_cpu_{tag}.json")),
        Step("bench_cpu.py", ("executor",), outputs=(R + "executor_cpu_{tag}.json",)),
        Step("bench_steps.py", ("mlp",), outputs=(R + "steps_{tag}.md",)),
        Step("bench_steps.py", ("fsdp",), outputs=(R + "fsdp_{tag}.json",)),
        Step("bench_simulator.py", ("vs_real",), outputs=(R + "sim_vs_real_{tag}.md",)),
    ),
    # processes of one host (the host transport) and across hosts
    "processes": (
        Step("bench_processes.py", ("host_transport",), outputs=(R + "host_transport_{tag}.json",)),
        # the reductions and the broadcast apart: docs/performance.md quotes them in two tables
        Step("bench_processes.py", ("multiprocess", "--ops", "psum", "psum_scatter", "all_gather"),
             outputs=(R + "multiprocess_{tag}.json",)),
        Step("bench_processes.py", ("multiprocess", "--ops", "broadcast", "--json", R + "multiprocess_broadcast_{tag}.json"),
             outputs=(R + "multiprocess_broadcast_{tag}.json",)),
        Step("bench_hosts.py", ("multihost",), outputs=(R + "multihost_{tag}.md", R + "multihost_{tag}.json")),
        Step("bench_hosts.py", ("across",), outputs=(R + "across_hosts_{tag}.md", R + "across_hosts_{tag}.json")),
    ),
    # late ranks, faults, soaks and the calibration's verdicts under noise
    "robustness": (
        Step("bench_profile_robustness.py", outputs=(R + "quick_profiles_{tag}.json",)),
        # every part: the late rank in-process, nobody late, deeper trees, processes, the MLP steps early
        # against barrier, and the training step with a late device
        Step("bench_stragglers.py", ("--step", "--punctual", "--topologies", "--processes", "--mlps"),
             outputs=(R + "stragglers_{tag}.md", R + "stragglers_{tag}.json"), timeout_s=3600),
        Step("soak.py", ("devices",), outputs=(R + "soak_{tag}.json",)),
        Step("soak.py", ("host", "--jobs", "12"), outputs=(R + "host_soak_{tag}.json",)),
        Step("faults.py", ("timeouts",), outputs=(R + "timeouts_{tag}.json",)),
        Step("faults.py", ("processes",), outputs=(R + "multiprocess_faults_{tag}.json",)),
    ),
    # an NVIDIA GPU: the stress of both executors, the executors side by side, the allreduce
    # and CUDA IPC runs, and gpu_record.py, which collects them (and the tests gpu_check.sh
    # ran into the same folder) into the results files. benchmarks/gpu_check.sh calls these
    # steps as its benchmark stages, within a lease's budget.
    "gpu": (
        *(Step("gpu_stress.py", ("--processes", "4", "8", "--seconds", "25", "--grace", "60", "--executor",
                                 executor, "--out", f"{{out}}/gpu_stress_{executor}.json"),
               outputs=(f"{{out}}/gpu_stress_{executor}.json",), timeout_s=170, label=f"stress {executor}")
          for executor in ("stream", "device")),
        # both executors side by side, three runs for the 1 MB spread
        *(_cuda(f"executors{run}", "--mbytes", "1", "16", "256", "--executors", "stream", "device")
          for run in ("", "_run2", "_run3")),
        _cuda("f32", "--chunks", "1", "2", "4", "8", "16", "32"),
        _cuda("f32_planner"),
        _cuda("bf16", "--dtype", "bfloat16"),
        _cuda("f32_staged", "--staged"),
        # 1 MB is host-bound: three runs, for the executor's cost model (tests/test_cost_model.py)
        *(_cuda(f"1mb{run}", "--mbytes", "1", "--chunks", "1", "2", "4", "8") for run in ("", "_run2", "_run3")),
        _cuda("16mb", "--mbytes", "16", "--chunks", "1", "2", "4", "8", "16"),
        _cuda("hgx", "--preset", "hgx-h100"),
        Step("bench_cuda_ipc.py", ("--out", "{out}/bench_cuda_ipc.json"), outputs=("{out}/bench_cuda_ipc.json",),
             timeout_s=180, label="cuda_ipc"),
        Step("gpu_record.py", ("{out}",), timeout_s=120, label="record",
             outputs=(R + "gpu_check_{gpu}.json", R + "cuda_{gpu}.json", R + "cuda_ipc_{gpu}.json")),
    ),
}


def _calibrate(path: str) -> list:
    return [sys.executable, "-m", "jax_blink", "calibrate", "--out", path]


#: a step is not started with less than this left of ``run --budget``
MIN_STEP_S = 30


def run_suite(name: str, only=None, dry_run: bool = False, budget_s=None, out: str = "gpu_check_out") -> int:
    """Run suite ``name`` (the steps named in ``only``, or all), each within its timeout and
    what is left of ``budget_s``; regenerate the tables of the results files it wrote."""
    tags = {"tag": harness.machine_tag(), "gpu": _gpu() if name == "gpu" else "gpu", "out": out}
    steps = [s for s in SUITES[name] if only is None or s.name in only or s.script in only]
    if only and not steps:
        print(f"benchmarks: no step of suite {name} is named {' or '.join(only)}; "
              f"its steps: {', '.join(s.name for s in SUITES[name])}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    failed, written = [], {}
    deadline = None if budget_s is None else time.monotonic() + budget_s
    if not dry_run and any("{out}" in arg for s in steps for arg in s.args + s.outputs):
        (harness.ROOT / out).mkdir(parents=True, exist_ok=True)
    for step in steps:
        outputs = [o.format(**tags) for o in step.outputs]
        timeout_s = step.timeout_s if deadline is None else min(step.timeout_s, int(deadline - time.monotonic()))
        if timeout_s < MIN_STEP_S:
            print(f"benchmarks: {name}: {step.name}: skipped: {timeout_s} s of --budget {budget_s} left",
                  file=sys.stderr, flush=True)
            failed.append(step.name)
            continue
        if step.script == "calibrate":  # the profile every later step's psum reads
            command = _calibrate(outputs[0])
            env["JAX_BLINK_PROFILE"] = str(harness.ROOT / outputs[0])
        else:
            command = step.command(tags)
        print(f"benchmarks: {name}: {step.name}: {' '.join(command)}", flush=True)
        if dry_run:
            continue
        start, started = time.monotonic(), time.time()
        try:
            done = subprocess.run(command, cwd=harness.ROOT, env={**env, **dict(step.env)}, timeout=timeout_s)
            ok = done.returncode == 0
            why = f"exit {done.returncode}"
        except subprocess.TimeoutExpired:
            ok, why = False, f"killed after {timeout_s} s"
        fresh = [path for path in outputs
                 if (harness.ROOT / path).exists() and (harness.ROOT / path).stat().st_mtime >= started - 1]
        if ok and outputs and outputs[0] not in fresh:
            ok, why = False, f"wrote no {outputs[0]}"
        print(f"benchmarks: {name}: {step.name}: {'ok' if ok else 'FAILED (' + why + ')'} "
              f"in {time.monotonic() - start:.0f} s", flush=True)
        if not ok:
            failed.append(step.name)
        written.update((pattern, path) for pattern, path in zip(step.outputs, outputs) if path in fresh)
    if failed:
        print(f"benchmarks: {name}: failed: {', '.join(failed)}", file=sys.stderr)
    if dry_run or not written:
        return 1 if failed else 0
    machine = f"{os.cpu_count()}-core {harness.cpu_model()}"
    status = tables.refresh(retarget=_retarget(written),
                            runs={path: (harness.RUN_COMMIT, machine) for path in written.values()})
    return 1 if failed else status


def _gpu() -> str:
    """This machine's GPU, as gpu_check names its results (``h200``)."""
    from benchmarks.gpu_record import gpu_tag

    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        smi = ""
    return gpu_tag(smi)


def _retarget(written: dict) -> dict:
    """Markers to point at this run's files: each quoted source that is another machine's
    copy of a pattern this run wrote."""
    moves = {}
    for source in tables.sources():
        for pattern, out in written.items():
            head, tail = pattern.split("{", 1)[0], pattern.rsplit("}", 1)[-1]
            tag = source[len(head):len(source) - len(tail)]
            # (a machine's tag has no "_": multiprocess_{tag} is not multiprocess_broadcast_...)
            if source.startswith(head) and source.endswith(tail) and "_" not in tag and "/" not in tag \
                    and source != out:
                moves[source] = out
    return moves


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the suites and their steps")
    run = sub.add_parser("run", help="run a suite and regenerate its tables")
    run.add_argument("--suite", required=True, choices=sorted(SUITES))
    run.add_argument("--only", nargs="+", metavar="NAME", help="these steps alone (as `list` names them)")
    run.add_argument("--dry-run", action="store_true", help="print the commands; run nothing")
    run.add_argument("--budget", type=int, metavar="SECONDS",
                     help="the run's time: each step's timeout is cut to what is left, and a step with "
                          f"under {MIN_STEP_S} s left is skipped (and fails the run)")
    run.add_argument("--out", default="gpu_check_out", metavar="DIR",
                     help="the folder of what later steps collect (the gpu suite's; default gpu_check_out)")
    docs = sub.add_parser("docs", help="regenerate docs/performance.md's tables from the recorded results")
    docs.add_argument("--check", action="store_true", help="report tables that differ (exit 1); change nothing")
    docs.add_argument("--doc", type=Path, default=tables.DOC, help="the document (default: docs/performance.md)")
    args = parser.parse_args(argv)
    if args.command == "list":
        for name, steps in SUITES.items():
            print(f"{name}: " + ", ".join(s.name for s in steps))
        return 0
    if args.command == "docs":
        return tables.refresh(args.doc, args.check)
    return run_suite(args.suite, args.only, args.dry_run, args.budget, args.out)


if __name__ == "__main__":
    sys.exit(main())
