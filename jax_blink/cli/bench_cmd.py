"""``python -m jax_blink bench``: Blink plans against baselines, simulated or real.

Simulated (the default; never imports jax): for each message size, the
allreduce is planned (:func:`jax_blink.planning`), lowered latency-aware
(:func:`jax_blink.sim.tune`), and simulated next to every baseline of
:mod:`jax_blink.sim.baselines` on the same topology (:func:`jax_blink.sim.compare`,
:func:`jax_blink.sim.sweep_subsets`), each at its fastest chunking; where the
topology names its GPU, also NCCL as its own tuner predicts it
(``nccl-model``) and Blink on the CUDA executor against it. Rows carry nccl-tests'
columns -- size, time_us, algbw, busbw (GB/s, busbw = algbw * 2(n-1)/n) --
and the Blink row the speedup over the fastest baseline.

    python -m jax_blink bench --topology dgx1-v100 --gpus 0,1,2,5 --sizes 1K:1G --png out.png
    python -m jax_blink bench --topology dgx1-p100 --all-subsets --sizes 1M,256M --json out.json

Several hosts (``--hosts H --nic-gbps G``, or a JSON topology whose ``net``
links join groups of ranks) compare Blink's three-phase allreduce (in-host
reduce-scatter, allreduce across hosts, in-host all-gather) with NCCL's flat
ring over all GPUs and its hierarchical tree (:func:`jax_blink.sim.compare_hosts`):

    python -m jax_blink bench --topology dgx1-v100 --hosts 4 --nic-gbps 12.5 --sizes 1M,256M

``--devices`` instead runs ``jax_blink.psum`` and ``jax.lax.psum`` on the
devices present (CPU virtual devices with ``--cpu-devices N``, or GPUs),
with the same columns plus ``#wrong``: elements that differ from numpy's sum.

``--steps`` times training steps on the devices present: data-parallel MLPs
(``--models DEPTHxWIDTH,...``) whose gradients are summed after ``jax.grad``
by nothing, ``lax.psum``, ``jax_blink.psum`` in one bucket and ``jax_blink.psum``
with its default buckets, with the step time against no communication and
against lax.psum, and ``#wrong``: elements of the summed gradients outside the
summation-order bound.

    python -m jax_blink bench --steps --cpu-devices 8 --models 8x1024,4x512
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from jax_blink import settings
from jax_blink.cli.common import add_topology_args, allocations, output_path, plain, topology_from_args, wrote
from jax_blink.cli.sizes import format_size, parse_sizes
from jax_blink.planning import plan_hosts
from jax_blink.sim import SimModel, compare, compare_hosts, sweep_subsets

__all__ = ["add_parser", "MAX_SIMULATED_HOST_RANKS"]

#: Most GPUs ``bench --hosts`` simulates (4 x 8 take about 45 s for two sizes on
#: 2 cores, and the flat ring's cost grows with the square of the GPU count).
MAX_SIMULATED_HOST_RANKS = 128

def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``bench`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "bench", help="compare Blink with ring/tree baselines (simulated) or lax.psum (--devices)",
        description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_topology_args(p, required=False)
    p.add_argument("--sizes", type=parse_sizes, default=None,
                   help="message sizes per rank: LO:HI[:FACTOR] or a comma list, suffixes K/M/G "
                        "(default: 1K:1G; --all-subsets and --hosts: 1M,256M; --devices: 4K:16M:4)")
    p.add_argument("--dtype", default="float32", help="element type (default float32)")
    p.add_argument("--png", default=None, help="write a busbw-vs-size plot per algorithm here")
    p.add_argument("--json", default=None, help="write every row (and the summary) as JSON here")
    p.add_argument("--all-subsets", action="store_true",
                   help="sweep every allocation of 2 or more ranks of the topology and summarise")
    p.add_argument("--min-gpus", type=int, default=2, help="--all-subsets: smallest allocation (default 2)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="--all-subsets: worker processes (default: all cores)")
    p.add_argument("--step-overhead-us", type=float, default=None,
                   help="simulator: fixed cost of every step (default: SimModel's)")
    p.add_argument("--reduce-gbps", type=float, default=None,
                   help="simulator: reduction throughput per rank (default: the topology's, "
                        "a third of the GPU's memory bandwidth for the presets, else 300)")
    p.add_argument("--devices", action="store_true",
                   help="run jax_blink.psum and lax.psum on the present devices instead of simulating")
    p.add_argument("--cpu-devices", type=int, default=None,
                   help="--devices: force this many virtual CPU devices (sets XLA_FLAGS before jax starts)")
    p.add_argument("--iters", type=int, default=20, help="--devices: timed iterations per size (default 20)")
    p.add_argument("--min-bytes", type=int, default=None,
                   help="--devices: jax_blink.psum's min_bytes (default: the library's)")
    p.add_argument("--steps", action="store_true",
                   help="time data-parallel training steps (MLPs) with no communication, lax.psum and "
                        "jax_blink.psum on the present devices")
    p.add_argument("--models", type=_models, default=[(8, 1024), (4, 2048), (16, 512)],
                   help="--steps: MLPs as DEPTHxWIDTH, comma-separated (default 8x1024,4x2048,16x512)")
    p.add_argument("--batch", type=int, default=64, help="--steps: examples per device (default 64)")
    p.add_argument("--rounds", type=int, default=9,
                   help="--steps: interleaved rounds of 3 steps per variant; the median is kept (default 9)")
    p.set_defaults(func=main)
    return p


def main(args) -> int:
    try:
        output_path(args.png, "--png", ".png")
        output_path(args.json, "--json", ".json")
        _check(args)
        if args.devices and args.steps:
            raise ValueError("--devices and --steps are two measurements; give one")
        if args.devices or args.steps:
            return _devices_main(args)
        return _simulated_main(args)
    except (ValueError, OSError) as e:  # TopologyError, PlanError, ScheduleError, SimError are ValueErrors
        print(f"error: {e}", file=sys.stderr)
        return 2


def _check(args):
    """The options' values, checked before any work."""
    from jax_blink.schedule import ScheduleError, dtype_name

    if args.sizes is not None and not args.sizes:
        raise ValueError("--sizes names no size; e.g. 4K:16M or 1M,256M")
    complex_ok = args.devices and args.dtype in ("complex64", "complex128")  # psum runs them as pairs
    try:
        complex_ok or dtype_name(args.dtype)
    except (ScheduleError, TypeError):
        raise ValueError(f"--dtype {args.dtype!r}: use float32, float64, float16, bfloat16, int32, "
                         "int64 or uint32" + (" (with --devices also complex64, complex128)"
                                              if args.devices else "")) from None
    if args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    if args.step_overhead_us is not None and not 0 <= args.step_overhead_us < math.inf:
        raise ValueError(f"--step-overhead-us must be a finite number of microseconds >= 0, got "
                         f"{args.step_overhead_us}")
    if args.reduce_gbps is not None and not 0 < args.reduce_gbps < math.inf:
        raise ValueError(f"--reduce-gbps must be a finite number of GB/s > 0, got {args.reduce_gbps}")


