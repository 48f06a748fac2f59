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

:func:`predict` models one machine's allreduce and :func:`predict_collective` its
reduce-scatter and all-gather. :func:`predict_hosts` and
:func:`predict_collective_hosts` model several machines of the same kind joined by
a network: NCCL's tuner with ``nNodes > 1``
(its network latencies, the per-channel caps of its two- and more-node
columns, the ring's plateau factor), where the bandwidth its graph search
finds is estimated as the smaller of the host's ring bandwidth and the
host's network bandwidth (the search's rings and trees cross every host
through its NICs), and its latency to the network (``latencyInter``) as 0.
Where the topology names no GPU generation (custom topologies, ``shm:N``),
there is no prediction: both return None and ``explain()`` says so.

Pure Python: never imports jax.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple, Optional

from ..planning.rings import best_rings
from ..topo.presets import gpu_of

__all__ = ["NcclPrediction", "predict", "predict_hosts", "predict_collective", "predict_collective_hosts",
           "NCCL_SOURCE", "ARCH_OF_GPU"]

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
# ncclTunerConstantsDefaults.hwLatencies (us), [NVLINK | PCI | NET][algorithm][protocol]
HW_LAT_US = {"nvlink": {"tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
                        "ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
                        "nvls": {"Simple": 25.0}, "nvls_tree": {"Simple": 25.0}},
             "pci": {"tree": {"LL": 1.0, "LL128": 1.9, "Simple": 4.0},
                     "ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7}},
             "net": {"tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0},
                     "ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0},
                     "nvls_tree": {"Simple": 20.9}}}
# llMaxBws (GB/s), single node: the GPU generation's row, first column
LL_MAX_BW = {"volta": 39.0, "ampere": 87.7, "hopper": 141.0}
# llMaxBws across nodes: the CPU vendor's row (Intel: the first, AMD: the second), columns
# 2 (two nodes) and 3 (more)
LL_MAX_BW_NODES = {"intel": (39.0, 20.4), "amd": (22.5, 19.0)}
# perChMaxRingLL128Bws, perChMaxTreeLL128Bws, perChMaxTreeBws, perChMaxNVLSTreeBws (GB/s per
# channel): [one node, two nodes, more]
PER_CH_MAX_RING_LL128 = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 36.7)}
PER_CH_MAX_TREE_LL128 = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 29.0)}
PER_CH_MAX_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0)}
PER_CH_MAX_NVLS_TREE = {"hopper": (0.0, 57.7, 45.5)}
# getNetOverhead (us): Intel x86 1.0, AMD x86 2.0; three times that with the Simple protocol
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}
# ncclTopoGetAlgoTime: a Simple ring across nodes pays its latency this many times ("plateau
# effect"), below compute capability 8.0 and from it
RING_PLATEAU = (1.9, 1.4)
#: The CPU vendor of the machines whose GPUs the presets name (NCCL's LL bandwidth and network
#: overhead across nodes depend on it): DGX-1 (Xeon E5-2698 v4), DGX A100 (EPYC 7742), DGX H100
#: (Xeon Platinum 8480C).
CPU_OF_GPU = {"P100": "intel", "V100": "intel", "A100": "amd", "H100": "intel"}
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
    bandwidth (``best_rings`` is cached per topology), or the PCIe fallback ring's bottleneck."""
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
    if gpu is None or topology.n < 2:
        return None
    busbw, nvlink = _ring_busbw(topology)
    return _tuner(gpu, topology.n, 1, busbw, nvlink, _nvswitch_port_gbps(topology), size_bytes)


