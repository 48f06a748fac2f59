"""Parsing ``nvidia-smi``: the GPU link matrix as links and switch nodes, and NVLink state.

:func:`parse_topo_matrix` reads the ``topo -m`` matrix text;
:func:`parse_nvlink_status` (``nvlink -s``) and :func:`parse_nvlink_remote`
(``nvlink -R``) read each GPU's NVLinks, and :func:`nvlink_pair_state`
turns them into the GPU pairs whose links are down or slow (no process is run here;
:mod:`jax_blink.topo.detect` runs ``nvidia-smi``) and returns plain link
specs that :meth:`jax_blink.topo.Topology.from_nvidia_smi` builds a topology
from. Pure Python: never imports jax.
"""

from __future__ import annotations

import re

from .errors import TopologyError

__all__ = ["parse_topo_matrix", "parse_nvlink_status", "parse_nvlink_remote", "nvlink_pair_state"]


def parse_topo_matrix(text: str, *, nvlink_gbps: float = 25.0, pcie_gbps=16.0, sys_gbps=38.4) -> tuple:
    """Links and switches of the GPU matrix printed by ``nvidia-smi topo -m``.

    ``NV#`` cells become ``#`` NVLinks of ``nvlink_gbps`` each. The PCIe
    cells become a tree of switch nodes: GPUs that are ``PIX`` of one
    another share a PCIe switch, ``PXB`` groups share a switch above those,
    ``PHB`` groups a host bridge, ``NODE`` groups a NUMA node; NUMA nodes
    meet at a ``SYS`` interconnect of ``sys_gbps``. Every PCIe hop has
    ``pcie_gbps``. ``pcie_gbps`` and ``sys_gbps`` are one number (both
    directions) or a pair ``(up, down)``, ``up`` toward the CPUs (a GPU
    writing to the host) and ``down`` away from them, for links measured
    asymmetric (``nvidia-smi`` prints no bandwidths). Rows and columns that are not ``GPU<k>`` (NICs,
    affinity columns) are ignored.

    Returns
    -------
    (int, list, list)
        The number of GPUs, the links as ``(u, v, gbps, kind)`` (PCIe:
        ``(child, switch, up_gbps, "pcie", down_gbps)``) and the
        switch names (switch ``j`` is node ``n + j``).

    Raises
    ------
    TopologyError
        If the text holds no GPU matrix or a cell is not understood.

    Examples
    --------
    >>> rows = ["        GPU0    GPU1    GPU2",
    ...         "GPU0     X      NV2     PIX",
    ...         "GPU1    NV2      X      SYS",
    ...         "GPU2    PIX     SYS      X"]
    >>> text = "\\n".join(rows)
    >>> n, links, switches = parse_topo_matrix(text)
    >>> n, links[0], switches
    (3, (0, 1, 50.0, 'nvlink'), ['pix0', 'sys1'])
    >>> parse_topo_matrix(text, pcie_gbps=(12.0, 16.0))[1][1]  # GPU0 -> its PIX switch: up 12, down 16
    (0, 3, 12.0, 'pcie', 16.0)
    """
    pcie_gbps, sys_gbps = _up_down(pcie_gbps, "pcie_gbps"), _up_down(sys_gbps, "sys_gbps")
    # nvidia-smi underlines the header with ANSI escapes when it thinks it
    # writes to a terminal (seen on an H100 machine): drop them.
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", str(text))
    lines = [ln.rstrip() for ln in text.splitlines()]
    header_at = next((i for i, ln in enumerate(lines) if re.match(r"^\s+GPU0\b", ln)), None)
    if header_at is None:
        raise TopologyError("no GPU matrix in the nvidia-smi text: expected a header line starting with 'GPU0'")
    header = re.split(r"\s{2,}|\t+", lines[header_at].strip())
    gpu_cols = [i for i, h in enumerate(header) if re.fullmatch(r"GPU\d+", h)]
    gpus = [int(header[i][3:]) for i in gpu_cols]
    if gpus != list(range(len(gpus))):
        raise TopologyError(f"GPU columns {[header[i] for i in gpu_cols]} are not GPU0..GPU{len(gpus) - 1} in order")
    n = len(gpus)
    cells = {}
    for ln in lines[header_at + 1:]:
        m = re.match(r"^(GPU\d+)\s+(.*)$", ln)
        if not m:
            continue
        row = int(m.group(1)[3:])
        fields = re.split(r"\s+", m.group(2).strip())
        if len(fields) < n:
            raise TopologyError(f"row {m.group(1)} has {len(fields)} cells, expected at least {n}")
        if row >= n:
            raise TopologyError(f"row {m.group(1)} has no matching column in the header")
        cells[row] = fields[:n]
    missing = sorted(set(range(n)) - set(cells))
    if missing:
        raise TopologyError(f"nvidia-smi matrix lacks rows for GPU(s) {missing}")
    levels = ("PIX", "PXB", "PHB", "NODE", "SYS")
    for i in range(n):
        for j in range(n):
            cell = cells[i][j]
            if i == j and cell != "X":
                raise TopologyError(f"cell GPU{i}/GPU{j} is {cell!r}, expected 'X' on the diagonal")
            if i != j and cell not in levels and not re.fullmatch(r"NV\d+", cell):
                raise TopologyError(
                    f"cell GPU{i}/GPU{j} is {cell!r}; expected X, NV#, PIX, PXB, PHB, NODE or SYS")
    nvlinks, level_of = [], {}
    for i in range(n):
        for j in range(n):
            cell, mirror = cells[i][j], cells[j][i]
            if i == j:
                continue
            nv = re.fullmatch(r"NV(\d+)", cell)
            if cell != mirror:
                raise TopologyError(f"the matrix is not symmetric: GPU{i}/GPU{j} is {cell!r} "
                                    f"but GPU{j}/GPU{i} is {mirror!r}")
            if nv:
                if i < j:
                    nvlinks.append((i, j, int(nv.group(1)) * nvlink_gbps, "nvlink"))
            else:
                level_of[i, j] = levels.index(cell)
    switches = []
    pcie = _pcie_tree(n, level_of, levels, pcie_gbps, sys_gbps, switches)
    return n, nvlinks + pcie, switches



