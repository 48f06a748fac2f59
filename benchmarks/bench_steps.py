"""Training steps with their gradients summed: no communication, lax.psum, jax_blink (issue 28).

A user runs training steps, not isolated collectives. On 8 virtual CPU
devices this times, interleaved in one process:

* data-parallel MLPs (``python -m jax_blink bench --steps``, the issue's
  8 x 1024 x 1024 MLP with batch 64 per device and other shapes): gradients
  from ``jax.grad`` summed by nothing, ``lax.psum``, ``jax_blink.psum`` in one
  bucket, ``jax_blink.psum`` with its default buckets, and ``jax_blink.psum``
  called once per leaf (``jax.tree.map``, as code written for lax.psum often
  does: XLA merges lax's per-leaf all-reduces into one, it cannot merge
  jax_blink's custom calls);
* the ResNet of ``examples/flax_resnet.py`` (AdamW, its own step function):
  no communication, ``lax.psum`` (JAX's implicit cast), ``jax_blink.pvary``
  in one bucket and with its default buckets;

and draws one step of the 8 x 1024 MLP from a ``jax.profiler`` trace: per
device, XLA's compute and each bucket's collective, from its dispatch to its
completion (``--png``; the trace itself opens in Perfetto,
https://ui.perfetto.dev).

    python benchmarks/bench_steps.py [--rounds 9] [--out benchmarks/results]
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
from jax_blink.settings import set_xla_cpu_threads  # imports no jax
set_xla_cpu_threads()  # XLA CPU\'s threads: twice the devices

import argparse
import glob
import gzip
import importlib.util
import json
import sys
import tempfile
import time

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_blink
from jax_blink import settings
from jax_blink.measure.timing import PER_LEAF, STEP_VARIANTS, mlp_step, run_steps
from _machine import RUN_COMMIT, machine, machine_tag

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MLPS = [(8, 1024), (4, 2048), (16, 512), (4, 512), (8, 256)]


def load_example():
    spec = importlib.util.spec_from_file_location("flax_resnet", os.path.join(ROOT, "examples", "flax_resnet.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def resnet_steps(rounds, reps=5):
    """Median step time of the example's ResNet step under each way of summing its gradients."""
    import optax
    from flax import nnx

    ex = load_example()
    n = jax.device_count()
    mesh = jax.make_mesh((n,), (ex.AXIS,))
    data = ex.load_data(0)
    xb, yb = next(ex.batches(data[0], data[2], 128, 0, 0))
    sharded = NamedSharding(mesh, P(ex.AXIS))
    xb, yb = jax.device_put(xb, sharded), jax.device_put(yb, sharded)
    one = settings.MAX_BUCKET_BYTES
    variants = {
        "none": ((lambda v, a: v, lambda p, a: p), False),
        "lax.psum": (ex.get_collectives("lax"), True),
        "jax_blink one bucket": ((lambda v, a: jax_blink.psum(v, a, bucket_bytes=one),
                                  lambda p, a: jax_blink.pvary(p, a, bucket_bytes=one)), True),
        "jax_blink": (ex.get_collectives("blink"), True),
    }
    steps, state = {}, {}
    for name, (collectives, check_vma) in variants.items():
        model = ex.ResNet(16, rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(model)
        tx = optax.adamw(1e-3)
        params = jax.device_put(params, NamedSharding(mesh, P()))
        opt = jax.device_put(tx.init(params), NamedSharding(mesh, P()))
        step = ex.make_train_step(graphdef, tx, collectives, mesh, n, check_vma=check_vma)
        steps[name] = step.lower(params, opt, xb, yb).compile()
        state[name] = (params, opt)
    calls = {k: f.as_text().count('custom_call_target="jax_blink_collective') for k, f in steps.items()}  # both targets
    times = {k: [] for k in steps}
    for _ in range(rounds):
        for name, f in steps.items():
            start = time.perf_counter()
            for _ in range(reps):  # training goes on (the step donates its state)
                params, opt, metrics = f(*state[name], xb, yb)
                state[name] = (params, opt)
                jax.block_until_ready(metrics)
            times[name].append((time.perf_counter() - start) / reps)
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    return [{"model": "resnet (examples/flax_resnet.py)", "variant": k, "step_ms": v,
             "vs_none": v / med["none"], "vs_lax": v / med["lax.psum"], "collectives": calls[k]}
            for k, v in med.items()]


def trace_one_step(depth, width, trace_dir):
    """One profiled step of the MLP with default buckets; returns the trace file."""
    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("data",))
    step, params = mlp_step(mesh, depth, width, "jax_blink")
    x = jax.device_put(jnp.ones((n * 64, width)), NamedSharding(mesh, P("data")))
    for _ in range(3):
        jax.block_until_ready(step(params, x))
    jax.profiler.start_trace(trace_dir)
    jax.block_until_ready(step(params, x))
    jax.profiler.stop_trace()
    return sorted(glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True))[-1]


