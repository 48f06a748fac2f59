"""NCCL's allreduce time as NCCL's own tuner predicts it (ring, tree, NVLS x LL, LL128, Simple).

jax_blink's per-call choice on GPUs compares its schedules with ``lax.psum``,
which XLA runs with NCCL. Simulating NCCL's ring in pipelined chunks misses
what makes NCCL fast at small sizes: its low-latency protocols (LL, LL128)
and, on Hopper NVSwitch machines, NVLink SHARP (NVLS). This module predicts
NCCL the way NCCL chooses between its algorithms and protocols
(``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` in NCCL's
``src/graph/tuning.cc``, NVIDIA/nccl commit 5067397c, June 2026): per
(algorithm, protocol), a latency plus the bytes over a bus bandwidth capped
by the protocol, and NCCL runs the fastest. Every constant below is that
file's, named after its table.

What the tuner takes from NCCL's topology search is estimated from ours:

* the ring's bus bandwidth (``nChannels * bwIntra``) is the best NVLink ring
  packing's (:func:`jax_blink.planning.rings.best_rings`; NCCL builds the same
  rings), or on machines without an NVLink ring the PCIe fallback ring's
  bottleneck;
* the channel count is the fewest that carry that bandwidth at the per-channel
  LL128 rate (only the protocol caps use it);
* NVLS needs Hopper and an NVSwitch joining every GPU; its per-GPU bandwidth
  is the switch port's.

It models a single machine (the hierarchical cross-host phase is
:mod:`jax_blink.sim.hosts`'). Where the topology names no GPU generation
(custom topologies, ``shm:N``), there is no prediction: :func:`predict`
returns None and ``explain()`` says so.

Pure Python: never imports jax.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ..planning.rings import best_rings
from ..topo.presets import gpu_of

__all__ = ["NcclPrediction", "predict", "NCCL_SOURCE", "ARCH_OF_GPU"]

#: Where the constants come from.
NCCL_SOURCE = "NVIDIA/nccl src/graph/tuning.cc, commit 5067397c (2026-06-11)"

#: NCCL's compute-capability index of each GPU (Pascal, compute capability 6.0,
#: falls in NCCL's Volta row, below 8.0).
ARCH_OF_GPU = {"P100": "volta", "V100": "volta", "A100": "ampere", "H100": "hopper"}
#: The compute capability (x 10) of each GPU: LL128 needs 70 or more.
COMPCAP_OF_GPU = {"P100": 60, "V100": 70, "A100": 80, "H100": 90}

# ncclTunerConstantsDefaults.baseLatencies (us), [algorithm][protocol]
BASE_LAT_US = {"tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
               "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4},
               "nvls": {"Simple": 0.0}}
# ncclTunerConstantsDefaults.hwLatencies (us), [NVLINK | PCI][algorithm][protocol]
HW_LAT_US = {"nvlink": {"tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
                        "ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
                        "nvls": {"Simple": 25.0}},
             "pci": {"tree": {"LL": 1.0, "LL128": 1.9, "Simple": 4.0},
                     "ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7}}}
# llMaxBws (GB/s), single node: the GPU generation's row, first column
LL_MAX_BW = {"volta": 39.0, "ampere": 87.7, "hopper": 141.0}
# perChMaxRingLL128Bws, perChMaxTreeLL128Bws, perChMaxTreeBws (GB/s per channel), one node
PER_CH_MAX_RING_LL128 = {"volta": 20.0, "ampere": 20.0, "hopper": 36.7}
PER_CH_MAX_TREE_LL128 = {"volta": 20.0, "ampere": 20.0, "hopper": 36.7}
PER_CH_MAX_TREE = {"volta": 26.5, "ampere": 24.0, "hopper": 38.7}
# nvlsEfficiency
NVLS_EFFICIENCY = {"hopper": 0.85}
# treeCorrectionFactor[protocol][log2(bytes / 64)], 64 B to 256 MB
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0,
           1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0,
              1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9,
               .9),
}
#: NCCL's NVLS channels on a Hopper NVSwitch machine (its default for 8 GPUs).
NVLS_CHANNELS = 16


@dataclasses.dataclass(frozen=True)
class NcclPrediction:
    """NCCL's predicted allreduce: the fastest (algorithm, protocol) and every one's time."""

    seconds: float
    algorithm: str
    protocol: str
    times: dict  # (algorithm, protocol) -> seconds

    def describe(self) -> str:
        return f"NCCL {self.algorithm}/{self.protocol} (its tuner's model)"


def _ring_busbw(topology):
    """``(bus bandwidth GB/s, over NVLink)``: the best NVLink ring packing's per-rank
    bandwidth, or the PCIe fallback ring's bottleneck."""
    rings = best_rings(topology)
    if rings.rings:
        return float(sum(rings.weights_gbps)), True
    graph = topology.link_graph(topology.kinds())
    order = list(range(topology.n))
    return float(min(graph.route_bandwidth_gbps(u, v) for u, v in zip(order, order[1:] + order[:1]))), False


