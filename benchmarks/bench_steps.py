"""Training steps on 8 virtual CPU devices, their collectives by jax_blink against lax's.

A user runs training steps, not isolated collectives: each subcommand times whole steps,
the variants interleaved in one process (``harness.interleaved``).

* ``mlp``: data-parallel MLPs and the ResNet of ``examples/flax_resnet.py``, their
  gradients summed by nothing, ``lax.psum`` or ``jax_blink.psum`` (one bucket, default
  buckets, once per leaf), and one step's timeline from a ``jax.profiler`` trace;
* ``fsdp``: a fully-sharded + tensor-parallel step on a 4 x 2 mesh, its all-gathers and
  reduce-scatters by jax_blink's drop-ins against lax's.

Each writes ``benchmarks/results/<name>_<machine>`` (``steps.{json,md}`` and
``step_timeline.png``; ``fsdp.json``), ``<machine>`` being this machine's tag
(``harness.machine_tag``) unless ``--machine`` names another. Run from the repository root,
on an otherwise idle machine:

    python benchmarks/bench_steps.py mlp [--rounds 9] [--no-resnet] [--out benchmarks/results] [--machine NAME]
    python benchmarks/bench_steps.py fsdp [--layers 9] [--width 256] [--batch 32] [--rounds 41] [--json OUT]
        [--machine NAME]
"""

from __future__ import annotations

import glob
import gzip
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

import harness

MLPS = [(8, 1024), (4, 2048), (16, 512), (4, 512), (8, 256)]


# --- mlp ---------------------------------------------------------------------------------

