"""XLA CPU's thread pool (``PJRT_NPROC``): what it costs a training step, and when it deadlocks.

XLA's CPU client runs every device's executions on one pool of threads, ``PJRT_NPROC``
of them (default: the number of cores). Too few, and a program that queues many
asynchronous steps without blocking deadlocks its collectives (``lax.psum`` and
``jax_blink.psum`` alike; jax_blink's fail with a timeout error instead of hanging). Too
many, and the devices' programs all run at once on the cores, and every step is slower.

For each setting (XLA's default, :func:`jax_blink.settings.xla_cpu_threads` for the
devices, and 64, the value jax_blink recommended before), in a fresh process each,
the settings alternating ``--repeats`` times:

* **steps**: the data-parallel MLP steps of :func:`jax_blink.measure.timing.run_steps` (no
  communication, ``lax.psum``, ``jax_blink.psum``), interleaved, median over rounds;
* **queue**: ``--queue`` jitted steps summing four leaves over the devices (four jax_blink
  collectives, one lax all-reduce) dispatched without blocking, then one block, by ``lax.psum`` and by ``jax_blink.psum`` (in processes of
  their own, bounded by ``--queue-timeout`` seconds): ``ok``, or ``stuck``.

Writes ``benchmarks/results/xla_threads_<machine>.{json,md}``.

    python benchmarks/bench_xla_threads.py [--devices 8] [--repeats 3] [--rounds 7] [--queue 1000]
    python benchmarks/bench_xla_threads.py --queue-only --devices 4 --threads 6   # where it deadlocks
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _machine import machine, machine_tag

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jax_blink.settings import xla_cpu_threads  # noqa: E402  (imports no jax)

MODELS = ((8, 256), (4, 512))
VARIANTS = ("none", "lax.psum", "jax_blink")


def _env(devices: int, threads) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    env.pop("PJRT_NPROC", None)
    if threads is not None:
        env["PJRT_NPROC"] = str(threads)
    return env


def _child_steps(rounds: int) -> None:
    from jax_blink.measure.timing import run_steps

    rows, _ = run_steps(list(MODELS), rounds=rounds, variants=VARIANTS)
    print("RESULT " + json.dumps([{k: r[k] for k in ("model", "variant", "step_ms", "cpu_ms", "wrong")}
                                  for r in rows]), flush=True)


def _child_queue(which: str, count: int) -> None:
    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import jax_blink

    mesh = Mesh(np.array(jax.devices()), ("x",))
    n = len(jax.devices())
    # four leaves of 4 KB: four jax_blink collectives per step (a bucket each), one lax all-reduce
    total = ((lambda v: lax.psum(v, "x")) if which == "lax.psum"
             else (lambda v: jax_blink.psum(v, "x", bucket_bytes=4096)))
    step = jax.jit(jax.shard_map(lambda v: jax.tree.map(lambda t: t / n, total(v)), mesh=mesh,
                                 in_specs=P("x"), out_specs=P("x")))
    x = [jax.device_put(jnp.ones((n, 1024), jnp.float32), NamedSharding(mesh, P("x"))) for _ in range(4)]
    for _ in range(count):
        x = step(x)
    # sums of ones over n devices divided by n stay one: anything else is a wrong sum
    ok = all(bool(np.all(np.asarray(leaf) == 1.0)) for leaf in x)
    print("RESULT " + json.dumps({"ok": ok}), flush=True)


def _run(args: list, env: dict, timeout: float):
    """``(parsed RESULT or None, seconds, why)`` of this script run as a child."""
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - start, f"stuck (killed after {timeout:.0f} s)"
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        if done.returncode < 0:
            why = f"aborted (signal {-done.returncode})"
        else:
            errors = [ln for ln in done.stderr.splitlines() if "Error" in ln] or ["no output"]
            why = "error: " + errors[-1].replace("Error dispatching computation: ", "")[:300]
        return None, time.monotonic() - start, why
    return json.loads(line[len("RESULT "):]), time.monotonic() - start, ""


def measure(devices: int, repeats: int, rounds: int, queue: int, queue_timeout: float,
            threads=(), queue_only: bool = False) -> dict:
    settings = {"default": None, "recommended": xla_cpu_threads(devices), "64": 64}
    steps = {name: [] for name in settings}
    for r in range(0 if queue_only else repeats):
        order = list(settings) if r % 2 == 0 else list(settings)[::-1]
        for name in order:
            got, _, why = _run(["--child-steps", str(rounds)], _env(devices, settings[name]), 1800)
            if got is None:
                raise RuntimeError(f"steps with PJRT_NPROC {settings[name]}: {why}")
            if any(row["wrong"] for row in got):
                raise RuntimeError(f"wrong gradient sums with PJRT_NPROC {settings[name]}: {got}")
            steps[name].append(got)
            print(f"repeat {r + 1}/{repeats}: PJRT_NPROC {settings[name] or 'unset'} measured", file=sys.stderr)
    rows = []
    for name, pool in ({} if queue_only else settings).items():
        for depth, width in MODELS:
            for v in VARIANTS:
                ms = [row["step_ms"] for run in steps[name] for row in run
                      if row["model"] == f"{depth}x{width}" and row["variant"] == v]
                cpu = [row["cpu_ms"] for run in steps[name] for row in run
                       if row["model"] == f"{depth}x{width}" and row["variant"] == v]
                rows.append({"setting": name, "threads": pool, "model": f"{depth}x{width}", "variant": v,
                             "step_ms": statistics.median(ms), "cpu_ms": statistics.median(cpu),
                             "runs_ms": ms})
    base = {(r["model"], r["variant"]): r["step_ms"] for r in rows if r["setting"] == "default"}
    lax = {(r["setting"], r["model"]): r["step_ms"] for r in rows if r["variant"] == "lax.psum"}
    for r in rows:
        r["vs_default"] = r["step_ms"] / base[r["model"], r["variant"]]
        r["vs_lax"] = r["step_ms"] / lax[r["setting"], r["model"]]
    queues = []
    queued = {"recommended": settings["recommended"]} if queue_only else dict(settings)
    for name, threads in {**queued, **{str(t): t for t in threads}}.items():
        for which in ("lax.psum", "jax_blink"):
            got, seconds, why = _run(["--child-queue", which, str(queue)], _env(devices, threads),
                                     queue_timeout)
            state = "ok" if got is not None and got["ok"] else ("wrong" if got is not None else why)
            queues.append({"setting": name, "threads": threads, "collective": which, "queued": queue,
                           "result": state, "seconds": round(seconds, 1)})
            print(f"queue {which} PJRT_NPROC {threads or 'unset'}: {state}", file=sys.stderr)
    return {"devices": devices, "repeats": repeats, "rounds": rounds, "steps": rows, "queue": queues}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# XLA CPU's thread pool: {result['devices']} CPU devices on {m['cpu']}, {m['cores']} cores",
             "", f"Commit {m['commit']}; `python benchmarks/bench_xla_threads.py` ({result['repeats']} "
             f"processes per setting, alternating; {result['rounds']} rounds each).", "",
             "| PJRT_NPROC | model | none ms | lax.psum ms | jax_blink ms | none vs default | "
             "lax vs default | jax_blink / lax |", "|---|---|---|---|---|---|---|---|"]
    at = {(r["setting"], r["model"], r["variant"]): r for r in result["steps"]}
    for name in dict.fromkeys(r["setting"] for r in result["steps"]):
        for model in dict.fromkeys(r["model"] for r in result["steps"]):
            none, lax, blink = (at[name, model, v] for v in VARIANTS)
            label = "unset" if none["threads"] is None else str(none["threads"])
            lines.append(f"| {label} | {model} | {none['step_ms']:.1f} | {lax['step_ms']:.1f} | "
                         f"{blink['step_ms']:.1f} | {none['vs_default']:.2f} | {lax['vs_default']:.2f} | "
                         f"{blink['vs_lax']:.2f} |")
    lines += ["", f"{result['queue'][0]['queued']} steps queued without blocking:", "",
              "| PJRT_NPROC | collective | result | seconds |", "|---|---|---|---|"]
    for q in result["queue"]:
        lines.append(f"| {'unset' if q['threads'] is None else q['threads']} | {q['collective']} | "
                     f"{q['result']} | {q['seconds']} |")
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child-steps":
        return _child_steps(int(sys.argv[2]))
    if len(sys.argv) > 1 and sys.argv[1] == "--child-queue":
        return _child_queue(sys.argv[2], int(sys.argv[3]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--queue", type=int, default=1000)
    ap.add_argument("--queue-timeout", type=float, default=90.0)
    ap.add_argument("--threads", type=int, nargs="*", default=[],
                    help="more pool sizes to queue steps under (e.g. --devices 8 --threads 12)")
    ap.add_argument("--queue-only", action="store_true", help="no steps, and queue under the recommended pool and --threads only (nothing written)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    result = measure(args.devices, args.repeats, args.rounds, args.queue, args.queue_timeout,
                     args.threads, args.queue_only)
    result["machine"] = machine()
    print(markdown(result))
    if not (args.no_write or args.queue_only):
        out = Path(args.out) / f"xla_threads_{machine_tag()}"
        out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        out.with_suffix(".md").write_text(markdown(result))


if __name__ == "__main__":
    main()
