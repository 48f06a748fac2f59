"""``python -m jax_blink plan``: plan a collective and show the trees.

Prints the trees, the rate against the certified bound and the ring
baseline, the family and the planning time; ``--json`` prints the plan's JSON
instead (:meth:`jax_blink.Plan.to_dict`, which ``Plan.from_json`` reads back,
plus ``"gpus"``: the machine's GPU at each rank), ``--png`` draws the topology
with each tree in its own colour. A topology of several hosts (``--hosts``,
or a JSON topology whose ``net`` links join groups of ranks) gets Blink's
three-phase allreduce: a reduce-scatter and an all-gather planned inside a
host, the hosts' network between them (:func:`jax_blink.planning.plan_hosts`).

    python -m jax_blink plan --topology dgx1-v100 --hosts 128 --nic-gbps 12.5

Pure Python: never imports jax.
"""

from __future__ import annotations

import json
import sys

from jax_blink.cli.common import add_topology_args, output_path, plain, topology_from_args, wrote
from jax_blink.planning import COLLECTIVES, PlanError, plan, plan_hosts
from jax_blink.topo import TopologyError

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    """Add the ``plan`` subcommand to an argparse ``subparsers`` object."""
    p = subparsers.add_parser("plan", help="plan a collective on a topology and show the trees",
                              description=plain(__doc__.split("\n\n")[0]))
    add_topology_args(p, required=True)
    p.add_argument("--collective", default="allreduce", choices=COLLECTIVES)
    p.add_argument("--root", type=int, default=None, help="root rank for broadcast/reduce (default 0)")
    p.add_argument("--max-trees", type=int, default=None, help="use at most this many trees")
    p.add_argument("--tolerance", type=float, default=0.0, help="accept this fraction below the optimum")
    p.add_argument("--links", default="all", choices=("all", "fast"),
                   help="all: plan over every link (NVLink, PCIe, QPI, NICs; default); fast: NVLink alone "
                        "wherever it joins the GPUs, for comparison")
    p.add_argument("--no-cache", action="store_true", help="plan afresh, ignoring the plan cache")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--png", help="draw the topology and trees into this PNG file")
    p.set_defaults(func=run)


def run(args) -> int:
    """Execute the ``plan`` subcommand; returns the exit status."""
    try:
        output_path(args.png, "--png", ".png")
        if args.max_trees is not None and args.max_trees < 1:
            raise ValueError(f"--max-trees must be at least 1, got {args.max_trees}")
        if not 0 <= args.tolerance < 1:  # also refuses nan
            raise ValueError(f"--tolerance must be at least 0 and below 1, got {args.tolerance}")
        topology, gpus = topology_from_args(args)
        if len(topology.host_ranks()) > 1 and args.collective == "allreduce":
            return _run_hosts(args, topology)
        gpus = gpus or list(range(topology.n))
        result = plan(topology, args.collective, root=args.root, max_trees=args.max_trees,
                      tolerance=args.tolerance, cache=not args.no_cache, links=args.links)
    except (TopologyError, PlanError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**result.to_dict(), "gpus": gpus}))
    else:
        print(result.summary())
        if args.gpus:
            print("  (ranks are positions in --gpus: " + ", ".join(f"{i}=GPU{g}" for i, g in enumerate(gpus)) + ")")
    if args.png:
        draw(result, args.png, labels=[f"GPU{g}" for g in gpus])
        wrote(args.png, "the trees")
    return 0


def _run_hosts(args, topology) -> int:
    """The three-phase allreduce of a topology of several hosts."""
    for option, value in (("--png", args.png), ("--root", args.root), ("--max-trees", args.max_trees)):
        if value is not None:
            raise ValueError(f"{option} does not apply to the three-phase allreduce of {topology.name}'s "
                             f"{len(topology.host_ranks())} hosts; plan one host (drop --hosts) to use it")
    result = plan_hosts(topology, links=args.links, cache=not args.no_cache)
    if args.json:
        print(json.dumps({"topology": topology.to_dict(), "hosts": [list(h) for h in result.hosts],
                          "reduce_scatter": result.reduce_scatter[0].to_dict(),
                          "allgather": result.allgather[0].to_dict(), "network_gbps": result.network_gbps,
                          "rate_gbps": result.rate_gbps, "plan_seconds": result.plan_seconds}))
    else:
        print(result.summary())
    return 0


def draw(result, path: str, labels=None) -> None:
    """Draw the plan's topology with each tree in its own colour into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    topology = result.topology
    n = topology.n
    links = [l for l in topology.links if l.kind in result.link_kinds]  # the links the plan may use
    switches = sorted({x for l in links for x in (l.u, l.v) if x >= n})
    angle = 2 * np.pi * np.arange(n) / n
    pos = {r: (np.cos(angle[r]), np.sin(angle[r])) for r in range(n)}
    for j, s in enumerate(switches):  # switches on an inner circle
        a = 2 * np.pi * (j + 0.5) / len(switches)
        pos[s] = (0.4 * np.cos(a), 0.4 * np.sin(a)) if len(switches) > 1 else (0.0, 0.0)
    fig, ax = plt.subplots(figsize=(7, 7))
    for link in links:
        (x0, y0), (x1, y1) = pos[link.u], pos[link.v]
        ax.plot([x0, x1], [y0, y1], color="lightgray", lw=1 + link.bandwidth_gbps / 25, zorder=1)
    # distinct colours: tab10 while it lasts, then tab20
    ntrees = len(result.trees)
    cmap = plt.get_cmap("tab10" if ntrees <= 10 else "tab20")
    colours = [cmap(i % cmap.N) for i in range(ntrees)]
    name_of = (lambda r: labels[r]) if labels else (lambda r: str(r))
    for i, tree in enumerate(result.trees):
        offset = 0.025 * (i - ntrees / 2)
        # broadcast edges solid, a split tree's reduce edges dashed and pointing up
        for path_nodes, style in [(p, "solid") for p in tree.paths] + [(p[::-1], "dashed") for p in tree.up_paths]:
            for x, y in zip(path_nodes, path_nodes[1:]):
                (x0, y0), (x1, y1) = pos[x], pos[y]
                ax.annotate("", xy=(x1 + offset, y1 + offset), xytext=(x0 + offset, y0 + offset),
                            arrowprops=dict(arrowstyle="-|>", mutation_scale=16, color=colours[i],
                                            lw=2, linestyle=style, shrinkA=14, shrinkB=14), zorder=2)
        ax.plot([], [], color=colours[i], lw=2,
                label=f"tree {i}: {tree.weight:.3g} GB/s, root {name_of(tree.root)}")
    for node, (x, y) in pos.items():
        is_rank = node < n
        name = name_of(node) if is_rank else topology.switches[node - n]
        ax.scatter([x], [y], s=1100 if is_rank else 600, color="white", edgecolor="black",
                   marker="o" if is_rank else "s", zorder=3)
        ax.text(x, y, name, ha="center", va="center", fontsize=7 if is_rank else 5, zorder=4)
    ax.set_title(f"{result.collective} on {topology.name}: {result.rate_gbps:.4g} GB/s "
                 f"(bound {result.bound_gbps:.4g}, {result.ring_text()}), family {result.family}")
    ax.legend(loc="upper left", fontsize=7, bbox_to_anchor=(1.0, 1.0))
    ax.set_axis_off()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