def load_example():
    path = harness.ROOT / "examples" / "flax_resnet.py"
    spec = importlib.util.spec_from_file_location("flax_resnet", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def resnet_steps(rounds, reps=5):
    """Median step time of the example's ResNet step under each way of summing its gradients."""
    import jax
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_blink
    from jax_blink import settings

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

    def train(name):
        def call():
            for _ in range(reps):  # training goes on (the step donates its state)
                params, opt, metrics = steps[name](*state[name], xb, yb)
                state[name] = (params, opt)
                jax.block_until_ready(metrics)
        return call

    times = harness.interleaved({name: train(name) for name in steps}, rounds)
    med = {k: float(np.median(v)) / reps * 1e3 for k, v in times.items()}
    return [{"model": "resnet (examples/flax_resnet.py)", "variant": k, "step_ms": v,
             "vs_none": v / med["none"], "vs_lax": v / med["lax.psum"], "collectives": calls[k]}
            for k, v in med.items()]


def trace_one_step(depth, width, trace_dir):
    """One profiled step of the MLP with default buckets; returns the trace file."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jax_blink.measure.timing import mlp_step

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


def steps_markdown(result):
    lines = [f"# Training steps with their gradients summed ({result['machine']['cpu']}, "
             f"{result['machine']['cores']} cores, {result['devices']})", "",
             f"`python benchmarks/bench_steps.py mlp`, commit {result['commit']}; median of "
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


def mlp(args) -> int:
    """Training steps with their gradients summed: no communication, lax.psum, jax_blink.

    On 8 virtual CPU devices this times, interleaved in one process:

    * data-parallel MLPs (as ``python -m jax_blink bench --steps``: the 8 x 1024 x 1024 MLP
      with batch 64 per device and other shapes): gradients from ``jax.grad`` summed by
      nothing, ``lax.psum``, ``jax_blink.psum`` in one bucket, ``jax_blink.psum`` with its
      default buckets, and ``jax_blink.psum`` called once per leaf (``jax.tree.map``, as
      code written for lax.psum often does: XLA merges lax's per-leaf all-reduces into one,
      it cannot merge jax_blink's custom calls);
    * the ResNet of ``examples/flax_resnet.py`` (AdamW, its own step function): no
      communication, ``lax.psum`` (JAX's implicit cast), ``jax_blink.pvary`` in one bucket
      and with its default buckets;

    and draws one step of the 8 x 1024 MLP from a ``jax.profiler`` trace: per device, XLA's
    compute and each bucket's collective, from its dispatch to its completion (the trace
    itself opens in Perfetto, https://ui.perfetto.dev).

    Writes ``steps_<machine>.{json,md}`` and ``step_timeline_<machine>.png`` into ``--out``."""
    try:  # before the runs, not after them: a bad --out is said at once
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        args.parser.error(f"--out {args.out}: {e.strerror or e}")
    harness.cpu_devices()
    import jax

    from jax_blink.choice import predict_cpu
    from jax_blink.measure.timing import PER_LEAF, STEP_VARIANTS, run_steps

    tag = args.machine or harness.machine_tag()
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
    result = {"machine": harness.machine(jax=jax.__version__), "devices": devices, "commit": harness.RUN_COMMIT,
              "rounds": args.rounds, "profile": profile, "rows": rows, "png": png,
              "timeline": {str(d): row for d, row in devices_tl.items()}}
    base = os.path.join(args.out, f"steps_{tag}")
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(steps_markdown(result))
    print(f"wrote {base}.json, {base}.md and {png}", file=sys.stderr)
    return 0


# --- fsdp --------------------------------------------------------------------------------

def make_fsdp_step(all_gather, mesh, layers):
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def loss(params, x):
        h = x
        for w in params:  # w: this device's (rows / data, columns / model) block
            full = all_gather(w, "data", axis=0, tiled=True)  # FSDP: the layer's rows
            h = jnp.tanh(h @ full)                             # this device's output columns
            h = all_gather(h, "model", axis=1, tiled=True)     # TP: every column
        return jnp.sum(h * h)

    def step(params, x):
        grads = jax.grad(loss)(params, x)  # the gathers' transposes: reduce-scatters
        return [w - 1e-3 * g for w, g in zip(params, grads)]

    specs = [P("data", "model")] * layers
    return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(specs, P("data")), out_specs=specs))


def fsdp(args) -> int:
    """A fully-sharded + tensor-parallel training step with small shards on a 4 x 2 mesh of
    CPU devices, its all-gathers and reduce-scatters by jax_blink's drop-ins against the
    same step with lax's, interleaved in one process.

    Each of ``--layers`` layers gathers its weight's rows over ``data`` (FSDP) and its
    activations' columns over ``model`` (tensor parallel); the backward pass transposes both
    into reduce-scatters: 4 collectives per layer. With this machine's profile the drop-ins
    choose per call between their plan and lax (:mod:`jax_blink.choice.decide`).

    Writes ``fsdp_<machine>.json`` (``--json``: elsewhere). Recorded as well:
    ``fsdp_recorded_defaults_*.json``, run with JAX_BLINK_PROFILE=defaults, where no
    measurement of the gathers and scatters exists."""
    harness.cpu_devices()
    import jax
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_blink

    tag = args.machine or harness.machine_tag()
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    rng = np.random.default_rng(0)
    params = [jax.device_put(rng.standard_normal((args.width, args.width)).astype(np.float32) / 16,
                             NamedSharding(mesh, P("data", "model"))) for _ in range(args.layers)]
    x = jax.device_put(rng.standard_normal((args.batch, args.width)).astype(np.float32),
                       NamedSharding(mesh, P("data")))
    steps = {k: make_fsdp_step(f, mesh, args.layers)
             for k, f in (("jax_blink", jax_blink.all_gather), ("lax", lax.all_gather))}
    out = {k: jax.block_until_ready(f(params, x)) for k, f in steps.items()}
    worst = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(out["jax_blink"], out["lax"]))
    calls = steps["jax_blink"].lower(params, x).as_text().count("jax_blink_collective")
    times = harness.interleaved({k: (lambda f=f: jax.block_until_ready(f(params, x))) for k, f in steps.items()},
                                args.rounds)
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    ratios = np.asarray(times["jax_blink"]) / np.asarray(times["lax"])  # per round
    profile = jax_blink.machine_profile()
    res = {"machine": harness.machine(), "tag": tag, "layers": args.layers, "width": args.width,
           "batch": args.batch, "rounds": args.rounds, "step_ms": med,
           "ratio": med["jax_blink"] / med["lax"], "paired_ratio_median": float(np.median(ratios)),
           "paired_ratio_iqr": [float(np.percentile(ratios, 25)), float(np.percentile(ratios, 75))],
           "jax_blink_calls_in_program": calls, "max_abs_difference": worst,
           "profile": None if profile is None else profile.named("1x8")}
    print(f"step: jax_blink {med['jax_blink']:.2f} ms, lax {med['lax']:.2f} ms, ratio {res['ratio']:.2f} "
          f"(paired median {res['paired_ratio_median']:.2f}, IQR {res['paired_ratio_iqr'][0]:.2f}-"
          f"{res['paired_ratio_iqr'][1]:.2f}); jax_blink calls in the program: {calls}; "
          f"largest difference from lax's step {worst:.2e}")
    path = Path(args.json or harness.RESULTS / f"fsdp_{tag}.json")
    path.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    parser, command = harness.subcommands(__doc__)

    p = command(mlp, "data-parallel MLPs and the example's ResNet, and one step's timeline")
    p.add_argument("--rounds", type=int, default=9, help="interleaved rounds (median)")
    p.add_argument("--out", default=str(harness.RESULTS), help="folder for the results files")
    p.add_argument("--no-resnet", action="store_true", help="the MLPs alone")
    p = command(fsdp, "an FSDP + tensor-parallel step on a 4 x 2 mesh")
    p.add_argument("--layers", type=int, default=9)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=41, help="interleaved rounds (median)")
    p.add_argument("--json", default=None, help="write the results JSON here instead")
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
