"""What a call runs: its :class:`PlanRequest` (hashable: a primitive parameter), the topology
of its devices, and the schedule (the plan lowered with the pipeline model, the plan's
lowering tuned by simulation for the CUDA executor, a baseline our executor runs, or a plan
or schedule file), encoded for the custom call (:class:`EncodedSchedule`), cached in memory
and, for tuned GPU schedules, on disk beside the plan cache.

:mod:`jax_blink.choice.decide` chooses among them; lowering plans nothing.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import logging
import math
import os
import types
from pathlib import Path
from typing import Optional

import numpy as np

import jax

from jax_blink import _ffi
from jax_blink._jsonio import parse_json, read_text_file
from jax_blink.choice.log import record
from jax_blink.planning import CUDA_LAUNCH_SECONDS, Plan, plan
from jax_blink.planning.cache import files_digest, load_keyed, source_digest, store_keyed
from jax_blink.planning.cost import CUDA_STREAM
from jax_blink.schedule import DTYPES, Schedule, lower_trees
from jax_blink.schedule.constants import COLLECTIVE_CODE, FORMAT_VERSION, HEADER_WORDS, MAGIC, REDUCE_OP_CODE
from jax_blink.sim import tune
from jax_blink.sim.baselines import chain as _chain, double_binary_tree, ring_allreduce
from jax_blink import settings
from jax_blink.topo import Topology, TopologyError, load_topology
from jax_blink.topo.presets import shm_processes

__all__ = ["PlanRequest", "EncodedSchedule", "launch_s", "topology_for", "schedule_for", "tuned_schedule",
           "tuned", "tuned_on_gpu", "tune_simulate_top", "baseline", "BASELINES", "describe", "gpu_key",
           "rules_digest", "TUNE_SIMULATE_TOP", "TUNE_SIMULATE_TOP_LARGE", "TUNE_LARGE_BYTES"]

logger = logging.getLogger("jax_blink")

#: At trace time the tuned plan is chosen among this many lowerings, the best by the analytic
#: estimate (``sim.tuning.estimate_seconds``), simulated (:func:`tune_simulate_top`);
#: tests/sim/test_estimates.py checks the choice against the exhaustive search.
TUNE_SIMULATE_TOP = 8
#: From :data:`TUNE_LARGE_BYTES` per device, this many: there every candidate is bandwidth-bound
#: and the estimate ranks them well (docs/design_notes.md, "How many tuned candidates to simulate").
TUNE_SIMULATE_TOP_LARGE = 4
TUNE_LARGE_BYTES = 64 << 20


#: How much rate (a fraction of the certified optimum) psum(slow_ranks=...) gives up for trees
#: whose slow ranks are leaves (``plan``'s ``tolerance``); benchmarks/bench_stragglers.py
#: measures what it buys.
SLOW_TOLERANCE = 0.0


def _plan(topology, collective, root, slow_ranks):
    """The plan psum lowers: with ``slow_ranks`` as leaves where that gives up at most
    :data:`SLOW_TOLERANCE` of the rate."""
    return plan(topology, collective, root=root, slow_ranks=slow_ranks or None,
                tolerance=SLOW_TOLERANCE if slow_ranks else 0.0)


def tune_simulate_top(size_bytes: int) -> int:
    """How many lowerings psum's trace-time tuning simulates at ``size_bytes`` per device."""
    return TUNE_SIMULATE_TOP_LARGE if size_bytes >= TUNE_LARGE_BYTES else TUNE_SIMULATE_TOP


@dataclasses.dataclass(frozen=True)
class PlanRequest:
    """Everything planning a call needs besides its element count and dtype
    (hashable: a primitive parameter)."""

    topology: Topology
    chunks: Optional[int] = None  # per tree; None: the pipeline model
    launch_s: float = 0.0         # the executor's host cost per pipeline step
    collective: str = "allreduce"  # allreduce, broadcast, reduce, reduce_scatter, allgather
    op: str = "sum"               # the reduction: sum, max, min
    root: Optional[int] = None    # broadcast and reduce
    algo: str = "blink"           # allreduce: blink, blink-tuned, ring, tree, chain or file
    plan_file: Optional[str] = None  # algo "file": the plan or schedule JSON file
    slow_ranks: tuple = ()        # allreduce: ranks to make leaves of the trees (plan(slow_ranks=))


class EncodedSchedule:
    """An encoded schedule (the flat int64 array the C++ side decodes) as a
    hashable, immutable primitive parameter."""

    __slots__ = ("words", "_hash")

    def __init__(self, words):
        words = np.array(words, dtype=np.int64)
        words.setflags(write=False)
        self.words = words
        self._hash = hash(words.tobytes())

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return (isinstance(other, EncodedSchedule) and self._hash == other._hash
                and np.array_equal(self.words, other.words))

    def __repr__(self):
        return f"EncodedSchedule({self.words.size} words)"


