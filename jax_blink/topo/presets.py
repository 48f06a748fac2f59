"""Topology presets of common machines, as plain functions.

Bandwidths are nominal, in GB/s per direction per link (or per switch port):

| preset | ranks | fast links | slow links |
|--------|-------|------------|------------|
| `dgx1-p100` | 8 | NVLink1 hybrid cube-mesh: 16 GPU pairs, 1 link × 20 GB/s each | PCIe gen3 x16 (16 GB/s): GPU pairs 0-1, 2-3, 4-5, 6-7 under one PCIe switch each, two switches per CPU, CPUs joined by QPI (38.4 GB/s) |
| `dgx1-v100` | 8 | NVLink2 hybrid cube-mesh: 16 GPU pairs × 25 GB/s, pairs 0-1, 0-4, 1-3, 2-3, 2-6, 4-5, 5-7, 6-7 with 2 links (50 GB/s) | as `dgx1-p100` |
| `dgx2` | 16 | NVSwitch fabric: one switch node, 150 GB/s port per GPU (6 × NVLink2) | none modelled |
| `dgx-a100` | 8 | NVSwitch: one switch node, 300 GB/s port per GPU (12 × NVLink3) | none modelled |
| `hgx-h100` | 8 | NVSwitch: one switch node, 450 GB/s port per GPU (18 × NVLink4) | none modelled |
| `pcie` | 8 | none | PCIe gen3 x16 (16 GB/s) tree: 2 GPUs per PCIe switch, 2 switches per CPU, CPUs joined by QPI (38.4 GB/s) |
| `shm:N` | N | none | one "host memory" switch node, 10 GB/s shm port per device (memory copy bandwidth of one core) |

Each preset is a plain function returning a :class:`PresetSpec` (the
arguments of :class:`~jax_blink.topo.Topology`), which
``Topology.preset(name)`` builds. The DGX-1 NVLink pairs are DESIGN.md's
reference wiring; real machines may number GPUs differently, which
:mod:`jax_blink.topo.detect` reads from ``nvidia-smi``. Pure Python: never
imports jax.
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import TopologyError
from .limits import MAX_NODES

__all__ = ["PresetSpec", "preset_spec", "preset_names", "gpu_of", "dgx1_p100", "dgx1_v100", "dgx2", "dgx_a100",
           "hgx_h100", "pcie", "shm", "shm_processes"]

#: The 16 NVLink pairs of a DGX-1 (hybrid cube-mesh).
DGX1_PAIRS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3), (4, 5), (4, 6), (4, 7), (5, 6),
              (5, 7), (6, 7), (0, 4), (1, 5), (2, 6), (3, 7))
#: DGX-1V pairs with two NVLink2 links.
DGX1V_DOUBLE_PAIRS = ((0, 1), (0, 4), (1, 3), (2, 3), (2, 6), (4, 5), (5, 7), (6, 7))

PCIE_GEN3_X16_GBPS = 16.0
QPI_GBPS = 38.4
#: How fast one GPU reduces, in GB/s of incoming data: a third of its memory
#: bandwidth (a reduction reads two operands and writes one). P100 732 GB/s,
#: V100 900, A100 40 GB 1555, H100 SXM 3350 (the vendors' data sheets).
REDUCE_GBPS = {"P100": 732 / 3, "V100": 900 / 3, "A100": 1555 / 3, "H100": 3350 / 3}
SHM_PORT_GBPS = 10.0


def gpu_of(topology):
    """The GPU a topology's ranks are (``"P100"``, ``"V100"``, ``"A100"``, ``"H100"``),
    known from the reducer rate a preset sets (:data:`REDUCE_GBPS`, kept by subsets,
    several hosts and JSON), or None (``shm:N``, custom topologies).

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> gpu_of(Topology.preset("dgx1-v100").subset([0, 3])), gpu_of(Topology.preset("shm:4"))
    ('V100', None)
    """
    rate = getattr(topology, "reduce_gbps", None)
    if rate is None:
        return None
    return next((gpu for gpu, r in REDUCE_GBPS.items() if abs(r - rate) <= 1e-9 * r), None)


class PresetSpec(NamedTuple):
    """A machine as plain data: the arguments of :class:`~jax_blink.topo.Topology`.

    Attributes
    ----------
    n : int
        Ranks.
    links : list of tuple
        ``(u, v, gbps, kind)``.
    switches : list of str
        Names of the switch nodes ``n, n+1, ...``.
    name : str
    reduce_gbps : float or None
        How fast one GPU reduces (:data:`REDUCE_GBPS`), None where the preset names no GPU.
    """

    n: int
    links: list
    switches: list
    name: str
    reduce_gbps: float | None = None


def _pcie_tree_8gpu():
    """Switch names and links of an 8-GPU, 2-socket PCIe tree.

    Switches 8..11 are PCIe switches over GPU pairs (0,1), (2,3), (4,5),
    (6,7); 12 and 13 are the CPUs (root complexes), joined by QPI.
    """
    switches = ["pcie-switch0", "pcie-switch1", "pcie-switch2", "pcie-switch3", "cpu0", "cpu1"]
    links = []
    for s in range(4):
        for g in (2 * s, 2 * s + 1):
            links.append((g, 8 + s, PCIE_GEN3_X16_GBPS, "pcie"))
        links.append((8 + s, 12 + s // 2, PCIE_GEN3_X16_GBPS, "pcie"))
    links.append((12, 13, QPI_GBPS, "pcie"))
    return switches, links


def _dgx1(name, gbps_per_link, double_pairs, gpu):
    switches, links = _pcie_tree_8gpu()
    for u, v in DGX1_PAIRS:
        count = 2 if (u, v) in double_pairs else 1
        links.append((u, v, count * gbps_per_link, "nvlink"))
    return PresetSpec(8, links, switches, name, REDUCE_GBPS[gpu])


def dgx1_p100() -> PresetSpec:
    """DGX-1 with P100s: NVLink1 (20 GB/s per link) cube-mesh plus PCIe."""
    return _dgx1("dgx1-p100", 20.0, (), "P100")


def dgx1_v100() -> PresetSpec:
    """DGX-1 with V100s: NVLink2 (25 GB/s per link, 8 doubled pairs) cube-mesh plus PCIe."""
    return _dgx1("dgx1-v100", 25.0, DGX1V_DOUBLE_PAIRS, "V100")


def _nvswitch(name, n, port_gbps, gpu):
    return PresetSpec(n, [(g, n, port_gbps, "nvlink") for g in range(n)], ["nvswitch"], name, REDUCE_GBPS[gpu])


def dgx2() -> PresetSpec:
    """DGX-2: 16 V100s on an NVSwitch fabric, 150 GB/s per GPU port."""
    return _nvswitch("dgx2", 16, 150.0, "V100")


def dgx_a100() -> PresetSpec:
    """DGX A100: 8 A100s on NVSwitch, 300 GB/s per GPU port."""
    return _nvswitch("dgx-a100", 8, 300.0, "A100")


def hgx_h100() -> PresetSpec:
    """HGX H100: 8 H100s on NVSwitch, 450 GB/s per GPU port."""
    return _nvswitch("hgx-h100", 8, 450.0, "H100")


def pcie() -> PresetSpec:
    """8 GPUs under PCIe gen3 switches on two CPUs, no NVLink."""
    switches, links = _pcie_tree_8gpu()
    return PresetSpec(8, links, switches, "pcie")


def shm(n: int) -> PresetSpec:
    """``n`` devices sharing host memory: one switch node, 10 GB/s per port.

    ``n`` is at most ``MAX_NODES - 1`` (the host memory is a node too).
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n < MAX_NODES:
        raise TopologyError(f"shm needs a positive number of devices of at most {MAX_NODES - 1}, got {n!r:.40}")
    return PresetSpec(n, [(d, n, SHM_PORT_GBPS, "shm") for d in range(n)], ["host memory"], f"shm:{n}")


