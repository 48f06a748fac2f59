"""Topology of the live machine: the only module of jax_blink that touches hardware.

It runs ``nvidia-smi`` when the tool exists: ``nvidia-smi topo -m`` for the
link matrix (parsed by :meth:`jax_blink.topo.Topology.from_nvidia_smi`)
and ``nvidia-smi --query-gpu=index,pci.bus_id,uuid`` to find which of the
machine's GPUs a job was given; ``nvidia-smi nvlink -s`` and ``nvlink -R``
for each NVLink's state (:func:`apply_nvlink_state`: links that are down are
removed, links below their rated speed degraded). ``nvidia-smi`` lists every GPU of the
machine whatever ``CUDA_VISIBLE_DEVICES`` says, so a partial allocation (the
case Blink exists for) is mapped back to it: by PCI bus id when the CUDA
runtime reported one per device, else through ``CUDA_VISIBLE_DEVICES``.
:func:`detect_network_gbps` reads this host's network bandwidth from sysfs.
Pure Python: never imports jax.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Optional, Sequence

from .errors import TopologyError
from .nvidia_smi import nvlink_pair_state, parse_nvlink_remote, parse_nvlink_status
from .topology import Topology

__all__ = ["detect", "detect_allocation", "gpu_table", "parse_gpu_table", "normalize_bus_id",
           "smi_indices", "detect_network_gbps", "apply_nvlink_state"]


def _nvidia_smi(args, timeout_s):
    """``nvidia-smi args`` output, or None where the tool is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        result = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


def detect(timeout_s: float = 10.0, **bandwidths) -> Optional[Topology]:
    """The GPU topology of this machine (every GPU ``nvidia-smi`` lists), or None
    where ``nvidia-smi`` is absent or fails.

    Parameters
    ----------
    timeout_s : float
        How long to wait for ``nvidia-smi``.
    **bandwidths
        Passed to :meth:`Topology.from_nvidia_smi` (``nvlink_gbps``,
        ``pcie_gbps``, ``sys_gbps``): ``nvidia-smi topo -m`` shows link
        counts, not speeds.

    Raises
    ------
    jax_blink.topo.TopologyError
        If ``nvidia-smi`` ran but printed a matrix that cannot be parsed.
    """
    text = _nvidia_smi(["topo", "-m"], timeout_s)
    if text is None:
        return None
    topology = Topology.from_nvidia_smi(text, name="detected", **bandwidths)
    status = _nvidia_smi(["nvlink", "-s"], timeout_s)
    remote = _nvidia_smi(["nvlink", "-R"], timeout_s)
    table = gpu_table(timeout_s)
    if status is None or remote is None or table is None or not status.strip():
        return topology  # no NVLink state to read (no NVLink, or an older nvidia-smi)
    return apply_nvlink_state(topology, status, remote, table, bandwidths.get("nvlink_gbps", 25.0))


def apply_nvlink_state(topology: Topology, status_text: str, remote_text: str, table: Sequence[tuple],
                       nvlink_gbps: float = 25.0) -> Topology:
    """``topology`` (from ``nvidia-smi topo -m``) with its NVLinks' live state applied.

    Pairs whose every NVLink ``nvidia-smi nvlink -s`` reads as inactive are
    removed (:meth:`Topology.without`), pairs whose links run below the
    machine's fastest link speed, or with some links inactive, are scaled
    (:meth:`Topology.degraded`); see
    :func:`jax_blink.topo.nvidia_smi.nvlink_pair_state`.

    Parameters
    ----------
    topology : Topology
        The machine's topology from ``nvidia-smi topo -m``: ranks are
        ``nvidia-smi`` indices.
    status_text, remote_text : str
        The output of ``nvidia-smi nvlink -s`` and ``nvidia-smi nvlink -R``.
    table : sequence of (int, str, str)
        :func:`parse_gpu_table` output (index, bus id, uuid), to know which
        GPU each link's remote bus id is.
    nvlink_gbps : float
        The bandwidth ``topology`` gives one NVLink (to count each pair's links).

    Returns
    -------
    Topology
        ``topology`` itself when every NVLink is healthy, else a new one
        named ``"<name> (N link(s) down, M degraded)"``.

    Raises
    ------
    TopologyError
        If an output cannot be parsed.
    """
    status = parse_nvlink_status(status_text)
    remote = {gpu: {link: normalize_bus_id(bus) for link, bus in links.items()}
              for gpu, links in parse_nvlink_remote(remote_text).items()}
    gpu_of_bus = {normalize_bus_id(bus): index for index, bus, _ in table}
    pair_links = {(l.u, l.v): max(1, round(l.bandwidth_gbps / nvlink_gbps))
                  for l in topology.links if l.kind == "nvlink" and l.v < topology.n}
    down, factors = nvlink_pair_state(status, remote, gpu_of_bus, pair_links)
    if not down and not factors:
        return topology
    damaged = topology.without(down) if down else topology
    if factors:
        damaged = damaged.degraded(factors)
    return Topology(damaged.n, damaged.links, list(damaged.switches),
                    f"{topology.name} ({len(down)} link(s) down, {len(factors)} degraded)", damaged.reduce_gbps)


