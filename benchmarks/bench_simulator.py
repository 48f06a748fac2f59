"""How far the simulator can be trusted: against its closed forms, and against real runs.

* ``fidelity``: every schedule's simulated time over its closed form (the busiest arc,
  Blink's slowest tree) at 256 MB on the GPU presets and over several hosts. Pure Python.
* ``vs_real``: ``jax_blink.psum`` timed on 8 virtual CPU devices against the simulator's
  prediction of the same schedule, with the default model and with a CPU model fitted on
  half of the sizes.

Each writes ``benchmarks/results/<name>_<machine>.{json,md}`` (``sim_fidelity``;
``sim_vs_real``, with a ``.png``), ``<machine>`` being this machine's tag
(``harness.machine_tag``) unless ``--machine`` names another. Run from the repository root:

    python benchmarks/bench_simulator.py fidelity [--machine NAME]
    python benchmarks/bench_simulator.py vs_real [--iters 20] [--sizes 16K:16M:4] [--machine NAME]
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys

import harness

SIZE = 2**28  # fidelity's message size


# --- fidelity ----------------------------------------------------------------------------

PRESETS = ["dgx-a100", "hgx-h100", "dgx1-v100", "dgx1-p100", "pcie"]
#: (preset, hosts, NICs per host, GB/s per NIC)
HOSTS = [("dgx1-v100", 4, 1, 12.5), ("dgx1-v100", 4, 4, 12.5), ("dgx-a100", 4, 8, 25.0)]


def fidelity(args) -> int:
    """The simulator against its closed forms at 256 MB (docs/simulator.md's tables).

    For every 8-GPU preset: the NCCL-style ring, reduce-scatter + all-gather, the double
    binary tree and the chain, simulated over their busiest arc
    (``jax_blink.sim.closed_form.busiest_arc_s``, counted from the schedule's steps);
    Blink's plan simulated over its busiest arc and over its slowest tree's pipeline form
    (``slowest_tree_s``). Then, over several hosts, NCCL's flat ring and hierarchical tree
    over their busiest arc. All with the reducer out of the way (``reduce_gbps=inf``) and,
    for the single machines, with the default model as well.

    Writes ``sim_fidelity_<machine>.{json,md}``."""
    from jax_blink.planning import plan, plan_hosts
    from jax_blink.sim import SimModel, simulate
    from jax_blink.sim.baselines import chain, double_binary_tree, ring_allreduce, rs_ag
    from jax_blink.sim.closed_form import busiest_arc_s, slowest_tree_s
    from jax_blink.sim.hosts import flat_ring, hierarchical_tree
    from jax_blink.topo import Topology

    name = args.machine or harness.machine_tag()
    models = {"free reducer": SimModel(reduce_gbps=math.inf), "default": SimModel()}
    rows = []
    for preset in PRESETS:
        t = Topology.preset(preset)
        p = plan(t)
        chunks = p.chunks_for(SIZE)
        schedules = {"blink": p.lower(SIZE, "float32", chunks=chunks)}
        for schedule, build in (("nccl-ring", ring_allreduce), ("rs-ag", rs_ag),
                                ("nccl-dbtree", double_binary_tree), ("chain", chain)):
            schedules[schedule] = build(t, SIZE, model=models["free reducer"])
        for schedule, s in schedules.items():
            arc = busiest_arc_s(s, t)
            row = {"topology": preset, "schedule": schedule, "busiest_arc_us": arc * 1e6}
            for label, model in models.items():
                row[f"sim_over_arc ({label})"] = simulate(s, t, model=model).time_s / arc
            if schedule == "blink":
                row["sim_over_slowest_tree (free reducer)"] = (
                    simulate(s, t, model=models["free reducer"]).time_s / slowest_tree_s(p, chunks, SIZE))
            rows.append(row)
            print(json.dumps(row), flush=True)
    for preset, hosts, nics, gbps in HOSTS:
        t = Topology.multi_host(preset, hosts, nic_gbps=gbps, nics=nics)
        hp = plan_hosts(t)
        for schedule, build in (("nccl-ring", flat_ring), ("nccl-tree", hierarchical_tree)):
            s = build(t, SIZE, host_plan=hp, model=models["free reducer"])
            arc = busiest_arc_s(s, t)
            rows.append({"topology": f"{t.name}, {nics} x {gbps:g} GB/s", "schedule": schedule,
                         "busiest_arc_us": arc * 1e6,
                         "sim_over_arc (free reducer)": simulate(s, t, model=models["free reducer"]).time_s / arc})
            print(json.dumps(rows[-1]), flush=True)
    columns = ["sim_over_arc (free reducer)", "sim_over_arc (default)", "sim_over_slowest_tree (free reducer)"]
    lines = [f"# The simulator against its closed forms, 256 MB ({name})", "",
             "`python benchmarks/bench_simulator.py fidelity`: simulated time / closed form. The busiest arc is "
             "counted from the schedule's steps (`jax_blink.sim.closed_form.busiest_arc_s`); Blink's slowest "
             "tree is `slowest_tree_s`. Simulated numbers: they depend on the model, not on this machine.", "",
             "| topology | schedule | busiest arc, us | " + " | ".join(columns) + " |",
             "|---|---|---|" + "---|" * len(columns)]
    for r in rows:
        lines.append(f"| {r['topology']} | {r['schedule']} | {r['busiest_arc_us']:.0f} | "
                     + " | ".join(f"{r[c]:.3f}" if c in r else "" for c in columns) + " |")
    out = harness.RESULTS / f"sim_fidelity_{name}"
    out.with_suffix(".json").write_text(json.dumps({"machine": harness.machine(name=name), "size_bytes": SIZE,
                                                    "rows": rows}, indent=1))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}.json and .md", file=sys.stderr)
    return 0


# --- vs_real -----------------------------------------------------------------------------

DEVICES = 8
#: Fit grid. 8 virtual devices share the host's cores, so the per-device
#: bandwidths of a 2-core machine are far below one core's memcpy rate.
GRID = {"port_gbps": (0.25, 0.5, 1.0, 2.0, 5.0), "step_overhead_us": (10.0, 50.0, 100.0, 200.0),
        "reduce_gbps": (0.5, 1.0, 2.0, 5.0), "shm_latency_us": (5.0, 20.0)}


def shm_topology(n, port_gbps):
    from jax_blink.topo import Topology

    return Topology.from_links(n, [(d, n, port_gbps, "shm") for d in range(n)], ["host memory"], f"shm:{n}")


def psum_schedule(size, n):
    """The schedule jax_blink.psum runs for ``size`` bytes per device on n CPU devices (the
    decision's own: the same plan, chunks and trees)."""
    from jax_blink.choice.requests import PlanRequest, schedule_for
    from jax_blink.topo import Topology

    return schedule_for(PlanRequest(Topology.preset(f"shm:{n}")), size // 4, "float32")[1]


def predict(sizes, n, params):
    """Simulated times of psum's schedules on a shm topology of the given port bandwidth."""
    from jax_blink.sim import SimModel, simulate

    topo = shm_topology(n, params["port_gbps"])
    model = SimModel(latency_us={"shm": params["shm_latency_us"]}, step_overhead_us=params["step_overhead_us"],
                     reduce_gbps=params["reduce_gbps"])
    return [simulate(psum_schedule(size, n), topo, model=model).time_us for size in sizes]


def rel_errors(predicted, measured):
    return [abs(p - m) / m for p, m in zip(predicted, measured)]


def plot_vs_real(result, devices, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from jax_blink.cli.sizes import format_size

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
    fig.savefig(path, dpi=110)
    plt.close(fig)


def vs_real(args) -> int:
    """The simulator against real jax_blink.psum runs on 8 virtual CPU devices.

    Measures ``jax_blink.psum`` (forced onto the plan at every size: ``JAX_BLINK_ALGO=blink``,
    ``min_bytes=0``) with :func:`jax_blink.measure.timing.run_devices`, simulates the
    schedule psum runs (its decision's own, ``choice.requests.schedule_for``: the same trees
    and chunks, whatever bandwidth the model assumes) and reports the relative error of the
    predicted time:

    * with the default (GPU-like) :class:`~jax_blink.sim.SimModel` on the ``shm:8`` preset,
      with a GPU-like nominal shared-memory latency of 0.5 us (the cost model's ``shm``
      entry, :data:`jax_blink.planning.cost.LATENCY_US`, is the CPU executor's measured
      2 ms step wait, which the fit below replaces too);
    * with a CPU model fitted on the even-indexed sizes (grid search over the shm port
      bandwidth, step overhead, reduction throughput and shm latency), its error reported on
      the odd-indexed sizes it was not fitted on.

    Writes ``sim_vs_real_<machine>.{json,md,png}``."""

    harness.cpu_devices(DEVICES)
    os.environ.setdefault("JAX_BLINK_ALGO", "blink")  # auto may pick lax.psum at some sizes

    from jax_blink.cli.sizes import format_size
    from jax_blink.measure.timing import run_devices
    from jax_blink.sim import SimModel
    from jax_blink.topo import Topology

    name = args.machine or harness.machine_tag()
    n = DEVICES
    rows, devices = run_devices(args.sizes, "float32", args.iters, min_bytes=0)
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
    out = harness.RESULTS / f"sim_vs_real_{name}"
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    lines = [f"# Simulator vs real jax_blink.psum ({devices})", "",
             f"Reproduce: `python benchmarks/bench_simulator.py vs_real --machine {name}`. "
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
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    plot_vs_real(result, devices, out.with_suffix(".png"))
    print("\n".join(lines))
    return 0


def main(argv=None) -> int:
    from jax_blink.cli.sizes import parse_sizes

    parser, command = harness.subcommands(__doc__)

    command(fidelity, "simulated time over the closed forms at 256 MB")
    p = command(vs_real, "the simulator against jax_blink.psum on 8 CPU devices")
    p.add_argument("--iters", type=int, default=20, help="runs per size (median)")
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("16K:16M:4"), help="bytes per device")
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