# -------------------------------------------------------------- simulate
def _model(args):

    kwargs = {}
    if args.step_overhead_us is not None:
        kwargs["step_overhead_us"] = args.step_overhead_us
    if args.reduce_gbps is not None:
        kwargs["reduce_gbps"] = args.reduce_gbps
    return SimModel(**kwargs)


def _print_table(rows_by_size, n, out=sys.stdout):
    print(f"# {'size':>8} {'algorithm':>12} {'time_us':>11} {'algbw':>8} {'busbw':>8}  blink speedup", file=out)
    for size, rows in rows_by_size:
        for name, row in rows.items():
            extra = f"  {row['speedup']:.2f}x vs best baseline" if name == "blink" else ""
            if name == "blink" and "vs_nccl_model" in row:
                extra += (f"; on the CUDA executor {row['time_us_cuda_executor']:.1f} us, "
                          f"{row['vs_nccl_model']:.2f}x vs NCCL's own model")
            if name == "nccl-model":
                extra = f"  NCCL's tuner model: {row['algorithm']}/{row['protocol']}"
            print(f"  {format_size(size):>8} {name:>12} {row['time_us']:11.1f} {row['algbw_gbps']:8.2f} "
                  f"{row['busbw_gbps']:8.2f}{extra}", file=out)


