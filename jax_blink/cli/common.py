"""What both commands share: the topology options, plain-text help, output paths
checked up front and reported, and counting allocations."""

from __future__ import annotations

import math
import os
import re
import sys

__all__ = ["plain", "output_path", "wrote", "allocations", "add_topology_args", "topology_from_args"]


def plain(doc: str) -> str:
    """A docstring as plain text for ``--help``: Sphinx roles and literal
    quotes dropped (``:func:`~x.y``` -> ``y``, ````x```` -> ``x``)."""
    doc = re.sub(r":\w+:`~[\w.]*\.(\w+)`", r"\1", doc)
    doc = re.sub(r":\w+:`([^`]+)`", r"\1", doc)
    return doc.replace("``", "")


def output_path(path, option: str, suffix: str):
    """``path`` if a file ending in ``suffix`` can be written there (checked
    before any long work, by creating it), else a ValueError naming ``option``."""
    if path is None:
        return None
    if os.path.isdir(path):
        raise ValueError(f"{option} {path}: is a folder; give a file name ending in {suffix}")
    if not path.lower().endswith(suffix):
        raise ValueError(f"{option} {path}: give a file name ending in {suffix}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{option} {path}: the folder {folder} does not exist")
    existed = os.path.exists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError as e:
        raise ValueError(f"{option} {path}: cannot write there ({e.strerror})") from None
    if not existed:
        os.remove(path)
    return path


def wrote(path, what: str) -> None:
    """Says on stderr where an output file went."""
    print(f"wrote {what} to {os.path.abspath(path)}", file=sys.stderr)


def allocations(n: int, smallest: int) -> int:
    """How many allocations of at least ``smallest`` of ``n`` ranks there are."""
    return sum(math.comb(n, k) for k in range(smallest, n + 1))


def add_topology_args(p, required: bool) -> None:
    """``--topology``, ``--gpus`` and the multi-host options ``--hosts``, ``--nic-gbps``, ``--nics``."""
    p.add_argument("--topology", required=required, default=None if required else "dgx1-v100",
                   help="preset name (e.g. dgx1-v100, shm:8) or topology JSON file"
                        + ("" if required else " (default: dgx1-v100)"))
    p.add_argument("--gpus", default=None,
                   help="comma-separated ranks of the allocation, e.g. 0,1,4,5 (default: all); with --hosts, "
                        "the ranks used on every host")
    p.add_argument("--hosts", type=int, default=None,
                   help="this many copies of the topology, joined by NICs to one network switch "
                        "(Topology.multi_host): plans and simulates Blink's three-phase allreduce")
    p.add_argument("--nic-gbps", type=float, default=12.5,
                   help="--hosts: bandwidth of each NIC in GB/s per direction (default 12.5, i.e. 100 Gb/s)")
    p.add_argument("--nics", type=int, default=1, help="--hosts: NICs per host (default 1)")


def _ranks(text):
    try:
        return [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise ValueError(f"--gpus {text!r}: expected comma-separated rank numbers, e.g. 0,1,4,5") from None


def topology_from_args(args):
    """``(topology, gpus)`` from the options of :func:`add_topology_args`.

    ``gpus`` is the list given to ``--gpus`` (None without it). With
    ``--hosts`` the topology is ``--hosts`` copies of the (sub)topology.

    Raises
    ------
    ValueError
        (TopologyError included) naming the option that is wrong.
    """
    from jax_blink.topo import Topology, load_topology

    topology = load_topology(args.topology)
    gpus = _ranks(args.gpus) if args.gpus else None
    if gpus is not None:
        topology = topology.subset(gpus)
    parts = topology.components()
    if len(parts) > 1 and len(topology.host_ranks()) == 1:
        raise ValueError(f"--topology {args.topology}: {topology.name} is disconnected: no link joins its "
                         f"{len(parts)} groups of ranks {' and '.join(str(list(p)) for p in parts)}")
    if args.hosts is not None:
        if args.hosts < 1:
            raise ValueError(f"--hosts must be >= 1, got {args.hosts}")
        topology = Topology.multi_host(topology, args.hosts, args.nic_gbps, args.nics)
    return topology, gpus