def normalize_bus_id(bus_id: str) -> str:
    """A PCI bus id as ``dddd:bb:dd.f`` in lower-case hex.

    ``nvidia-smi`` prints an 8-digit domain (``00000000:07:00.0``), the CUDA
    runtime a 4-digit one (``0000:07:00.0``).

    >>> normalize_bus_id("00000000:0A:00.0")
    '0000:0a:00.0'
    """
    m = re.fullmatch(r"\s*(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)\s*",
                     str(bus_id))
    if m is None:
        raise TopologyError(f"{bus_id!r} is not a PCI bus id (domain:bus:device.function)")
    domain, bus, dev, fn = (int(g, 16) if g else 0 for g in m.groups())
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def parse_gpu_table(text: str) -> list:
    """``(index, bus_id, uuid)`` per GPU from ``nvidia-smi
    --query-gpu=index,pci.bus_id,uuid --format=csv,noheader``.

    >>> parse_gpu_table("0, 00000000:07:00.0, GPU-aa\\n1, 00000000:0A:00.0, GPU-bb\\n")
    [(0, '0000:07:00.0', 'GPU-aa'), (1, '0000:0a:00.0', 'GPU-bb')]
    """
    rows = []
    for line in str(text).splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 3 or not fields[0].isdigit():
            raise TopologyError(f"unexpected nvidia-smi --query-gpu line {line!r}: expected "
                                "'index, pci.bus_id, uuid'")
        rows.append((int(fields[0]), normalize_bus_id(fields[1]), fields[2]))
    return rows


def gpu_table(timeout_s: float = 10.0) -> Optional[list]:
    """:func:`parse_gpu_table` of this machine, or None without ``nvidia-smi``."""
    text = _nvidia_smi(["--query-gpu=index,pci.bus_id,uuid", "--format=csv,noheader"], timeout_s)
    return None if text is None else parse_gpu_table(text)


def smi_indices(ordinals: Sequence[int], table: Sequence[tuple], *,
                bus_ids: Optional[Sequence[str]] = None,
                visible: Optional[str] = None) -> list:
    """The ``nvidia-smi`` index of each CUDA device ordinal.

    Parameters
    ----------
    ordinals : sequence of int
        CUDA device ordinals (``jax.Device.local_hardware_id``), one per rank.
    table : sequence of (index, bus_id, uuid)
        :func:`parse_gpu_table` of the machine.
    bus_ids : sequence of str, optional
        The PCI bus id of each ordinal as the CUDA runtime reports it: the
        reliable mapping, used when given.
    visible : str, optional
        ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs, comma-separated): ordinal
        ``i`` is its ``i``-th entry. Without either, ordinal ``i`` is GPU ``i``.

    Raises
    ------
    jax_blink.topo.TopologyError
        If a device cannot be found among the machine's GPUs.

    Examples
    --------
    >>> table = [(0, "0000:07:00.0", "GPU-a"), (1, "0000:0a:00.0", "GPU-b"),
    ...          (2, "0000:47:00.0", "GPU-c")]
    >>> smi_indices([0, 1], table, bus_ids=["0000:47:00.0", "0000:07:00.0"])
    [2, 0]
    >>> smi_indices([0, 1], table, visible="2,1")
    [2, 1]
    >>> smi_indices([0], table, visible="GPU-b")
    [1]
    """
    by_bus = {bus: index for index, bus, _ in table}
    if bus_ids is not None:
        out = []
        for ordinal, bus in zip(ordinals, bus_ids):
            key = normalize_bus_id(bus)
            if key not in by_bus:
                raise TopologyError(f"CUDA device {ordinal} (PCI {key}) is not among the GPUs "
                                    f"nvidia-smi lists ({sorted(by_bus)})")
            out.append(by_bus[key])
        return out
    entries = [e.strip() for e in visible.split(",")] if visible and visible.strip() else None
    out = []
    for ordinal in ordinals:
        if entries is None:
            out.append(int(ordinal))
            continue
        if ordinal >= len(entries):
            raise TopologyError(f"CUDA device {ordinal} has no entry in CUDA_VISIBLE_DEVICES="
                                f"{visible!r}")
        entry = entries[ordinal]
        if entry.isdigit():
            out.append(int(entry))
            continue
        matches = [index for index, _, uuid in table if uuid.startswith(entry)]
        if len(matches) != 1:
            raise TopologyError(f"CUDA_VISIBLE_DEVICES entry {entry!r} matches "
                                f"{len(matches)} GPUs of nvidia-smi (expected one UUID)")
        out.append(matches[0])
    return out