def launch_s(platform: str) -> float:
    """Host cost per pipeline step of the platform's executor (the chunk
    model's launch term): CUDA API calls on GPUs; nothing extra on CPU."""
    return CUDA_LAUNCH_SECONDS if platform in ("cuda", "gpu") else 0.0


@functools.lru_cache(maxsize=8)
def _detected_allocation(nranks):
    """``(topology, None)`` of this process's GPUs in ``jax.local_devices()``
    order (rank i = local GPU i, as in a mesh over ``jax.devices()``), or
    ``(None, why not)``."""
    from jax_blink.topo.detect import detect_allocation  # runs nvidia-smi once

    gpus = [d for d in jax.local_devices() if d.platform == "gpu"]
    if len(gpus) != nranks:
        return None, (f"the reduced axes have {nranks} devices but this process has "
                      f"{len(gpus)} GPUs, so which GPU is which rank is unknown")
    ordinals = [d.local_hardware_id for d in gpus]
    try:
        topo = detect_allocation(ordinals, bus_ids=_ffi.cuda_pci_bus_ids(ordinals),
                                 visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
    except TopologyError as e:
        return None, f"the GPU topology could not be detected: {e}"
    if topo is None:
        return None, "nvidia-smi is not available"
    return topo, None


def topology_for(value, nranks: int, ranks_process=None) -> Topology:
    """The topology of ``nranks`` reduced devices: ``value`` (a Topology or a
    preset name), else ``JAX_BLINK_TOPOLOGY``, else on GPUs the detected
    allocation, else ``shm:N``, or where ``ranks_process`` gives each rank's
    process (ranks in several processes of one host, some holding several)
    ``shm:N in P processes`` (:func:`jax_blink.topo.presets.shm_processes`)."""
    where = "topology="
    if value is None:
        source = settings.topology_source()
        if source:
            where = f"JAX_BLINK_TOPOLOGY={source!r}"
            try:
                value = load_topology(source)  # a preset name or a JSON file
            except TopologyError as e:
                raise TopologyError(f"{where}: {e}") from None
        elif jax.default_backend() == "gpu":
            value, why = _detected_allocation(nranks)
            if value is None:
                value = Topology.preset(f"shm:{nranks}")
                record(f"topology: shm:{nranks} ({why}; pass topology= or set "
                       "JAX_BLINK_TOPOLOGY)")
        elif ranks_process is not None:
            value = Topology.from_links(*shm_processes(ranks_process))
        else:
            value = Topology.preset(f"shm:{nranks}")
    elif isinstance(value, str):
        value = Topology.preset(value)
    elif not isinstance(value, Topology):
        raise TypeError(f"topology must be a Topology or a preset name, got {value!r:.60}")
    if value.n != nranks:
        fix = (f"pass a topology of {nranks} ranks (e.g. topology.subset([...]))" if where == "topology="
               else f"set it to a topology of {nranks} ranks, or unset it")
        raise ValueError(f"{where}: topology {value.name!r} has {value.n} ranks but the reduced axes "
                         f"have {nranks} devices; {fix}")
    return value


@functools.lru_cache(maxsize=256)
def schedule_for(request: PlanRequest, count: int, dtype: str):
    """``(plan, schedule, encoded)`` of ``request``'s collective for a vector of
    ``count`` elements of ``dtype`` (the whole vector: ``n`` shards for
    reduce_scatter and allgather), cached.

    ``request.algo`` picks the schedule: the plan lowered with the pipeline
    model (``blink``), the plan's lowering tuned by simulation
    (``blink-tuned``), one of the baselines our executor runs (``ring``,
    ``tree``, ``chain``; the plan is then None), or a plan or schedule file
    (``file``). One rank needs no plan (None): its schedule has no steps and
    the custom call copies the input. The ops leave single devices to lax;
    tests bind the primitive directly to check the handler on one device.
    """
    topology = request.topology
    root = request.root if request.collective in ("broadcast", "reduce") else None
    size = count * DTYPES[dtype][1]
    if topology.n == 1:
        alone = types.SimpleNamespace(root=0, edges=(), weight=1.0)
        schedule = lower_trees([alone], nranks=1, collective=request.collective,
                               root=-1 if root is None else root, count=count, dtype=dtype,
                               op=request.op)
        return None, schedule, EncodedSchedule(schedule.encode())
    if request.algo in BASELINES:
        schedule = dataclasses.replace(baseline(request.algo, topology, size, dtype), op=request.op).validate()
        return None, schedule, EncodedSchedule(schedule.encode())
    if request.algo == "file":
        p, schedule = _from_file(request, count, dtype)
        return p, schedule, EncodedSchedule(schedule.encode())
    p = _plan(topology, request.collective, root, request.slow_ranks)
    if request.algo == "blink-tuned":
        schedule = tuned(topology, request.collective, root, count, dtype,
                         request.slow_ranks).schedule  # validated by lower()
        if schedule.op != request.op:
            schedule = dataclasses.replace(schedule, op=request.op).validate()
    else:
        schedule = p.lower(size, dtype, chunks=request.chunks, launch_s=request.launch_s,
                           op=request.op)
    return p, schedule, EncodedSchedule(schedule.encode())


@functools.lru_cache(maxsize=64)
def tuned(topology, collective, root, count, dtype, slow_ranks=()):
    """The plan's lowering tuned for the CUDA executor (the analytic estimate ranks every
    candidate, the best :func:`tune_simulate_top` are simulated), with its predicted time
    (``sim.Tuned.seconds``: the simulated transfer and the executor's costs): the
    choice is kept on disk, since tuning a whole DGX-1 plan at 256 MB takes up to about half
    a second; the op does not change it, nor the time."""
    return tune(_plan(topology, collective, root, slow_ranks), count * DTYPES[dtype][1],
                dtype, cache=True,
                executor=CUDA_STREAM, simulate_top=tune_simulate_top(count * DTYPES[dtype][1]))


def gpu_key(about, **fields) -> dict:
    """The key of a disk entry about the request ``about`` on GPUs: what every such entry depends on
    (the sources, this module's included, the topology, the CUDA executor's costs and how
    tuning simulates), and ``fields``."""
    return {"sources": [source_digest(), rules_digest()], "topology": about.topology.fingerprint(),
            "reduce_gbps": about.topology.reduce_gbps, "executor": dataclasses.asdict(CUDA_STREAM),
            "simulate_top": [TUNE_SIMULATE_TOP, TUNE_SIMULATE_TOP_LARGE, TUNE_LARGE_BYTES],
            **({"slow_ranks": list(about.slow_ranks)} if about.slow_ranks else {}), **fields}


_TUNED_SCHEDULE_FORMAT = "jax_blink.tuned_schedule"


@functools.lru_cache(maxsize=256)
def tuned_schedule(request: PlanRequest, count: int, dtype: str):
    """``(text, encoded, seconds)`` of a ``blink-tuned`` request: how explain() describes the
    tuned lowering, the encoded schedule the custom call runs (``schedule_for``'s), and its
    predicted time on the CUDA executor (``sim.Tuned.seconds``).

    Both are kept on disk beside the plan cache, keyed by everything they depend on (the
    sources included), so that a later process decides without planning, tuning or lowering
    again: a whole DGX-1 P100's tuned schedule at 256 MB has 8,960 steps, whose lowering
    took 27 of the 33 ms of a decision from the disk cache. An entry is used only where its
    header names this request's ranks, count, collective, dtype and op (the C++ decoder
    validates the whole schedule before it runs); any other is ignored with a warning."""
    root = request.root if request.collective in ("broadcast", "reduce") else None
    key = gpu_key(request, collective=request.collective, root=root, op=request.op, count=count, dtype=dtype)
    kept = load_keyed("lowered", _TUNED_SCHEDULE_FORMAT, key)
    if kept is not None:
        try:
            words = np.frombuffer(base64.b64decode(kept["words"], validate=True), dtype="<i8")
            expected = (MAGIC, FORMAT_VERSION, request.topology.n, count, COLLECTIVE_CODE[request.collective],
                        -1 if root is None else root, DTYPES[dtype][0], REDUCE_OP_CODE[request.op])
            if len(words) <= HEADER_WORDS or tuple(words[:len(expected)].tolist()) != expected:
                raise ValueError("its schedule's header is not this request's")
            seconds = float(kept["seconds"])
            if not 0 < seconds < math.inf:
                raise ValueError(f"its predicted time {seconds!r} is not a time")
            return str(kept["text"]), EncodedSchedule(words.astype(np.int64)), seconds
        except (KeyError, TypeError, ValueError) as e:  # binascii.Error is a ValueError
            logger.warning("jax_blink decision cache: ignoring a tuned schedule and lowering afresh: %s", e)
    p, schedule, encoded = schedule_for(request, count, dtype)
    seconds = tuned(request.topology, request.collective, root, count, dtype, request.slow_ranks).seconds
    text = describe(p, schedule, "the fastest subset by simulation")
    store_keyed("lowered", _TUNED_SCHEDULE_FORMAT, key, {
        "text": text, "seconds": seconds,
        "words": base64.b64encode(encoded.words.astype("<i8").tobytes()).decode("ascii")})
    return text, encoded, seconds


def _from_file(request, count, dtype):
    """``(plan or None, schedule)`` from ``request.plan_file``: a plan (lowered
    here) or a schedule (used as it is), refused unless it fits the call."""
    path, topology = request.plan_file, request.topology
    try:
        # bounded: a FIFO or device at the path is refused, not read for ever
        document = parse_json(read_text_file(path, error=ValueError, what="plan or schedule"),
                              error=ValueError, what="plan or schedule")
        kind = document.get("format") if isinstance(document, dict) else None
        if kind == "jax_blink.plan":
            p = Plan.from_json(json.dumps(document))
            schedule = None
        elif kind == "jax_blink.schedule":
            p, schedule = None, Schedule.from_json(json.dumps(document))
        else:
            raise ValueError("not a jax_blink plan or schedule (its \"format\" is "
                             f"{kind!r})")
    except (OSError, ValueError) as e:
        raise ValueError(f"JAX_BLINK_PLAN={path!r}: {e}") from None
    what = p if p is not None else schedule
    nranks = p.topology.n if p is not None else schedule.nranks
    if nranks != topology.n or what.collective != request.collective:
        raise ValueError(
            f"JAX_BLINK_PLAN={path!r} holds a {what.collective} over {nranks} ranks; this call "
            f"is a {request.collective} over {topology.n} devices ({topology.name}). Unset "
            "JAX_BLINK_PLAN or give a file made for this job")
    if p is not None:
        if p.topology.fingerprint() != topology.fingerprint():
            raise ValueError(f"JAX_BLINK_PLAN={path!r} was planned for {p.topology.name}, not "
                             f"for this call's topology {topology.name}")
        return p, p.lower(count * DTYPES[dtype][1], dtype, chunks=request.chunks,
                          launch_s=request.launch_s, op=request.op)
    if (schedule.count, schedule.dtype) != (count, dtype):
        raise ValueError(f"JAX_BLINK_PLAN={path!r} is a schedule of {schedule.count} "
                         f"{schedule.dtype}; this call reduces {count} {dtype}")
    return None, dataclasses.replace(schedule, op=request.op).validate()


BASELINES = {"ring": ring_allreduce, "tree": double_binary_tree, "chain": _chain}


@functools.lru_cache(maxsize=16)
def baseline(name, topology, size_bytes, dtype):
    """The baseline ``name``'s allreduce as built, not validated: on GPUs its bound against NCCL
    is taken on it, and :func:`schedule_for` validates the same one where it runs or is
    simulated (built once)."""
    return BASELINES[name](topology, size_bytes, dtype)

def describe(p, schedule, fewer="the value is too small for more") -> str:
    full = len(p.trees) + sum(1 for t in p.trees if t.up_edges)  # a split tree also reduces up another
    unit = "tree(s)" if full == len(p.trees) else "reduce and broadcast trees"
    used = (f"{full} {unit}" if schedule.ntrees == full else f"{schedule.ntrees} of {full} {unit} ({fewer})")
    return (f"{p.family} plan on {p.topology.name}: {used}, "
            f"rate {p.rate_gbps:.3g} GB/s (bound {p.bound_gbps:.3g}, {p.ring_text()}), "
            f"{len(schedule.chunks)} chunk(s), {schedule.num_steps} steps" + (f"; {p.note}" if p.note else ""))



def tuned_on_gpu(request, platform):
    """``request`` for a collective other than the allreduce: on GPUs, unless ``chunks``
    is given, its plan's lowering tuned for the CUDA executor (``blink-tuned``: the pipeline
    model's chunks alone put tens of thousands of steps, each an API call, on a whole
    DGX-1's reduce-scatter)."""
    if platform in ("cuda", "gpu") and request.chunks is None and request.topology.n > 1:
        return dataclasses.replace(request, algo="blink-tuned")
    return request


@functools.lru_cache(maxsize=1)
def rules_digest() -> str:
    """:func:`planning.cache.files_digest` of the modules that compute what is kept on disk
    about GPU requests (this one and :mod:`jax_blink.choice.predict_gpu`): with
    :func:`planning.cache.source_digest`, what a kept schedule or prediction depends on
    besides its request."""
    here = Path(__file__).resolve().parent
    return files_digest([here / "requests.py", here / "predict_gpu.py"])