def predict_collective(topology, collective: str, size_bytes: int) -> Optional[NcclPrediction]:
    """NCCL's ``collective`` on ``topology`` (one machine) by its tuner's model, moving
    ``size_bytes`` in all (for ``"reduce_scatter"`` and ``"allgather"`` the whole vector, as
    NCCL counts it: ``count * nRanks`` elements), or None where the topology names no GPU
    generation. ``"allreduce"`` is :func:`predict`.

    The reduce-scatter and all-gather run NCCL's ring (``nRanks - 1`` steps, each of the
    ring protocols' latency, and the bus bandwidth times ``nRanks / (nRanks - 1)``), or on a
    Hopper NVSwitch machine NVLS (the switch port at NVLS's efficiency, times
    ``(nRanks - 1) / nRanks``, with its own latency alone), as ``ncclTopoTuneModel`` sets them.

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> predict_collective(Topology.preset("dgx-a100"), "reduce_scatter", 2**10).protocol
    'LL'
    >>> sorted(predict_collective(Topology.preset("hgx-h100"), "allgather", 2**30).times)[0]
    ('nvls', 'Simple')
    """
    if collective == "allreduce":
        return predict(topology, size_bytes)
    _check_sharded(collective)
    gpu = gpu_of(topology)
    if gpu is None or topology.n < 2:
        return None
    busbw, nvlink = _ring_busbw(topology)
    return _sharded_tuner(gpu, topology.n, 1, busbw, nvlink, _nvswitch_port_gbps(topology), size_bytes)


def predict_collective_hosts(host, hosts: int, network_gbps: float, collective: str,
                             size_bytes: int) -> Optional[NcclPrediction]:
    """NCCL's ``collective`` (``"reduce_scatter"`` or ``"allgather"``; ``"allreduce"`` is
    :func:`predict_hosts`) over ``hosts`` machines like ``host``, moving ``size_bytes`` in all
    as NCCL counts it, each machine reaching the network at ``network_gbps`` per direction;
    None where ``host`` names no GPU generation.

    NCCL's ring, as its tuner models it across nodes: ``nRanks - 1`` steps, of which
    ``nNodes - 1`` cross the network (at its latency) and the others pay the larger of the
    link's latency and the network overhead (three times it with Simple); the bus bandwidth
    is the smaller of the host's ring and its network, under the protocol caps of the
    two- and more-node columns. The ring's plateau factor is the allreduce's only, as in the
    tuner. NCCL's NVLS reduce-scatter and all-gather are modelled inside one machine only:
    across machines this predicts the ring alone.

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> a100 = Topology.preset("dgx-a100")
    >>> predict_collective_hosts(a100, 4, 200.0, "allgather", 2**10).protocol
    'LL'
    >>> predict_collective_hosts(a100, 1, 200.0, "allgather", 2**30) == predict_collective(a100, "allgather", 2**30)
    True
    """
    if collective == "allreduce":
        return predict_hosts(host, hosts, network_gbps, size_bytes)
    _check_sharded(collective)
    gpu = gpu_of(host)
    if gpu is None or hosts < 1 or not network_gbps > 0:
        return None
    if hosts == 1:
        return predict_collective(host, collective, size_bytes)
    intra, nvlink = _ring_busbw(host) if host.n > 1 else (math.inf, False)
    return _sharded_tuner(gpu, host.n * hosts, hosts, min(intra, float(network_gbps)), nvlink, None,
                          size_bytes)


def _check_sharded(collective):
    if collective not in ("reduce_scatter", "allgather"):
        raise ValueError(f"no NCCL model of {collective!r}: use allreduce, reduce_scatter or allgather")


def _sharded_tuner(gpu, nranks, nnodes, busbw, nvlink, port, size_bytes) -> NcclPrediction:
    """``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` for a reduce-scatter or all-gather
    (the two share every constant): the ring, and NVLS on one Hopper NVSwitch machine
    (``port``: its switch port's bandwidth, or None)."""
    comm = _comm(gpu, nranks, nnodes, busbw, nvlink)
    times = {("ring", proto): _ring_seconds(comm, proto, nranks - 1, nnodes - 1, size_bytes)
             for proto in comm.protocols}
    if nnodes == 1 and comm.arch in NVLS_EFFICIENCY and port is not None:
        bw = port * NVLS_EFFICIENCY[comm.arch] * (NVLS_CHANNELS - 1) / NVLS_CHANNELS * (nranks - 1) / nranks
        times[("nvls", "Simple")] = (HW_LAT_US["nvlink"]["nvls"]["Simple"]
                                     + size_bytes / (1000 * bw * nranks / (nranks - 1))) * 1e-6
    (algorithm, protocol), seconds = min(times.items(), key=lambda kv: kv[1])
    return NcclPrediction(seconds, algorithm, protocol, times)