def _nvswitch_port_gbps(topology) -> Optional[float]:
    """The per-GPU port of one NVSwitch joining every rank, or None."""
    for s in range(topology.n, topology.num_nodes):
        ports = [l.forward_gbps for l in topology.links if l.kind == "nvlink" and s in (l.u, l.v)
                 and min(l.u, l.v) < topology.n]
        if len(ports) == topology.n:
            return min(ports)
    return None


def predict(topology, size_bytes: int) -> Optional[NcclPrediction]:
    """NCCL's allreduce of ``size_bytes`` per rank on ``topology`` (one machine), by
    NCCL's tuner model; None where the topology names no GPU generation.

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> p = predict(Topology.preset("hgx-h100"), 2**30)
    >>> p.algorithm, p.protocol
    ('nvls', 'Simple')
    >>> predict(Topology.preset("dgx1-v100"), 1024).protocol
    'LL'
    >>> predict(Topology.preset("shm:8"), 1024) is None
    True
    """
    gpu = gpu_of(topology)
    n = topology.n
    if gpu is None or n < 2:
        return None
    arch = ARCH_OF_GPU[gpu]
    busbw, nvlink = _ring_busbw(topology)
    hw = "nvlink" if nvlink else "pci"
    channels = max(1, math.ceil(busbw / PER_CH_MAX_RING_LL128[arch]))
    protocols = ["LL", "Simple"] + (["LL128"] if nvlink and COMPCAP_OF_GPU[gpu] >= 70 else [])
    nsteps = 2 * (n - 1)
    log_size = int(math.log2(max(size_bytes >> 6, 1))) if size_bytes >= 64 else -1
    times = {}
    for proto in protocols:
        # ring: algorithm bandwidth = bus bandwidth * n / nsteps
        bw = busbw
        if proto == "LL":
            bw = min(LL_MAX_BW[arch], busbw * 0.5)
        elif proto == "LL128":
            bw = min(busbw * 0.92, channels * PER_CH_MAX_RING_LL128[arch])
        lat = BASE_LAT_US["ring"][proto] + nsteps * HW_LAT_US[hw]["ring"][proto]
        times[("ring", proto)] = (lat + size_bytes / (1000 * bw * n / nsteps)) * 1e-6
        # tree (allreduce): bus bandwidth capped, algorithm bandwidth = bus / 2
        bw = min(busbw * 0.92, channels * PER_CH_MAX_TREE[arch])
        if proto == "LL":
            bw = min(bw / 3.8, LL_MAX_BW[arch])
        elif proto == "LL128":
            bw = min(bw * 7.0 / 9.0, channels * PER_CH_MAX_TREE_LL128[arch])
        if 0 <= log_size < 23:
            bw *= TREE_CORRECTION[proto][log_size]
        lat = BASE_LAT_US["tree"][proto] + 2 * (n - 1) * HW_LAT_US[hw]["tree"][proto]
        times[("tree", proto)] = (lat + size_bytes / (1000 * bw * 0.5)) * 1e-6
    port = _nvswitch_port_gbps(topology)
    if arch in NVLS_EFFICIENCY and port is not None:
        # intraBw per channel x channels: the port's bandwidth, at NVLS's efficiency, twice for
        # an allreduce (the switch reduces); algorithm bandwidth = bus * n / nsteps
        busbw_nvls = port * NVLS_EFFICIENCY[arch] * (NVLS_CHANNELS - 1) / NVLS_CHANNELS * 2
        lat = BASE_LAT_US["nvls"]["Simple"] + HW_LAT_US["nvlink"]["nvls"]["Simple"]
        times[("nvls", "Simple")] = (lat + size_bytes / (1000 * busbw_nvls * n / nsteps)) * 1e-6
    (algorithm, protocol), seconds = min(times.items(), key=lambda kv: kv[1])
    return NcclPrediction(seconds, algorithm, protocol, times)
