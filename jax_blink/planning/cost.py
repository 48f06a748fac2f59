"""The one cost model: link latencies, executor step costs and the pipelining formula.

Every part of jax_blink that estimates time uses these numbers: the
lowering's chunk counts (:meth:`jax_blink.planning.Plan.chunks_for`), the
baselines' chunk counts and the simulator's default latencies
(:mod:`jax_blink.sim`).

A transfer of ``S`` bytes over a route of bandwidth ``B`` costs
``alpha + S / B``, where ``alpha`` is the executor's per-step cost plus the
latency of the links crossed. Pipelining (Linear Pipelining, arXiv
1611.04255): a tree of depth ``D`` moving ``S`` bytes in ``k`` chunks takes
about ``(D + k - 1)(alpha + S / (k B))``, minimal near
``k = sqrt((D - 1) S / (alpha B))`` (:func:`pipeline_chunks`).

Pure Python: never imports jax.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["LATENCY_US", "CPU_ALLREDUCE_US", "CPU_HOST_ALLREDUCE_US", "CPU_CROSS_PROCESS_BYTES", "cpu_allreduce_seconds", "CUDA_LAUNCH_SECONDS", "MAX_CHUNKS_PER_TREE", "MAX_CHUNKS", "latency_s",
           "pipeline_chunks", "BUCKET_FIXED_SHARE", "bucket_bytes", "ExecutorCost", "CUDA_STREAM",
           "FIXED_COST_ELEMENTS", "fixed_seconds",
           "CUDA_CALL_SECONDS"]

#: One-way latency of one link (one arc of a route) by link kind, in
#: microseconds. ``nvlink``, ``pcie`` and ``net`` are nominal wire latencies.
#: ``shm`` is measured, not a wire latency: with 8 device threads on 2 cores
#: a step that waits on a peer waits for that peer's thread to be scheduled,
#: so that more pipeline chunks do not pay off, and the lowering picks
#: one chunk per tree up to ~4 MB per device and few above; the simulator,
#: which uses the same table, therefore models shared memory as slow.
LATENCY_US = {"nvlink": 0.7, "pcie": 1.0, "net": 5.0, "shm": 2000.0}
#: The CUDA stream executor's host cost per step of the busiest rank (about two API calls:
#: a kernel or copy, an event record or wait): a 1 MB allreduce of 8 ranks on one GPU is
#: host-bound, so the least-squares fit (relative error) of every recorded run gives it
#: (``benchmarks/bench_cuda.py``: ``benchmarks/results/cuda_h100.json``, ``cuda_h200.json``;
#: tests/test_cost_model.py refits and replays them).
CUDA_LAUNCH_SECONDS = 4.1e-6
#: The CUDA stream executor's fixed cost of one call beyond its steps (above).
CUDA_CALL_SECONDS = 0.22e-3


@dataclasses.dataclass(frozen=True)
class ExecutorCost:
    """What an executor adds to a schedule's transfers: a fixed cost per call, and
    a host cost per step that one rank pays step after step (the CUDA stream
    executor enqueues each step with CUDA API calls, serially per rank).

    A call takes ``max(transfer, steps of the busiest rank * step_s) + call_s``:
    the host enqueues while the device moves data, and whichever is longer sets
    the time.

    Examples
    --------
    Host-bound: 20 steps at 0.0625 s outlast a 1 s transfer, plus the call cost.

    >>> ExecutorCost("x", call_s=0.25, step_s=0.0625).call_seconds(1.0, 20)
    1.5
    >>> ExecutorCost("x", call_s=0.25, step_s=0.0625).call_seconds(2.0, 20)
    2.25
    """

    name: str
    call_s: float
    step_s: float

    def call_seconds(self, transfer_s: float, max_rank_steps: int) -> float:
        return max(transfer_s, max_rank_steps * self.step_s) + self.call_s

    def seconds(self, transfer_s: float, schedule) -> float:
        """:meth:`call_seconds` of ``schedule`` (a :class:`jax_blink.schedule.Schedule`)."""
        return self.call_seconds(transfer_s, max((len(r) for r in schedule.steps), default=0))


#: The CUDA stream executor (``cc/stream`` over ``cc/cuda``).
CUDA_STREAM = ExecutorCost("cuda-stream", call_s=CUDA_CALL_SECONDS, step_s=CUDA_LAUNCH_SECONDS)
#: Upper clamp on the pipeline chunks the lowering chooses per tree for the
#: executors.
MAX_CHUNKS_PER_TREE = 32
#: Upper clamp on pipeline chunks per tree or ring of the baselines and of the
#: simulator's search (keeps schedules and simulations small; at 1 GB over 8
#: ranks it still means sub-MB chunks, the order of NCCL's own slices).
MAX_CHUNKS = 64
#: The CPU model where no profile covers the call: what one allreduce adds to a program
#: (microseconds per call) on jax_blink's CPU executor and with lax.psum over 8 CPU devices,
#: by float32 elements per device. Measured, since the simulator does not model host threads
#: sharing cores (``benchmarks/bench_cpu.py psum`` at 43e23e6, 2-core AMD EPYC:
#: ``tests/fixtures/psum_cpu_amd-epyc-2core.json``, which a test replays).
CPU_ALLREDUCE_US = {
    "elements": (1, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000),
    "blink": (84.4, 155.8, 139.8, 150.7, 222.1, 1755.4, 23796.1),
    "lax": (119.1, 151.0, 158.7, 160.9, 310.6, 2009.7, 85774.6),
}


#: The CPU model across processes of one host where no profile covers the call: one
#: allreduce over 2 processes x 1 CPU device (microseconds), ``blink`` over the host
#: transport, ``lax`` = lax.psum over gloo (``benchmarks/bench_processes.py host_transport``,
#: 2-core AMD EPYC: ``tests/fixtures/host_transport_amd-epyc-2core.json``, which a test replays).
CPU_HOST_ALLREDUCE_US = {
    "elements": (1, 100, 1_000, 10_000, 100_000, 1_000_000, 4_000_000),
    "blink": (111.8, 108.8, 123.0, 145.4, 256.2, 1219.7, 4167.4),
    "lax": (126.7, 270.4, 301.3, 319.5, 517.8, 3208.1, 11911.9),
}


#: Over CPU devices spanning hosts, the per-device input bytes ``(low, high)`` where the
#: hierarchical reduce-scatter (a second collective per call: it wins only from 4 MB) and
#: all-gather (a reordering copy of the whole result: it loses from 4 MB) beat lax's
#: (``benchmarks/bench_processes.py multiprocess``: ``benchmarks/results/multiprocess_cpu.json``).
CPU_CROSS_PROCESS_BYTES = {"reduce_scatter": (4e6, math.inf), "allgather": (0.0, 1e6)}


def cpu_allreduce_seconds(which: str, size_bytes: float, table=None) -> float:
    """The CPU model's time of an allreduce of ``size_bytes`` per device by
    ``which`` (``"blink"`` or ``"lax"``): the measurements of ``table``
    (:data:`CPU_ALLREDUCE_US` by default; :data:`CPU_HOST_ALLREDUCE_US` across
    processes), interpolated in log-log, extrapolated linearly in size beyond
    them. A size measured slower than a larger one stays so (gloo's 400-byte
    allreduce): the model is what was measured.

    Examples
    --------
    >>> round(cpu_allreduce_seconds("blink", 4e6) * 1e6, 1)
    1755.4
    >>> round(cpu_allreduce_seconds("blink", 4e3) * 1e6, 1)
    139.8
    """
    table = CPU_ALLREDUCE_US if table is None else table
    sizes = np.log(np.asarray(table["elements"], float) * 4)
    times = np.log(np.asarray(table[which], float))
    x = np.log(max(float(size_bytes), 1.0))
    if x > sizes[-1]:
        return float(np.exp(times[-1]) * np.exp(x - sizes[-1])) * 1e-6
    return float(np.exp(np.interp(x, sizes, times))) * 1e-6


#: Calls of at most this many float32 elements per device are bound by the fixed
#: per-call cost alone: the median of their measured times is that cost
#: (:func:`fixed_seconds`; one size's time alone is noisy on a shared VM).
FIXED_COST_ELEMENTS = 1_000


def fixed_seconds(which: str, table=None) -> float:
    """The fixed per-call cost of ``which`` in ``table`` (default
    :data:`CPU_ALLREDUCE_US`): the median of its times at sizes up to
    :data:`FIXED_COST_ELEMENTS` elements per device.

    Examples
    --------
    >>> round(fixed_seconds("blink") * 1e6, 1)  # median of 84.4, 155.8 and 139.8 us
    139.8
    """
    table = CPU_ALLREDUCE_US if table is None else table
    small = [t for e, t in zip(table["elements"], table[which]) if e <= FIXED_COST_ELEMENTS]
    return float(np.median(small if small else table[which][:1])) * 1e-6


def latency_s(kind: str) -> float:
    """Latency of one link of ``kind`` (see :data:`LATENCY_US`), in seconds.

    Raises
    ------
    KeyError
        If ``kind`` has no latency in the table.

    Examples
    --------
    >>> latency_s("pcie")
    1e-06
    """
    return LATENCY_US[kind] * 1e-6


def pipeline_chunks(depth: int, size_bytes: float, bandwidth_gbps: float, alpha_s: float,
                    max_chunks: int = MAX_CHUNKS) -> int:
    """Chunk count ``k`` minimising ``(depth + k - 1)(alpha + size / (k B))``.

    The optimum is ``sqrt((depth - 1) size / (alpha B))``, rounded to
    whichever neighbouring integer is faster and clamped to
    ``[1, max_chunks]``.

    Parameters
    ----------
    depth : int
        Hops from the first sender to the last receiver (both phases of an
        allreduce counted).
    size_bytes : float
        Bytes the tree (or ring) carries.
    bandwidth_gbps : float
        Its bandwidth ``B``.
    alpha_s : float
        Start-up cost of one transfer: the executor's step cost plus link
        latency.
    max_chunks : int

    Examples
    --------
    >>> pipeline_chunks(8, 4e6, 25.0, 2e-6)  # sqrt(7 * 4e6 / (2e-6 * 25e9)) = 23.7
    24
    >>> pipeline_chunks(1, 64e6, 25.0, 2e-6)
    1
    """
    if depth <= 1 or size_bytes <= 0:
        return 1
    bytes_per_s = bandwidth_gbps * 1e9
    if alpha_s <= 0:
        return max_chunks
    best = math.sqrt((depth - 1) * size_bytes / (alpha_s * bytes_per_s))

    def cost(k):
        return (depth + k - 1) * (alpha_s + size_bytes / (k * bytes_per_s))

    candidates = {min(max(k, 1), max_chunks) for k in (math.floor(best), math.ceil(best))}
    return min(sorted(candidates), key=cost)


#: Gradient buckets (psum of a pytree, pvary's transpose): the largest share
#: of a bucket's allreduce time that its fixed per-call cost may take.
BUCKET_FIXED_SHARE = 0.5


def bucket_bytes(allreduce_seconds, lo: int = 1 << 12, hi: int = 1 << 30, fixed_s=None) -> int:
    """The bucket size (bytes per device) for an executor whose allreduce of ``S``
    bytes takes ``allreduce_seconds(S)``: the smallest power of two from ``lo``
    whose time is at least the fixed per-call cost (``fixed_s``; by default the time
    of one element, taken at 4 bytes) over :data:`BUCKET_FIXED_SHARE`; ``hi`` where
    none is.

    Smaller buckets start sooner during the backward pass (less of the
    communication waits for the last gradient) but pay the fixed cost more
    often; this keeps that cost at most half of every call.

    Examples
    --------
    >>> bucket_bytes(lambda s: 100e-6 + s / 1e9)  # 100 us fixed, 1 GB/s: 100 KB is a break-even
    131072
    >>> bucket_bytes(lambda s: 250e-6 + s / 10e9)
    4194304
    """
    fixed = allreduce_seconds(4) if fixed_s is None else fixed_s
    size = lo
    while size < hi and allreduce_seconds(size) < fixed / BUCKET_FIXED_SHARE:
        size *= 2
    return size