class _Comm(NamedTuple):
    """What NCCL's tuner derives from a communicator before it times an algorithm."""

    gpu: str
    arch: str
    cpu: str
    nranks: int
    nnodes: int
    ppn: int
    column: int  # the tables' one-node, two-node and more-node columns
    busbw: float
    ll_max: float
    hw: str
    channels: int
    protocols: tuple


def _comm(gpu, nranks, nnodes, busbw, nvlink) -> _Comm:
    """``busbw``: the graph's ``nChannels * bw`` (GB/s); ``nvlink``: whether its ranks in a
    node talk over NVLink."""
    arch, cpu = ARCH_OF_GPU[gpu], CPU_OF_GPU[gpu]
    ppn = nranks // nnodes
    column = min(nnodes - 1, 2)
    ll_max = LL_MAX_BW[arch] if nnodes == 1 else LL_MAX_BW_NODES[cpu][column - 1]
    channels = max(1, math.ceil(busbw / PER_CH_MAX_RING_LL128[arch][column]))
    # LL128 needs Volta or newer, over NVLink inside a node (or one GPU per node: a NIC path)
    protocols = ("LL", "Simple") + (("LL128",) if (nvlink or ppn == 1) and COMPCAP_OF_GPU[gpu] >= 70 else ())
    return _Comm(gpu, arch, cpu, nranks, nnodes, ppn, column, busbw, ll_max, "nvlink" if nvlink else "pci",
                 channels, protocols)


def _ring_seconds(comm, proto, nsteps, inter_steps, size_bytes, plateau=False) -> float:
    """NCCL's ring of ``nsteps`` steps, ``inter_steps`` of them across nodes, with protocol
    ``proto``: algorithm bandwidth = bus bandwidth (capped by the protocol) * n / nsteps.
    ``plateau``: the allreduce's Simple-ring plateau factor across nodes."""
    bw = comm.busbw
    if proto == "LL":
        bw = min(comm.ll_max, comm.busbw * 0.5)
    elif proto == "LL128":
        bw = min(comm.busbw * 0.92, comm.channels * PER_CH_MAX_RING_LL128[comm.arch][comm.column])
    intra_lat = HW_LAT_US[comm.hw]["ring"][proto]
    if comm.nnodes > 1:  # inter-node rings launch nsteps network operations
        intra_lat = max(intra_lat, NET_OVERHEAD_US[comm.cpu] * (3 if proto == "Simple" else 1))
    # with one rank per node every latency is the network's tree latency
    inter_lat = HW_LAT_US["net"]["tree" if comm.ppn == 1 else "ring"][proto]
    lat = BASE_LAT_US["ring"][proto] + (nsteps - inter_steps) * intra_lat + inter_steps * inter_lat
    if plateau and proto == "Simple" and comm.nnodes > 1 and size_bytes / (comm.channels * comm.nranks) >= 64:
        lat *= RING_PLATEAU[COMPCAP_OF_GPU[comm.gpu] >= 80]
    return (lat + size_bytes / (1000 * bw * comm.nranks / nsteps)) * 1e-6


def predict_hosts(host, hosts: int, network_gbps: float, size_bytes: int) -> Optional[NcclPrediction]:
    """NCCL's allreduce of ``size_bytes`` per rank over ``hosts`` machines like ``host``
    (every rank of ``host`` takes part), each reaching the network at ``network_gbps`` per
    direction (its NICs together), by NCCL's tuner model across nodes; None where ``host``
    names no GPU generation.

    One rank per host (``host`` of one rank) is how each of Blink's cross-host allreduces
    runs: one GPU of each host, its share of the host's NICs given as ``network_gbps``.

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> a100 = Topology.preset("dgx-a100")
    >>> predict_hosts(a100, 4, 200.0, 2**28).algorithm
    'ring'
    >>> predict_hosts(a100, 4, 200.0, 2**10).protocol
    'LL'
    """
    gpu = gpu_of(host)
    if gpu is None or hosts < 1 or not network_gbps > 0:
        return None
    if hosts == 1:
        return predict(host, size_bytes)
    if host.n > 1:
        intra, nvlink = _ring_busbw(host)
    else:
        intra, nvlink = math.inf, False
    # the graph search's rings and trees cross every host through its NICs
    busbw = min(intra, float(network_gbps))
    return _tuner(gpu, host.n * hosts, hosts, busbw, nvlink, _nvswitch_port_gbps(host) if host.n > 1 else None,
                  size_bytes, network_gbps=float(network_gbps))