def _plot(rows_by_size, title, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = list(rows_by_size[0][1])
    sizes = [s for s, _ in rows_by_size]
    for name in names:
        ax.plot(sizes, [rows[name]["busbw_gbps"] for _, rows in rows_by_size], marker="o", ms=3,
                lw=2.5 if name in ("blink", "jax_blink.psum") else 1.2, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes[::max(1, len(sizes) // 8)])
    ax.set_xticklabels([format_size(s) for s in sizes[::max(1, len(sizes) // 8)]])
    ax.set_xlabel("message size per rank (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    wrote(path, "the plot")


def _simulated_main(args):
    if args.all_subsets and (args.gpus or args.hosts):
        raise ValueError("--all-subsets sweeps every allocation of one machine; drop --gpus and --hosts")
    topology, _ = topology_from_args(args)
    model = _model(args)
    if len(topology.host_ranks()) > 1:
        return _hosts_main(args, topology, model)
    if args.all_subsets:
        sizes = args.sizes or [2**20, 2**28]
        if not 2 <= args.min_gpus <= topology.n:
            raise ValueError(f"--min-gpus must be between 2 and {topology.name}'s {topology.n} ranks, "
                             f"got {args.min_gpus}")
        count = allocations(topology.n, args.min_gpus)
        print(f"# {count} allocations x {len(sizes)} sizes: about "
              f"{math.ceil(2 * count * len(sizes) / max(args.jobs, 1) / 60)} min with {args.jobs} "
              "job(s) (planning over every link and simulating take about 2 s per allocation and size "
              "on a 2-core machine)",
              file=sys.stderr)
        summary, rows = sweep_subsets(topology, sizes, args.dtype, model, args.min_gpus, args.jobs,
                                      progress=_progress("allocations"))
        _print_summary(topology, summary)
        if args.json:
            _write_json(args.json, {"topology": topology.name, "dtype": args.dtype, "model": _model_dict(model),
                                    "summary": summary, "allocations": rows})
        return 0
    if topology.n < 2:
        raise ValueError(f"{topology.name} has one rank; an allreduce needs at least two")
    sizes = args.sizes or parse_sizes("1K:1G")
    rows_by_size = [(size, compare(topology, size, args.dtype, model))
                    for size in _progress("simulating")(sizes, total=len(sizes))]
    print(f"# allreduce on {topology.name} ({topology.n} ranks), {args.dtype}, simulated")
    _print_table(rows_by_size, topology.n)
    if args.png:
        _plot(rows_by_size, f"allreduce on {topology.name} (simulated)", args.png)
    if args.json:
        _write_json(args.json, {"topology": topology.name, "dtype": args.dtype, "model": _model_dict(model),
                                "rows": [{"size_bytes": s, **{k: v for k, v in r.items()}} for s, r in rows_by_size]})
    return 0


def _hosts_main(args, topology, model):
    """Blink's three-phase allreduce against NCCL's flat ring and hierarchical tree, simulated."""
    if topology.n > MAX_SIMULATED_HOST_RANKS:
        raise ValueError(f"{topology.name} has {topology.n} GPUs: simulating NCCL's flat ring over more than "
                         f"{MAX_SIMULATED_HOST_RANKS} takes hours in this Python simulator; use fewer --hosts, "
                         f"or `python -m jax_blink plan` with the same options to plan the three phases")
    host_plan = plan_hosts(topology)
    sizes = args.sizes or [2**20, 2**28]
    rows_by_size = [(size, compare_hosts(topology, size, args.dtype, model, host_plan))
                    for size in _progress("simulating")(sizes, total=len(sizes))]
    print(f"# allreduce on {topology.name} ({topology.n} ranks: {len(host_plan.hosts)} hosts x "
          f"{host_plan.ranks_per_host}, {host_plan.network_gbps:g} GB/s per host to the network), "
          f"{args.dtype}, simulated; planned in {host_plan.plan_seconds:.2f} s")
    print(f"# {'size':>8} {'algorithm':>12} {'time_us':>11} {'algbw':>8} {'busbw':>8}  "
          f"blink speedup / phases (in-host RS, across hosts, in-host AG)")
    for size, rows in rows_by_size:
        for name, row in rows.items():
            extra = ""
            if "phases_us" in row:
                rs, net, ag = row["phases_us"]
                extra = (f"  {row['speedup']:.2f}x vs best NCCL  ({rs:.1f} + {net:.1f} [{row['network']}] "
                         f"+ {ag:.1f} us)")
            print(f"  {format_size(size):>8} {name:>12} {row['time_us']:11.1f} {row['algbw_gbps']:8.2f} "
                  f"{row['busbw_gbps']:8.2f}{extra}")
    if args.png:
        _plot(rows_by_size, f"allreduce on {topology.name} (simulated)", args.png)
    if args.json:
        _write_json(args.json, {"topology": topology.name, "hosts": len(host_plan.hosts),
                                "ranks_per_host": host_plan.ranks_per_host, "network_gbps": host_plan.network_gbps,
                                "dtype": args.dtype, "model": _model_dict(model),
                                "rows": [{"size_bytes": s, **r} for s, r in rows_by_size]})
    return 0


def _progress(what):
    """A progress bar on stderr for ``what``: ``wrap(iterable, total=n)``."""
    from tqdm import tqdm

    return lambda iterable, total: tqdm(iterable, total=total, desc=what, file=sys.stderr, leave=False,
                                           disable=None)  # none in logs


def _model_dict(model):
    import dataclasses

    return dataclasses.asdict(model)


def _write_json(path, data):
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    wrote(path, "the rows")


def _print_summary(topology, summary, out=sys.stdout):
    print(f"# allreduce on every allocation of {topology.name}, simulated; speedup = baseline time / Blink time",
          file=out)
    print(f"# {'size':>8} {'allocs':>6} {'vs ring: geomean':>16} {'max':>6}  {'vs best: geomean':>16} "
          f"{'min':>6}  {'#slower':>7} {'#slower w/ fallback':>19}", file=out)
    for size, s in summary.items():
        print(f"  {format_size(size):>8} {s['allocations']:6d} {s['geomean_vs_ring']:16.3f} {s['max_vs_ring']:6.2f}  "
              f"{s['geomean_vs_best']:16.3f} {s['min_vs_best']:6.3f}  {s['slower']:7d} "
              f"{s['slower_with_fallback']:19d}", file=out)


# --------------------------------------------------------------- devices
def _devices_main(args):
    if args.cpu_devices is not None:
        if "jax" in sys.modules:
            raise ValueError("--cpu-devices must be set before jax is imported")
        if args.cpu_devices < 1:
            raise ValueError(f"--cpu-devices must be >= 1, got {args.cpu_devices}")
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_force_host_platform_device_count={args.cpu_devices}").strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    settings.set_xla_cpu_threads()
    if args.iters < 1:
        raise ValueError(f"--iters must be >= 1, got {args.iters}")
    if args.steps:
        return _steps_main(args)
    from jax_blink.measure.timing import run_devices  # imports jax

    rows_by_size, devices = run_devices(args.sizes or parse_sizes("4K:16M:4"), args.dtype, args.iters,
                                        args.min_bytes)
    print(f"# allreduce on {devices}, {args.dtype}, measured (median of {args.iters})")
    print(f"# {'size':>8} {'algorithm':>15} {'time_us':>11} {'algbw':>8} {'busbw':>8} {'#wrong':>7}  blink speedup",)
    for size, rows in rows_by_size:
        for name, row in rows.items():
            extra = f"  {row['speedup']:.2f}x vs lax.psum" if "speedup" in row else ""
            print(f"  {format_size(size):>8} {name:>15} {row['time_us']:11.1f} {row['algbw_gbps']:8.2f} "
                  f"{row['busbw_gbps']:8.2f} {row['wrong']:7d}{extra}")
    if args.png:
        _plot(rows_by_size, f"allreduce on {devices} (measured)", args.png)
    if args.json:
        _write_json(args.json, {"devices": devices, "dtype": args.dtype, "iters": args.iters,
                                "rows": [{"size_bytes": s, **r} for s, r in rows_by_size]})
    return 0 if all(r["wrong"] == 0 for _, rows in rows_by_size for r in rows.values()) else 1


def _models(text):
    """``DEPTHxWIDTH,...`` as ``[(depth, width), ...]``."""
    models = []
    for part in text.split(","):
        depth, _, width = part.strip().lower().partition("x")
        try:
            model = (int(depth), int(width))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not DEPTHxWIDTH, e.g. 8x1024") from None
        if min(model) < 1:
            raise argparse.ArgumentTypeError(f"{part!r}: depth and width must be >= 1")
        models.append(model)
    return models


def _steps_main(args):
    if args.batch < 1 or args.rounds < 1:
        raise ValueError(f"--batch and --rounds must be >= 1, got {args.batch} and {args.rounds}")
    from jax_blink.measure.timing import run_steps  # imports jax

    rows, devices = run_steps(args.models, args.batch, args.rounds)
    print(f"# data-parallel MLP training steps on {devices}, float32, batch {args.batch} per device, "
          f"median of {args.rounds} interleaved rounds")
    print(f"# {'model':>8} {'gradients summed by':>22} {'step_ms':>9} {'cpu_ms':>8} {'vs none':>8} "
          f"{'vs lax':>7} {'calls':>6} {'#wrong':>7}")
    for r in rows:
        print(f"  {r['model']:>8} {r['variant']:>22} {r['step_ms']:9.1f} {r['cpu_ms']:8.1f} "
              f"{r['vs_none']:8.2f} {r['vs_lax']:7.2f} {r['collectives']:6d} {r['wrong']:7d}")
    if args.json:
        _write_json(args.json, {"devices": devices, "batch": args.batch, "rounds": args.rounds,
                                "rows": rows})
    return 0 if all(r["wrong"] == 0 for r in rows) else 1