def _up_down(value, name):
    """``(up, down)`` from one bandwidth or a pair of them (checked by Topology later)."""
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise TopologyError(f"{name} must be one bandwidth or a pair (up, down) in GB/s, got {value!r:.60}")
        return tuple(value)
    return value, value


def _pcie_tree(n, level_of, levels, pcie_gbps, sys_gbps, switches):
    """Switch nodes and PCIe links for the nested groups of an nvidia-smi matrix.

    Appends switch names to ``switches`` and returns the links. A switch is
    made for each group at each level that joins two or more groups of the
    level below; a level whose groups are all unchanged adds nothing. Pairs
    joined by NVLink show no PCIe level in the matrix; the top level joins
    whatever groups remain.
    """
    links = []
    # current top node of each GPU's group, by group representative
    groups = {frozenset([g]): g for g in range(n)}
    for lvl, level_name in enumerate(levels):
        parent = list(range(n))

        def find(x):
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for (i, j), l in level_of.items():
            if l <= lvl:
                parent[find(i)] = find(j)
        if lvl == len(levels) - 1:  # the system joins everything (NVLink pairs hide their PCIe level)
            for g in range(1, n):
                parent[find(g)] = find(0)
        merged = {}
        for g in range(n):
            merged.setdefault(find(g), set()).add(g)
        new_groups = {}
        for members in merged.values():
            members = frozenset(members)
            children = [grp for grp in groups if grp <= members]
            if len(children) == 1:
                new_groups[members] = groups[children[0]]
                continue
            switch_id = n + len(switches)
            switches.append(f"{level_name.lower()}{len(switches)}")
            up, down = sys_gbps if level_name == "SYS" else pcie_gbps
            for child in children:
                links.append((groups[child], switch_id, up, "pcie", down))
            new_groups[members] = switch_id
        groups = new_groups
    return links


_GPU_HEADER = re.compile(r"^GPU\s+(\d+)\s*:")
_LINK_LINE = re.compile(r"^\s*Link\s+(\d+)\s*:\s*(.*?)\s*$")


def _per_gpu_links(text: str, what: str) -> dict:
    """``{gpu: {link: rest of the line}}`` of an ``nvidia-smi nvlink`` listing."""
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", str(text))
    out, gpu = {}, None
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _GPU_HEADER.match(line.strip())
        if m:
            gpu = int(m.group(1))
            if gpu in out:
                raise TopologyError(f"nvidia-smi {what}: GPU {gpu} is listed twice")
            out[gpu] = {}
            continue
        m = _LINK_LINE.match(line)
        if not m:
            raise TopologyError(f"nvidia-smi {what}: line {line.strip()!r:.80} is neither 'GPU <k>: ...' "
                                f"nor 'Link <i>: ...'")
        if gpu is None:
            raise TopologyError(f"nvidia-smi {what}: line {line.strip()!r:.80} comes before any 'GPU <k>:' line")
        link = int(m.group(1))
        if link in out[gpu]:
            raise TopologyError(f"nvidia-smi {what}: GPU {gpu} lists link {link} twice")
        out[gpu][link] = m.group(2)
    if not out:
        raise TopologyError(f"nvidia-smi {what}: no 'GPU <k>:' lines in the text")
    return out