def _tuner(gpu, nranks, nnodes, busbw, nvlink, port, size_bytes, network_gbps=None) -> NcclPrediction:
    """``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` for an allreduce: ``busbw`` is the
    graph's ``nChannels * bw`` (GB/s), ``nvlink`` whether its ranks in a node talk over NVLink,
    ``port`` the NVSwitch port joining a node's GPUs (NVLS), or None."""
    comm = _comm(gpu, nranks, nnodes, busbw, nvlink)
    arch, ppn, column, ll_max, hw, channels = comm.arch, comm.ppn, comm.column, comm.ll_max, comm.hw, comm.channels
    nsteps = 2 * (nranks - 1)
    log_size = int(math.log2(max(size_bytes >> 6, 1))) if size_bytes >= 64 else -1
    times = {}
    for proto in comm.protocols:
        times[("ring", proto)] = _ring_seconds(comm, proto, nsteps, 2 * (nnodes - 1), size_bytes, plateau=True)
        # tree (allreduce): bus bandwidth capped, algorithm bandwidth = bus / 2
        bw = min(busbw * 0.92, channels * PER_CH_MAX_TREE[arch][column])
        if proto == "LL":
            bw = min(bw / 3.8, ll_max)
        elif proto == "LL128":
            bw = min(bw * (7.0 / 9.0 if nnodes == 1 else 120.0 / 128.0),
                     channels * PER_CH_MAX_TREE_LL128[arch][column])
        if 0 <= log_size < 23:
            bw *= TREE_CORRECTION[proto][log_size]
        lat = BASE_LAT_US["tree"][proto] + 2 * ((ppn - 1) * HW_LAT_US[hw]["tree"][proto]
                                                + int(math.log2(nnodes)) * HW_LAT_US["net"]["tree"][proto])
        times[("tree", proto)] = (lat + size_bytes / (1000 * bw * 0.5)) * 1e-6
    if arch in NVLS_EFFICIENCY and port is not None:
        # intraBw per channel x channels: the port's bandwidth, at NVLS's efficiency, twice for
        # an allreduce (the switch reduces); algorithm bandwidth = bus * n / nsteps
        intra_bw = port * NVLS_EFFICIENCY[arch] * (NVLS_CHANNELS - 1) / NVLS_CHANNELS * 2
        if nnodes == 1:
            lat = BASE_LAT_US["nvls"]["Simple"] + HW_LAT_US["nvlink"]["nvls"]["Simple"]
            times[("nvls", "Simple")] = (lat + size_bytes / (1000 * intra_bw * nranks / nsteps)) * 1e-6
        else:  # NVLS alone needs CollNet across nodes; NVLS tree: the switch inside, trees across
            bw = min(intra_bw, network_gbps * (2 if nnodes <= 2 else 1),
                     NVLS_CHANNELS * PER_CH_MAX_NVLS_TREE[arch][column])
            lat = (HW_LAT_US["nvlink"]["nvls_tree"]["Simple"]
                   + 2 * int(math.log2(nnodes)) * HW_LAT_US["net"]["nvls_tree"]["Simple"])
            times[("nvls_tree", "Simple")] = (lat + size_bytes / (1000 * bw * nranks / nsteps)) * 1e-6
    (algorithm, protocol), seconds = min(times.items(), key=lambda kv: kv[1])
    return NcclPrediction(seconds, algorithm, protocol, times)