def detect_allocation(ordinals: Sequence[int], *, bus_ids: Optional[Sequence[str]] = None,
                      visible: Optional[str] = None, timeout_s: float = 10.0,
                      **bandwidths) -> Optional[Topology]:
    """The topology of the GPUs a job was given, rank ``i`` being CUDA device
    ``ordinals[i]``: the machine's topology (:func:`detect`) restricted to
    those GPUs (:meth:`Topology.subset`). None without ``nvidia-smi``.

    See :func:`smi_indices` for ``bus_ids`` and ``visible``.

    Raises
    ------
    jax_blink.topo.TopologyError
        If ``nvidia-smi``'s output cannot be parsed or a device is not found.
    """
    machine = detect(timeout_s, **bandwidths)
    table = gpu_table(timeout_s)
    if machine is None or table is None:
        return None
    if len(table) != machine.n:
        raise TopologyError(f"nvidia-smi lists {len(table)} GPUs but its topology matrix has "
                            f"{machine.n}")
    indices = smi_indices(ordinals, table, bus_ids=bus_ids, visible=visible)
    name = f"detected[{','.join(map(str, indices))}]"
    return machine.subset(indices, name=name)


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def detect_network_gbps(sysfs: Path = Path("/sys")) -> Optional[tuple]:
    """``(GB/s per direction, what)``: this host's bandwidth to the network, or None.

    The active ports of its RDMA devices (``/sys/class/infiniband/*/ports/*``: state
    ``ACTIVE``, rate ``"200 Gb/sec (4X HDR)"``), InfiniBand or RoCE, which NCCL uses
    across hosts; without any, its physical Ethernet interfaces that are up
    (``/sys/class/net/*`` with a ``device``, ``operstate`` ``up``, ``speed`` in Mb/s),
    which NCCL's sockets use. Each is counted once, summed; ``what`` names them.

    Examples
    --------
    >>> detect_network_gbps(Path("/nonexistent")) is None
    True
    """
    ports = []
    for port in sorted((sysfs / "class" / "infiniband").glob("*/ports/*")):
        state, rate = _read(port / "state"), _read(port / "rate")
        match = re.match(r"\s*([0-9.]+)\s*Gb/sec", rate or "")
        if state is not None and "ACTIVE" in state and match and float(match.group(1)) > 0:
            ports.append((f"{port.parent.parent.name} port {port.name}", float(match.group(1)) / 8))
    if not ports:
        for nic in sorted((sysfs / "class" / "net").glob("*")):
            speed = _read(nic / "speed")
            if (nic / "device").exists() and _read(nic / "operstate") == "up" and speed is not None \
                    and re.fullmatch(r"[0-9]+", speed) and int(speed) > 0:
                ports.append((nic.name, int(speed) / 8000))
    if not ports:
        return None
    total = sum(gbps for _, gbps in ports)
    return total, ", ".join(f"{name} {gbps * 8:g} Gb/s" for name, gbps in ports)
