"""The simulator against real jax_blink.psum runs on 8 virtual CPU devices.

Measures ``jax_blink.psum`` (forced on with ``min_bytes=0``) with
:func:`jax_blink.measure.timing.run_devices`, simulates the schedule psum runs
(its decision's own, ``choice.requests.schedule_for``: the same trees and chunks,
whatever bandwidth the model assumes) and reports the relative error of the
predicted time:

* with the default (GPU-like) :class:`~jax_blink.sim.SimModel` on the
  ``shm:8`` preset, with a GPU-like nominal shared-memory latency of 0.5 us
  (the cost model's ``shm`` entry, :data:`jax_blink.planning.cost.LATENCY_US`,
  is the CPU executor's measured 2 ms step wait, which the fit below
  replaces too);
* with a CPU model fitted on the even-indexed sizes (grid search over the shm
  port bandwidth, step overhead, reduction throughput and shm latency),
  its error reported on the odd-indexed sizes it was not fitted on.

Writes ``benchmarks/results/sim_vs_real_<machine>.{json,md,png}``:

    python benchmarks/bench_sim_vs_real.py [--machine NAME] [--iters 20]
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
from jax_blink.settings import set_xla_cpu_threads  # imports no jax
set_xla_cpu_threads()  # XLA CPU\'s threads: twice the devices
os.environ.setdefault("JAX_BLINK_ALGO", "blink")  # the plan at every size (auto may pick lax)

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from jax_blink.cli.sizes import format_size, parse_sizes  # noqa: E402
from jax_blink.measure.timing import run_devices  # noqa: E402
from jax_blink.sim import SimModel, simulate  # noqa: E402
from jax_blink.topo import Topology  # noqa: E402

#: Fit grid. 8 virtual devices share the host's cores, so the per-device
#: bandwidths of a 2-core machine are far below one core's memcpy rate.
GRID = {"port_gbps": (0.25, 0.5, 1.0, 2.0, 5.0), "step_overhead_us": (10.0, 50.0, 100.0, 200.0),
        "reduce_gbps": (0.5, 1.0, 2.0, 5.0), "shm_latency_us": (5.0, 20.0)}


def shm_topology(n, port_gbps):
    return Topology.from_links(n, [(d, n, port_gbps, "shm") for d in range(n)], ["host memory"], f"shm:{n}")


def psum_schedule(size, n):
    """The schedule jax_blink.psum runs for ``size`` bytes per device on n CPU devices (the
    decision's own: the same plan, chunks and trees)."""
    from jax_blink.choice.requests import PlanRequest, schedule_for

    return schedule_for(PlanRequest(Topology.preset(f"shm:{n}")), size // 4, "float32")[1]


def predict(sizes, n, params):
    """Simulated times of psum's schedules on a shm topology of the given port bandwidth."""
    topo = shm_topology(n, params["port_gbps"])
    model = SimModel(latency_us={"shm": params["shm_latency_us"]}, step_overhead_us=params["step_overhead_us"],
                     reduce_gbps=params["reduce_gbps"])
    return [simulate(psum_schedule(size, n), topo, model=model).time_us for size in sizes]


def rel_errors(predicted, measured):
    return [abs(p - m) / m for p, m in zip(predicted, measured)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--machine", default="cpu")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--sizes", type=parse_sizes, default=parse_sizes("16K:16M:4"))
    args = parser.parse_args()
    rows, devices = run_devices(args.sizes, "float32", args.iters, min_bytes=0)
    n = 8
    measured = [r["jax_blink.psum"]["time_us"] for _, r in rows]
    wrong = sum(r["jax_blink.psum"]["wrong"] for _, r in rows)
    default = {"port_gbps": 10.0, "step_overhead_us": SimModel().step_overhead_us,
               "reduce_gbps": SimModel().reducer_gbps(Topology.preset(f"shm:{n}")), "shm_latency_us": 0.5}
    default_pred = predict(args.sizes, n, default)
    fit_idx, test_idx = list(range(0, len(args.sizes), 2)), list(range(1, len(args.sizes), 2))
    fit_sizes = [args.sizes[i] for i in fit_idx]
    best = None
    for values in itertools.product(*GRID.values()):
        params = dict(zip(GRID, values))
        pred = predict(fit_sizes, n, params)
        err = sum(e * e for e in rel_errors(pred, [measured[i] for i in fit_idx]))
        if best is None or err < best[0]:
            best = (err, params)
    fitted = best[1]
    fitted_pred = predict(args.sizes, n, fitted)
    default_err = rel_errors(default_pred, measured)
    fitted_err = rel_errors(fitted_pred, measured)
    held_out = [fitted_err[i] for i in test_idx]
    result = {"devices": devices, "iters": args.iters, "wrong": wrong, "default_model": default, "fitted_model": fitted,
              "rows": [{"size_bytes": s, "measured_us": m, "lax_psum_us": r["lax.psum"]["time_us"],
                        "default_pred_us": d, "fitted_pred_us": f, "fitted_on": i in fit_idx}
                       for i, ((s, r), m, d, f) in enumerate(zip(rows, measured, default_pred, fitted_pred))],
              "default_mean_rel_error": sum(default_err) / len(default_err),
              "fitted_heldout_mean_rel_error": sum(held_out) / max(len(held_out), 1),
              "fitted_heldout_max_rel_error": max(held_out, default=0.0)}
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"sim_vs_real_{args.machine}")
    with open(out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    lines = [f"# Simulator vs real jax_blink.psum ({devices})", "",
             f"Reproduce: `python benchmarks/bench_sim_vs_real.py --machine {args.machine}`. "
             f"Median of {args.iters} runs per size; {wrong} wrong elements in all runs.", "",
             f"Default model (GPU-like, 0.5 us shm latency): mean relative error {result['default_mean_rel_error']:.0%}. "
             f"Fitted CPU model {fitted} on sizes {', '.join(format_size(s) for s in fit_sizes)}: "
             f"held-out mean relative error {result['fitted_heldout_mean_rel_error']:.0%}, "
             f"max {result['fitted_heldout_max_rel_error']:.0%}.", "",
             "| size/device | measured us | lax.psum us | default model us | fitted model us | fitted on |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {format_size(r['size_bytes'])} | {r['measured_us']:.1f} | {r['lax_psum_us']:.1f} | "
                     f"{r['default_pred_us']:.1f} | {r['fitted_pred_us']:.1f} | {'yes' if r['fitted_on'] else 'no'} |")
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    sizes = [r["size_bytes"] for r in result["rows"]]
    for key, label in (("measured_us", "measured jax_blink.psum"), ("lax_psum_us", "measured lax.psum"),
                       ("default_pred_us", "simulated, default model"), ("fitted_pred_us", "simulated, fitted model")):
        ax.plot(sizes, [r[key] for r in result["rows"]], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([format_size(s) for s in sizes])
    ax.set_xlabel("size per device")
    ax.set_ylabel("time (us)")
    ax.set_title(f"allreduce, {devices}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=110)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