def shm_processes(process_of) -> PresetSpec:
    """Devices sharing host memory from several processes: ``process_of[d]`` is device
    ``d``'s process (0, 1, ...). Each device has a 10 GB/s port to its process's memory
    (a switch node per process, "process p memory"), and each process's memory a link of
    half that to the host's memory (one more switch): a chunk that crosses processes is
    copied into its sender's shared arena and read from there (the host transport,
    ``cc/sync/host_rendezvous.h``), two memory passes instead of one. Trees packed on it
    reduce within a process before crossing (2 processes x 4 CPU devices, 4e6 float32:
    8.9-10.5 ms against 9.3-13.1 ms on ``shm:8``, in alternating runs on 2 cores).

    Examples
    --------
    >>> spec = shm_processes([0, 0, 1, 1])
    >>> spec.name, spec.switches
    ('shm:4 in 2 processes', ['process 0 memory', 'process 1 memory', 'host memory'])
    """
    owners = [int(p) for p in process_of]
    n, procs = len(owners), sorted(set(owners))
    if not 1 <= n < MAX_NODES - len(procs) or procs != list(range(len(procs))):
        raise TopologyError(f"shm_processes needs processes numbered 0, 1, ... for at most "
                            f"{MAX_NODES - 2} devices, got {owners!r:.60}")
    host = n + len(procs)
    links = [(d, n + p, SHM_PORT_GBPS, "shm") for d, p in enumerate(owners)]
    links += [(n + p, host, SHM_PORT_GBPS / 2, "shm") for p in procs]
    return PresetSpec(n, links, [f"process {p} memory" for p in procs] + ["host memory"],
                      f"shm:{n} in {len(procs)} processes")


_PRESETS = {
    "dgx1-p100": dgx1_p100,
    "dgx1-v100": dgx1_v100,
    "dgx2": dgx2,
    "dgx-a100": dgx_a100,
    "hgx-h100": hgx_h100,
    "pcie": pcie,
}


def preset_names() -> list:
    """Names :func:`preset_spec` accepts (``shm:N`` takes any positive N).

    Examples
    --------
    >>> preset_names()[-2:]
    ['pcie', 'shm:N']
    """
    return sorted(_PRESETS) + ["shm:N"]


def preset_spec(name: str) -> PresetSpec:
    """The preset called ``name`` (in any letter case), as plain data.

    Examples
    --------
    >>> preset_spec("SHM:2")
    PresetSpec(n=2, links=[(0, 2, 10.0, 'shm'), (1, 2, 10.0, 'shm')], switches=['host memory'], name='shm:2', reduce_gbps=None)

    Raises
    ------
    TopologyError
        If ``name`` is unknown; the message lists the valid names.
    """
    if not isinstance(name, str):
        raise TopologyError(f"a topology preset name must be a string, got {name!r:.40}; "
                            f"valid names: {', '.join(preset_names())}")
    key = name.strip().lower()
    if key in _PRESETS:
        return _PRESETS[key]()
    if key.startswith("shm:"):
        count = key[4:]
        if not (count.isascii() and count.isdigit()) or int(count) < 1:
            raise TopologyError(f"preset {name!r:.40}: N in shm:N must be a positive integer, e.g. shm:8")
        if len(count) > len(str(MAX_NODES)) or int(count) >= MAX_NODES:
            raise TopologyError(f"preset {name!r:.40}: shm:N takes at most {MAX_NODES - 1} devices")
        return shm(int(count))
    raise TopologyError(f"unknown topology preset {name!r:.40}; valid names (any letter case): "
                        f"{', '.join(preset_names())}")