def timeline(trace_file):
    """Per device: XLA's compute thunks ``(start, end)`` and each collective's
    ``(name, dispatched, completed)``, in ms from the step's first thunk.

    XLA's CPU runtime records each thunk it runs (with its device) and, for an
    asynchronous thunk, an ``end:`` event when the thunk's future completes.
    jax_blink's collectives end together on every device (no rank returns
    before all are done), so a collective's completion is the median of its
    ``end:`` events."""
    events = [e for e in json.load(gzip.open(trace_file))["traceEvents"] if e.get("ph") == "X"]
    thunks = [e for e in events if "hlo_op" in e.get("args", {})]  # one per thunk XLA ran
    t0 = min(e["ts"] for e in thunks)
    ends = {}
    for e in events:
        if e["name"].startswith("end: blink_collective"):
            ends.setdefault(e["name"][5:], []).append(e["ts"])
    devices = {}
    for e in thunks:
        d = int(e["args"]["device_ordinal"])
        row = devices.setdefault(d, {"compute": [], "collectives": []})
        start = (e["ts"] - t0) / 1e3
        if e["name"].startswith("blink_collective"):
            done = float(np.median(ends.get(e["name"], [e["ts"] + e["dur"]])))
            row["collectives"].append((e["name"], start, (done - t0) / 1e3))
        else:
            row["compute"].append((start, start + e["dur"] / 1e3))
    return devices


def plot_timeline(devices, title, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # buckets numbered in the order they were dispatched (median over devices)
    starts = {}
    for row in devices.values():
        for name, a, _ in row["collectives"]:
            starts.setdefault(name, []).append(a)
    names = sorted(starts, key=lambda n: float(np.median(starts[n])))
    colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(names)}
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(devices) + 1.6))
    for d, row in sorted(devices.items()):
        ax.broken_barh([(a, b - a) for a, b in row["compute"]], (d - 0.4, 0.35), color="0.45")
        for name, a, b in row["collectives"]:
            ax.broken_barh([(a, b - a)], (d + 0.02, 0.35), color=colors[name], alpha=0.85)
    ax.set_yticks(sorted(devices), [f"device {d}" for d in sorted(devices)])
    ax.invert_yaxis()
    ax.set_xlabel("ms from the step's first XLA thunk")
    ax.set_title(title, fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color="0.45")] + [plt.Rectangle((0, 0), 1, 1, color=colors[n])
                                                          for n in names]
    ax.legend(handles, ["XLA compute (thunks)"] + [f"bucket {i + 1}: dispatched .. summed"
                                                   for i in range(len(names))],
              fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(result):
    lines = [f"# Training steps with their gradients summed ({result['machine']['cpu']}, "
             f"{result['machine']['cores']} cores, {result['devices']})", "",
             f"`python benchmarks/bench_steps.py`, commit {result['commit']}; median of "
             f"{result['rounds']} interleaved rounds. `vs none`: step time over the step with no "
             "communication; `vs lax`: over the step whose gradients lax.psum sums. `calls`: "
             "jax_blink custom calls per step; `#wrong`: summed-gradient elements outside the "
             "summation-order bound (MLPs). psum's choices and buckets from "
             f"{result.get('profile', 'the recorded costs')}.", "",
             "| model | gradients summed by | step ms | CPU ms | vs none | vs lax | calls | #wrong |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        cpu = f"{r['cpu_ms']:.1f}" if "cpu_ms" in r else "-"
        wrong = str(r["wrong"]) if "wrong" in r else "-"
        lines.append(f"| {r['model']} | {r['variant']} | {r['step_ms']:.1f} | {cpu} | {r['vs_none']:.2f} | "
                     f"{r['vs_lax']:.2f} | {r['collectives']} | {wrong} |")
    lines += ["", f"One step of the 8 x 1024 MLP: ![timeline]({os.path.basename(result['png'])}) "
              "(gray: XLA's compute per device; colours: each bucket's collective from its "
              "dispatch to its sum)."]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    ap.add_argument("--no-resnet", action="store_true")
    args = ap.parse_args()
    try:  # before the runs, not after them: a bad --out is said at once
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        ap.error(f"--out {args.out}: {e.strerror or e}")
    tag = machine_tag()
    from jax_blink.choice import predict_cpu

    profile = predict_cpu.cpu_allreduce(4, devices=jax.device_count()).source
    print(f"# jax_blink (auto): psum's choices and buckets from {profile}")
    rows, devices = run_steps(MLPS, rounds=args.rounds, variants=STEP_VARIANTS + (PER_LEAF,))
    if not args.no_resnet:
        rows += resnet_steps(args.rounds)
    for r in rows:
        print(f"{r['model']:>34} {r['variant']:>22} {r['step_ms']:8.1f} ms  vs none {r['vs_none']:.2f}  "
              f"vs lax {r['vs_lax']:.2f}  calls {r['collectives']}")
    png = os.path.join(args.out, f"step_timeline_{tag}.png")
    with tempfile.TemporaryDirectory() as tmp:
        devices_tl = timeline(trace_one_step(8, 1024, tmp))
    plot_timeline(devices_tl, "one step of the 8 x 1024 MLP, gradients summed by jax_blink.psum "
                  "(default buckets), 8 CPU devices", png)
    commit = RUN_COMMIT
    result = {"machine": machine(jax=jax.__version__), "devices": devices, "commit": commit,
              "rounds": args.rounds, "profile": profile, "rows": rows, "png": png,
              "timeline": {str(d): row for d, row in devices_tl.items()}}
    base = os.path.join(args.out, f"steps_{tag}")
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(markdown(result))
    print(f"wrote {base}.json, {base}.md and {png}", file=sys.stderr)


if __name__ == "__main__":
    main()
