"""Parsing ``nvidia-smi topo -m``: the GPU link matrix as links and switch nodes.

:func:`parse_topo_matrix` reads the matrix text (no process is run here;
:mod:`jax_blink.topo.detect` runs ``nvidia-smi``) and returns plain link
specs that :meth:`jax_blink.topo.Topology.from_nvidia_smi` builds a topology
from. Pure Python: never imports jax.
"""

from __future__ import annotations

import re

from .errors import TopologyError

__all__ = ["parse_topo_matrix"]


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
