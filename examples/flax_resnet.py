"""Data-parallel ResNet training on scikit-learn's digits with jax_blink's collectives.

The lines that matter are in ``make_train_step``: the replicated parameters
go through ``jax_blink.pvary(params, "data")``, so that ``jax.grad`` sums
their gradients with ``jax_blink.psum`` (a plain JAX program leaves that sum
to XLA), and the metrics are summed with ``jax_blink.psum`` where a plain
program calls ``jax.lax.psum``. Everything else is an ordinary
flax (NNX) + optax training loop inside ``jax.jit(jax.shard_map(...))`` over a
1-D device mesh named ``"data"``.

Run it (8 virtual CPU devices unless GPUs are present)::

    python examples/flax_resnet.py --compare
    python examples/flax_resnet.py --compare --processes 2   # 2 processes x 4 devices

``--compare`` trains the same model from the same seed twice, once with
``jax_blink.psum`` and once with ``jax.lax.psum``, and reports the largest
difference between the two loss curves and the step times side by side
(compilation and the first, warm-up step excluded). The output directory gets
``loss_curves.png`` and ``results.json``.

Design notes
------------
* Normalisation is GroupNorm, not BatchNorm: BatchNorm's batch statistics
  would need a cross-device mean of their own (a second psum in the forward
  pass) to match single-device training; GroupNorm normalises each example
  on its own, so the gradients are the only thing that crosses devices.
* The parameters enter the shard_map replicated (``P()``). Under
  ``check_vma=True`` (the default) ``jax.grad`` of a per-device loss with
  respect to replicated parameters sums the gradients across the axis by
  itself: the transpose of the implicit cast to "varying" is a psum, XLA's.
  The blink run makes that cast explicit with ``jax_blink.pvary(params,
  "data")``, whose transpose is ``jax_blink.psum``: the gradients come out of
  ``jax.grad`` already summed along Blink's trees, with no psum call of our
  own. The lax run keeps JAX's implicit cast (``jax.lax.pcast`` would give
  the same program), so the two differ only in who sums the gradients.
* ``jax_blink.psum`` hands values under ``min_bytes`` to ``lax.psum``
  (default 0: only empty values): here both the gradients and the
  two-number metrics psum take the planned collective. The gradients are
  summed in buckets, last layers first (``bucket_bytes``, sized by the cost
  model), one collective each, so the first buckets travel while the
  backward pass computes the rest. The run prints ``jax_blink.explain()``.
* With ``--compare`` both models train in lockstep on the same batches, the
  blink and lax.psum steps alternating (and alternating who goes first), so
  that both step times are taken under the same machine load.
* ``--processes N`` runs N local processes of one ``jax.distributed`` job
  (``jax_blink.launch``: 127.0.0.1, gloo for the CPU collectives), 8/N CPU
  devices each, over the same 1-D mesh. The gradients' psum then spans
  processes of one host and runs as one schedule over their shared memory
  (jax_blink's host transport; across hosts it would take the hierarchical
  path); every process trains the same model and process 0 reports.
* The data split, the initialisation and the batch order depend only on
  ``--seed``, so the blink and lax.psum runs see exactly the same inputs;
  their loss curves differ only by floating-point summation order. Those
  last-bit differences stay at ~1e-7 for the first tens of steps and are
  then amplified by training to ~1e-3 (the same happens between lax.psum
  and an exact sum taken in reverse device order).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import sys
import time

from jax_blink import settings  # imports no jax


def _gpu_present() -> bool:
    """Best-effort check, before jax is imported, for a usable GPU platform."""
    platforms = os.environ.get("JAX_PLATFORMS", "").lower()
    if platforms:
        return any(p in platforms for p in ("cuda", "gpu", "rocm"))
    plugin = any(
        importlib.util.find_spec(name) is not None
        for name in ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin",
                     "jax_rocm7_plugin")
    )
    return plugin and (os.path.exists("/dev/nvidia0") or os.path.exists("/dev/kfd"))


def _configure_devices(n_cpu_devices: int = 8) -> None:
    """Ask XLA for virtual CPU devices. Must run before jax is imported.

    Leaves settings the user made alone, and does nothing when a GPU platform
    is present (the GPUs are used instead). PJRT_NPROC sizes XLA CPU's thread pool:
    twice the devices, so that queued executions cannot deadlock collectives, and no
    more, as more threads slow every step (docs/sharp_bits.md).
    """
    if _gpu_present():
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_force_host_platform_device_count={n_cpu_devices}"
        ).strip()
    settings.set_xla_cpu_threads()


_configure_devices()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from tqdm import tqdm  # noqa: E402

import jax_blink  # noqa: E402

AXIS = "data"
LABELS = {"blink": "jax_blink.psum", "lax": "jax.lax.psum"}


def get_collectives(which: str):
    """``(psum, cast)`` under comparison: jax_blink's psum and pvary (whose
    transpose is jax_blink.psum), or lax.psum and JAX's implicit cast of
    replicated values (whose transpose is XLA's psum)."""
    if which == "blink":
        return jax_blink.psum, jax_blink.pvary
    return jax.lax.psum, lambda params, axis: params


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------


def _groups(features: int) -> int:
    """Largest of 8, 4, 2, 1 that divides ``features``."""
    return next(g for g in (8, 4, 2, 1) if features % g == 0)


class ResidualBlock(nnx.Module):
    """Two 3x3 convs with GroupNorm, plus a (projected when needed) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(cin, cout, (3, 3), strides=stride, use_bias=False, rngs=rngs)
        self.norm1 = nnx.GroupNorm(cout, num_groups=_groups(cout), rngs=rngs)
        self.conv2 = nnx.Conv(cout, cout, (3, 3), use_bias=False, rngs=rngs)
        # Zero-init the last scale so each block starts as the identity.
        self.norm2 = nnx.GroupNorm(cout, num_groups=_groups(cout),
                                   scale_init=nnx.initializers.zeros, rngs=rngs)
        if stride != 1 or cin != cout:
            self.proj = nnx.Conv(cin, cout, (1, 1), strides=stride, use_bias=False, rngs=rngs)
            self.proj_norm = nnx.GroupNorm(cout, num_groups=_groups(cout), rngs=rngs)
        else:
            self.proj = self.proj_norm = None

    def __call__(self, x):
        y = nnx.relu(self.norm1(self.conv1(x)))
        y = self.norm2(self.conv2(y))
        shortcut = x if self.proj is None else self.proj_norm(self.proj(x))
        return nnx.relu(y + shortcut)


class ResNet(nnx.Module):
    """A small ResNet for 8x8x1 images: stem, three stages (8x8, 4x4, 2x2), head."""

    def __init__(self, width: int = 16, num_classes: int = 10, *, rngs: nnx.Rngs):
        w = width
        self.stem = nnx.Conv(1, w, (3, 3), use_bias=False, rngs=rngs)
        self.stem_norm = nnx.GroupNorm(w, num_groups=_groups(w), rngs=rngs)
        self.blocks = nnx.List([
            ResidualBlock(w, w, 1, rngs=rngs),
            ResidualBlock(w, 2 * w, 2, rngs=rngs),
            ResidualBlock(2 * w, 4 * w, 2, rngs=rngs),
        ])
        self.head = nnx.Linear(4 * w, num_classes, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.stem_norm(self.stem(x)))
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(axis=(1, 2)))


# One compiled program initializes every layer: eagerly, each initializer's shape compiles
# on its own (about 30 s of XLA compiling on 2 cores, against 18 s for this).
@functools.partial(nnx.jit, static_argnums=(0, 1))
def init_model(width: int, seed: int) -> ResNet:
    return ResNet(width, rngs=nnx.Rngs(seed))


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------


def load_data(seed: int):
    """Digits as float32 NHWC in [0, 1], stratified 80/20 train/test split."""
    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[..., None]
    y = digits.target.astype(np.int32)
    return train_test_split(x, y, test_size=0.2, stratify=y, random_state=seed)


def batches(x, y, batch_size: int, epoch: int, seed: int):
    """Shuffled full batches (the remainder is dropped) for one epoch."""
    order = np.random.default_rng([seed, epoch]).permutation(len(x))
    for i in range(len(x) // batch_size):
        idx = order[i * batch_size:(i + 1) * batch_size]
        yield x[idx], y[idx]


# --------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------


def make_train_step(graphdef, tx, collectives, mesh, n_dev: int, check_vma: bool = True):
    """jit(shard_map(step)): grads summed by the cast's transpose, optax update.

    (``check_vma=False`` with identity collectives times the step without any
    communication: benchmarks/bench_steps.py mlp.)"""
    psum, cast = collectives

    def step(params, opt_state, x, y):
        def loss_fn(p):
            # The replicated parameters, cast to per-device values: the
            # transpose of the cast sums their gradients over the devices
            # (<- the swap: jax_blink.pvary sums them with jax_blink.psum,
            # JAX's implicit cast with XLA's psum).
            logits = nnx.merge(graphdef, cast(p, AXIS))(x)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, logits

        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)

        grads = jax.tree.map(lambda g: g / n_dev, grads)  # summed over the devices already

        correct = jnp.sum(jnp.argmax(logits, -1) == y).astype(jnp.float32)
        loss_sum, correct_sum = psum((loss, correct), AXIS)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {"loss": loss_sum / n_dev, "accuracy": correct_sum / (x.shape[0] * n_dev)}
        return params, opt_state, metrics

    sharded = jax.shard_map(
        step, mesh=mesh,
        in_specs=(P(), P(), P(AXIS), P(AXIS)),
        out_specs=(P(), P(), P()),
        check_vma=check_vma,
    )
    return jax.jit(sharded, donate_argnums=(0, 1))


def make_predict(graphdef, mesh):
    # replicated predictions: every process can read them (--processes)
    @functools.partial(jax.jit, out_shardings=NamedSharding(mesh, P()))
    def predict(params, x):
        return jnp.argmax(nnx.merge(graphdef, params)(x), -1)
    return predict


def evaluate(predict, params, x, y, mesh, n_dev: int) -> float:
    """Test accuracy, with the test set padded and split across the devices."""
    pad = (-len(x)) % n_dev
    xp = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)])
    xp = jax.device_put(xp, NamedSharding(mesh, P(AXIS)))
    pred = np.asarray(predict(params, xp))[: len(x)]
    return float(np.mean(pred == y))


class Trainer:
    """One model, its optimizer state and its curves, trained with one psum."""

    def __init__(self, which: str, args, total: int, mesh, n_dev: int, example_batch):
        self.which, self.mesh, self.n_dev = which, mesh, n_dev
        model = init_model(args.width, args.seed)  # same seed, same init
        graphdef, params = nnx.split(model)
        self.n_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
        schedule = optax.warmup_cosine_decay_schedule(
            0.0, args.lr, warmup_steps=max(1, total // 20), decay_steps=total)
        tx = optax.adamw(schedule, weight_decay=1e-4)
        replicated = NamedSharding(mesh, P())
        self.params = jax.device_put(params, replicated)
        self.opt_state = jax.device_put(tx.init(self.params), replicated)
        self.predict = make_predict(graphdef, mesh)
        step = make_train_step(graphdef, tx, get_collectives(which), mesh, n_dev)
        # Compile ahead of time so that compilation is timed on its own.
        t0 = time.perf_counter()
        self.step_fn = step.lower(self.params, self.opt_state, *example_batch).compile()
        self.compile_s = time.perf_counter() - t0
        # who sums: the compiled step's XLA all-reduces and jax_blink custom calls
        hlo = self.step_fn.as_text()
        self.collectives = {"xla_all_reduce": hlo.count(" all-reduce("),
                            # (jax_blink_collective and jax_blink_collective_segments)
                            "jax_blink": hlo.count('custom_call_target="jax_blink_collective')}
        self.loss, self.acc, self.step_s, self.test_acc = [], [], [], []

    def step(self, x, y) -> None:
        t0 = time.perf_counter()
        self.params, self.opt_state, metrics = self.step_fn(self.params, self.opt_state, x, y)
        metrics = jax.device_get(metrics)  # waits for the step to finish
        self.step_s.append(time.perf_counter() - t0)
        self.loss.append(float(metrics["loss"]))
        self.acc.append(float(metrics["accuracy"]))

    def evaluate(self, x, y) -> None:
        self.test_acc.append(evaluate(self.predict, self.params, x, y, self.mesh, self.n_dev))

    def result(self) -> dict:
        ms = 1e3 * np.asarray(self.step_s[1:] or self.step_s)  # first step = warm-up
        return {
            "psum": LABELS[self.which],
            "steps": len(self.loss),
            "params": self.n_params,
            "loss": self.loss,
            "train_accuracy": self.acc,
            "test_accuracy": self.test_acc[-1],
            "test_accuracy_per_epoch": self.test_acc,
            "compile_s": self.compile_s,
            "collectives": self.collectives,
            "step_ms_median": float(np.median(ms)),
            "step_ms_mean": float(np.mean(ms)),
            "step_ms_p10": float(np.percentile(ms, 10)),
            "step_ms_p90": float(np.percentile(ms, 90)),
            "step_ms": [1e3 * s for s in self.step_s],
        }


def train(args, names, data, mesh, n_dev: int) -> dict:
    """Train one model per psum in ``names``, in lockstep on the same batches.

    With ``--compare`` the blink and lax.psum steps alternate, so both see the
    same machine load and their step times can be compared fairly.
    """
    x_train, x_test, y_train, y_test = data
    total = (len(x_train) // args.batch_size) * args.epochs
    if args.steps is not None:
        total = min(total, args.steps)
    sharded = NamedSharding(mesh, P(AXIS))

    def put(xb, yb):
        return jax.device_put(xb, sharded), jax.device_put(yb, sharded)

    example = put(*next(batches(x_train, y_train, args.batch_size, 0, args.seed)))
    trainers = [Trainer(name, args, total, mesh, n_dev, example) for name in names]
    main = trainers[0]
    # disable=None: no bar where stdout is not a terminal (a log, CI)
    bar = tqdm(total=total, disable=True if jax.process_index() != 0 else None,
               desc=" vs ".join(LABELS[n] for n in names), dynamic_ncols=True, file=sys.stdout)

    def show():
        info = {"loss": f"{main.loss[-1]:.4f}", "acc": f"{main.acc[-1]:.3f}",
                "test_acc": f"{main.test_acc[-1]:.3f}" if main.test_acc else "-"}
        for t in trainers:
            info[f"{t.which}_ms"] = f"{1e3 * t.step_s[-1]:.1f}"
        bar.set_postfix(info)

    step = 0
    for epoch in range(args.epochs):
        for xb, yb in batches(x_train, y_train, args.batch_size, epoch, args.seed):
            if step >= total:
                break
            xb, yb = put(xb, yb)
            # Alternate who goes first, so neither run always follows the other.
            for t in (trainers if step % 2 == 0 else trainers[::-1]):
                t.step(xb, yb)
            step += 1
            bar.update(1)
            show()
        for t in trainers:
            t.evaluate(x_test, y_test)
        show()
        if step >= total:
            break
    bar.close()
    return {t.which: t.result() for t in trainers}


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------


def machine_name() -> str:
    """CPU model (from /proc/cpuinfo) or the accelerator's device kind."""
    dev = jax.devices()[0]
    if dev.platform != "cpu":
        return dev.device_kind
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def compare_losses(runs: dict) -> dict:
    """How far apart the blink and lax.psum loss curves are."""
    a, b = np.asarray(runs["blink"]["loss"]), np.asarray(runs["lax"]["loss"])
    d = np.abs(a - b)
    differ = np.flatnonzero(d)
    return {
        "max_abs_diff": float(d.max()),
        "max_abs_diff_step": int(d.argmax()) + 1,
        "max_rel_diff": float(np.max(d / np.abs(b))),
        "first_20_steps_max_abs_diff": float(d[:20].max()),
        "identical_steps": int(np.sum(d == 0)),
        "first_differing_step": int(differ[0]) + 1 if len(differ) else None,
    }


def print_summary(runs: dict, env: dict, diff: dict | None) -> None:
    rows = [
        ("final train loss", lambda r: f"{r['loss'][-1]:.4f}"),
        ("test accuracy", lambda r: f"{100 * r['test_accuracy']:.2f} %"),
        ("step time, median (ms)", lambda r: f"{r['step_ms_median']:.2f}"),
        ("step time, mean (ms)", lambda r: f"{r['step_ms_mean']:.2f}"),
        ("step time, p10-p90 (ms)", lambda r: f"{r['step_ms_p10']:.1f}-{r['step_ms_p90']:.1f}"),
        ("compile time (s)", lambda r: f"{r['compile_s']:.2f}"),
        ("steps", lambda r: str(r["steps"])),
    ]
    names = list(runs)
    cols = [LABELS[n] for n in names]
    w0 = max(len(r[0]) for r in rows)
    w = max(16, *(len(c) for c in cols))
    line = "-" * (w0 + (w + 3) * len(cols))
    procs = f" in {env['processes']} processes" if env["processes"] > 1 else ""
    print(f"\n{env['n_devices']} x {env['platform']} devices{procs} ({env['machine']}, "
          f"{env['cpu_cores']} CPU cores), ResNet width {env['width']} "
          f"({runs[names[0]]['params']:,} params), global batch {env['batch_size']}")
    print(line)
    print(f"{'':<{w0}}" + "".join(f" | {c:>{w}}" for c in cols))
    print(line)
    for label, fmt in rows:
        print(f"{label:<{w0}}" + "".join(f" | {fmt(runs[n]):>{w}}" for n in names))
    print(line)
    print(f"wall time {env['wall_s_after_imports']:.0f} s after imports; load average (1 min) "
          f"{env['loadavg_1min_start']:.1f} at start, {env['loadavg_1min_end']:.1f} at end "
          f"(a load above the core count makes step times noisy)")
    if diff is not None:
        ratio = runs["blink"]["step_ms_median"] / runs["lax"]["step_ms_median"]
        print(f"loss curves, max |blink - lax|: {diff['max_abs_diff']:.3g} "
              f"(step {diff['max_abs_diff_step']}; first 20 steps: "
              f"{diff['first_20_steps_max_abs_diff']:.3g}; "
              f"{diff['identical_steps']}/{len(runs['lax']['loss'])} steps bitwise equal)")
        print("  (the two all-reduces add in different orders; training amplifies "
              "those last-bit differences)")
        print(f"step time ratio blink / lax (median): {ratio:.2f}x")


def plot(runs: dict, path: str) -> None:
    """Loss curves; with both runs, a second panel with |blink - lax| per step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    both = len(runs) == 2
    fig, axes = plt.subplots(1, 2 if both else 1, figsize=(11 if both else 7, 4), squeeze=False)
    ax = axes[0, 0]
    styles = {"blink": dict(lw=2.0), "lax": dict(lw=1.0, ls="--")}
    for name, run in runs.items():
        ax.plot(np.arange(1, len(run["loss"]) + 1), run["loss"],
                label=f"{run['psum']} (test acc {100 * run['test_accuracy']:.1f} %)",
                **styles[name])
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (cross-entropy)")
    ax.set_title("ResNet on digits, data-parallel")
    ax.grid(True, alpha=0.3)
    ax.legend()
    if both:
        diff = np.abs(np.asarray(runs["blink"]["loss"]) - np.asarray(runs["lax"]["loss"]))
        ax = axes[0, 1]
        # Exact zeros cannot be drawn on a log axis; show them at the bottom.
        floor = 1e-9
        ax.semilogy(np.arange(1, len(diff) + 1), np.maximum(diff, floor), ".-", lw=1)
        ax.set_ylim(bottom=floor / 2)
        ax.set_xlabel("step")
        ax.set_ylabel("|loss(jax_blink.psum) - loss(jax.lax.psum)|")
        ax.set_title(f"difference (max {diff.max():.2g})")
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--epochs", type=int, default=15, help="passes over the training split")
    p.add_argument("--batch-size", type=int, default=128,
                   help="global batch size; must divide by the number of devices")
    p.add_argument("--width", type=int, default=16, help="channels of the first stage")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the split, the initialisation and the batch order")
    p.add_argument("--out-dir", default="out/flax_resnet",
                   help="where loss_curves.png and results.json go")
    p.add_argument("--psum", choices=sorted(LABELS), default="blink",
                   help="all-reduce for the gradients (ignored with --compare)")
    p.add_argument("--compare", action="store_true",
                   help="train with jax_blink.psum and jax.lax.psum, compare")
    p.add_argument("--processes", type=int, default=1,
                   help="run as this many local processes of one jax.distributed job "
                        "(127.0.0.1, gloo), the 8 CPU devices split among them; the gradients' "
                        "psum then runs over the processes' shared memory")
    p.add_argument("--steps", type=int, default=None,
                   help="stop after this many steps; the learning-rate schedule is fit to them "
                        "(for tests)")
    args = p.parse_args(argv)
    if args.processes < 1 or 8 % args.processes:
        p.error(f"--processes must divide the 8 CPU devices, got {args.processes}")
    for name in ("epochs", "batch_size", "width", "steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    return args


def launch(argv, args) -> int:
    """--processes N: N local copies of this script, one jax.distributed job;
    prints process 0's output (and any failing process's)."""
    from jax_blink.launch import run_local

    if _gpu_present():
        sys.exit("error: --processes runs CPU processes on this machine; on GPUs start one "
                 "process per host yourself (docs/multihost.md)")
    argv = sys.argv[1:] if argv is None else list(argv)
    results = run_local([sys.executable, os.path.abspath(__file__), *argv], args.processes,
                        devices_per_process=8 // args.processes, timeout_s=3600)
    for r in results:
        if r.process_id == 0 or not r.ok:
            if r.process_id:
                print(f"--- process {r.process_id} (exit {r.returncode})")
            sys.stdout.write(r.stdout)
            if not r.ok:
                sys.stdout.write(r.stderr[-5000:])
    return 0 if all(r.ok for r in results) else 1


def calibrate_if_needed(platform: str) -> None:
    """psum chooses between its plan and lax.psum from this machine's measured costs: where
    none were measured yet (``python -m jax_blink calibrate``), measure them quickly first,
    in one process of CPU devices (JAX_BLINK_PROFILE=defaults keeps the recorded ones)."""
    if platform != "cpu" or jax.process_count() > 1 or os.environ.get("JAX_BLINK_PROFILE"):
        return
    import logging

    quiet = logging.getLogger("jax_blink")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the one line below says it instead of the 'no profile' note
    try:
        found = jax_blink.machine_profile()
        if found is not None and not found.provisional:  # (one measured under load is redone)
            return
        made, where = jax_blink.calibrate(quick=True, progress=False)
    finally:
        quiet.setLevel(level)
    print(f"jax_blink: this machine had no profile: a quick calibration ({made.seconds:.0f} s) measured "
          f"psum's costs here and wrote {where}")


def main(argv=None) -> int:
    t_start = time.perf_counter()
    args = parse_args(argv)
    from jax_blink.launch import ENV, initialize

    if args.processes > 1 and ENV["coordinator"] not in os.environ:
        return launch(argv, args)
    process_id = initialize()  # joins the job that launch() started (no-op otherwise)
    devices = jax.devices()
    n_dev = len(devices)
    if args.batch_size % n_dev:
        sys.exit(f"error: --batch-size {args.batch_size} must be divisible by the number of "
                 f"devices ({n_dev}); try --batch-size {max(1, args.batch_size // n_dev) * n_dev}")
    data = load_data(args.seed)
    if args.batch_size > len(data[0]):
        sys.exit(f"error: --batch-size {args.batch_size} is larger than the training set "
                 f"({len(data[0])} examples)")
    mesh = jax.make_mesh((n_dev,), (AXIS,), devices=devices)
    env = {
        "platform": devices[0].platform,
        "n_devices": n_dev,
        "machine": machine_name(),
        "cpu_cores": os.cpu_count(),
        "processes": jax.process_count(),
        "jax": jax.__version__,
        "jax_blink": getattr(jax_blink, "__version__", "?"),
        "width": args.width,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "lr": args.lr,
        "seed": args.seed,
        "train_examples": len(data[0]),
        "test_examples": len(data[1]),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        "loadavg_1min_start": os.getloadavg()[0],
    }

    names = ["blink", "lax"] if args.compare else [args.psum]
    if "blink" in names:
        calibrate_if_needed(devices[0].platform)
    runs = train(args, names, data, mesh, n_dev)

    if process_id != 0:  # process 0 reports; every process trained the same model
        return 0
    env["loadavg_1min_end"] = os.getloadavg()[0]
    env["wall_s_after_imports"] = time.perf_counter() - t_start
    diff = compare_losses(runs) if args.compare else None
    print_summary(runs, env, diff)
    decisions = jax_blink.explain() if "blink" in runs else None
    if decisions:
        print("jax_blink.psum decisions (jax_blink.explain()):")
        print("  " + decisions.replace("\n", "\n  "))

    os.makedirs(args.out_dir, exist_ok=True)
    png = os.path.join(args.out_dir, "loss_curves.png")
    plot(runs, png)
    result = {"env": env, "runs": runs, "jax_blink_explain": decisions}
    if diff is not None:
        result["loss_max_abs_diff"] = diff["max_abs_diff"]
        result["loss_diff"] = diff
        result["step_time_ratio_blink_over_lax"] = (
            runs["blink"]["step_ms_median"] / runs["lax"]["step_ms_median"])
    js = os.path.join(args.out_dir, "results.json")
    with open(js, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {png} and {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