def parse_nvlink_status(text: str) -> dict:
    """Each GPU's NVLinks and their speeds, from ``nvidia-smi nvlink -s``.

    ``nvidia-smi nvlink -s`` prints, per GPU, a ``GPU <k>: <name> (UUID:
    ...)`` line and one ``Link <i>: <speed> GB/s`` line per link, or
    ``Link <i>: <inactive>`` for a link that is down.

    Returns
    -------
    dict
        ``{gpu: {link: gbps}}``, ``gbps`` a float, or None for an inactive link.

    Raises
    ------
    TopologyError
        Naming the line that is not understood.

    Examples
    --------
    >>> parse_nvlink_status("GPU 0: Tesla V100-SXM2-16GB (UUID: GPU-1)\\n"
    ...                     "\\t Link 0: 25.781 GB/s\\n\\t Link 1: <inactive>\\n")
    {0: {0: 25.781, 1: None}}
    """
    out = {}
    for gpu, links in _per_gpu_links(text, "nvlink -s").items():
        out[gpu] = {}
        for link, rest in links.items():
            m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*GB/s", rest)
            if m:
                out[gpu][link] = float(m.group(1))
            elif rest.strip("<>").strip().lower() == "inactive":
                out[gpu][link] = None
            else:
                raise TopologyError(f"nvidia-smi nvlink -s: GPU {gpu} link {link} reads {rest!r:.60}; "
                                    f"expected '<speed> GB/s' or '<inactive>'")
    return out


def parse_nvlink_remote(text: str) -> dict:
    """The device at the far end of each GPU's NVLinks, from ``nvidia-smi nvlink -R``.

    ``nvidia-smi nvlink -R`` prints, per GPU, ``Link <i>: Remote Device
    <pci bus id>: Link <j>``; a link it cannot follow (inactive) may read
    anything else and is left out.

    Returns
    -------
    dict
        ``{gpu: {link: bus_id}}`` with bus ids as printed (compare them with
        :func:`jax_blink.topo.detect.normalize_bus_id`).

    Raises
    ------
    TopologyError
        Naming the line that is not understood.

    Examples
    --------
    >>> parse_nvlink_remote("GPU 0: Tesla V100 (UUID: GPU-1)\\n"
    ...                     "\\t Link 0: Remote Device 00000000:07:00.0: Link 4\\n")
    {0: {0: '00000000:07:00.0'}}
    """
    out = {}
    for gpu, links in _per_gpu_links(text, "nvlink -R").items():
        out[gpu] = {}
        for link, rest in links.items():
            m = re.fullmatch(r"Remote Device\s+([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+)(?::.*)?", rest)
            if m:
                out[gpu][link] = m.group(1)
    return out


def nvlink_pair_state(status: dict, remote: dict, gpu_of_bus: dict, pair_links: dict) -> tuple:
    """The GPU pairs whose NVLinks are down or slower than rated.

    A pair's rated state is the number of links ``nvidia-smi topo -m``
    reports for it (``NV#``) at the fastest speed any link of the machine
    runs at. Its live state is the links ``nvlink -R`` follows from the
    lower GPU to the other one, at the speeds ``nvlink -s`` reads (a link
    ``nvlink -s`` calls inactive counts nothing). A pair with no active link
    left is down; one with less than its rated bandwidth is degraded by the
    fraction it keeps.

    Parameters
    ----------
    status : dict
        :func:`parse_nvlink_status` output.
    remote : dict
        :func:`parse_nvlink_remote` output.
    gpu_of_bus : dict
        ``{normalized bus id: gpu index}`` of the machine's GPUs.
    pair_links : dict
        ``{(i, j): links}`` with ``i < j``: the NVLink count per pair from ``topo -m``.

    Returns
    -------
    (list, dict)
        The pairs that are down, and ``{pair: factor}`` for the degraded ones
        (``0 < factor < 1``).

    Examples
    --------
    >>> status = {0: {0: 25.0, 1: None}, 1: {0: 25.0, 1: None}}
    >>> remote = {0: {0: "0000:07:00.0"}, 1: {0: "0000:06:00.0"}}
    >>> nvlink_pair_state(status, remote, {"0000:06:00.0": 0, "0000:07:00.0": 1}, {(0, 1): 2})
    ([], {(0, 1): 0.5})
    """
    speeds = [g for links in status.values() for g in links.values() if g is not None]
    if not speeds:
        return sorted(pair_links), {}
    rated = max(speeds)
    down, factors = [], {}
    for (i, j), count in sorted(pair_links.items()):
        live = 0.0
        for link, bus in remote.get(i, {}).items():
            if gpu_of_bus.get(bus) == j:
                live += status.get(i, {}).get(link) or 0.0
        factor = live / (count * rated)
        if factor <= 0:
            down.append((i, j))
        elif factor < 1 - 1e-9:
            factors[(i, j)] = factor
    return down, factors
