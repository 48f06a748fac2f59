"""What a collective call does: the planned collective (plan and schedule), or
its lax equivalent and why.

One decision function, :func:`decide`, serves every op (at trace time) and
:func:`jax_blink.explain`, so the two cannot disagree. The
plan inputs travel with the primitive as a hashable :class:`PlanRequest` and
the encoded schedule as an :class:`EncodedSchedule`, so lowering reads no
module-global state and plans nothing.
"""

from __future__ import annotations

import base64
import collections
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

from jax_blink import _ffi, settings
from jax_blink._gcpause import gc_paused
from jax_blink._jsonio import parse_json, read_text_file
from jax_blink.ops import predict
from jax_blink.planning import CUDA_LAUNCH_SECONDS, MAX_RANKS, Plan, plan
from jax_blink.planning.cache import files_digest, load_keyed, source_digest, store_keyed
from jax_blink.planning.cost import CUDA_STREAM
from jax_blink.schedule import DTYPES, Schedule, ScheduleError, lower_trees
from jax_blink.schedule.constants import COLLECTIVE_CODE, FORMAT_VERSION, HEADER_WORDS, MAGIC, REDUCE_OP_CODE
from jax_blink.sim import nccl as nccl_model, simulate, tune
from jax_blink.sim.closed_form import busiest_arc_s
from jax_blink.sim.baselines import chain as _chain, double_binary_tree, ring_allreduce
from jax_blink.topo import Topology, TopologyError, load_topology
from jax_blink.topo.presets import gpu_of, shm_processes

__all__ = ["PlanRequest", "EncodedSchedule", "Decision", "decide", "environment_reason",
           "topology_for", "schedule_for", "launch_s", "record", "recent", "lax_equivalent",
           "across_hosts", "phases_name", "tuned_schedule", "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = tuple(DTYPES)

logger = logging.getLogger("jax_blink")
if settings.debug():
    logging.basicConfig()
    logger.setLevel(logging.DEBUG)

_DECISIONS = collections.deque(maxlen=64)
#: At trace time the tuned plan is chosen among this many lowerings, the best by the analytic
#: estimate (``sim.tuning.estimate_seconds``), simulated (:func:`tune_simulate_top`);
#: tests/sim/test_estimates.py checks the choice against the exhaustive search.
TUNE_SIMULATE_TOP = 8
#: From :data:`TUNE_LARGE_BYTES` per device, this many: there every candidate is bandwidth-bound
#: and the estimate ranks them well. On every GPU preset and DGX-1 V100 allocation (251), the best
#: 4 chose within 1% of the exhaustive search at 64 MB and exactly its choice at 256 MB, as the best
#: 8 did, in half the time (the slowest tuning at 256 MB: 0.53 s instead of 1.06 s); at 32 MB they
#: were up to 11% slower, and at 16 MB up to 21% (``python benchmarks/bench_tune_estimate.py
#: --sizes 1M 16M 32M 64M 256M --simulate-top 4 8``, 2-core AMD EPYC).
TUNE_SIMULATE_TOP_LARGE = 4
TUNE_LARGE_BYTES = 64 << 20


def tune_simulate_top(size_bytes: int) -> int:
    """How many lowerings psum's trace-time tuning simulates at ``size_bytes`` per device."""
    return TUNE_SIMULATE_TOP_LARGE if size_bytes >= TUNE_LARGE_BYTES else TUNE_SIMULATE_TOP


def record(text: str) -> None:
    """Remembers a decision for :func:`recent` (and logs it with JAX_BLINK_DEBUG)."""
    _DECISIONS.append(text)
    logger.debug(text)


def recent() -> list:
    """The most recent decisions, oldest first."""
    return list(_DECISIONS)


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


@dataclasses.dataclass(frozen=True)
class Decision:
    """The outcome for one dtype group of one psum call."""

    text: str                                 # one line, as explain() prints it
    request: Optional[PlanRequest] = None     # None: the lax equivalent
    schedule: Optional[EncodedSchedule] = None

    @property
    def uses_blink(self) -> bool:
        return self.request is not None


def launch_s(platform: str) -> float:
    """Host cost per pipeline step of the platform's executor (the chunk
    model's launch term): CUDA API calls on GPUs; nothing extra on CPU."""
    return CUDA_LAUNCH_SECONDS if platform in ("cuda", "gpu") else 0.0


def environment_reason(axes) -> Optional[str]:
    """Why a psum over ``axes`` traced here cannot use the custom call, or None."""
    mesh = jax.sharding.get_abstract_mesh()
    manual = set(getattr(mesh, "manual_axes", ()) or ())
    for ax in axes:
        if ax not in manual:
            return f"axis {ax!r} is not a manual device axis of shard_map/pmap (a vmap axis?)"
    backend = jax.default_backend()
    if backend == "cpu":
        return None
    if backend == "gpu" and "rocm" not in jax.devices()[0].client.platform_version.lower():
        if not _ffi.has_cuda_support():
            return ("this build of jax_blink has no CUDA executor (nvcc was not found when it "
                    "was built; docs/building.md)")
        if not settings.cuda_enabled():
            return "JAX_BLINK_CUDA=0 keeps psum off the CUDA executor"
        return None
    return f"no jax_blink executor for backend {backend!r}"


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
    if request.algo in _BASELINES:
        schedule = dataclasses.replace(_baseline(request.algo, topology, size, dtype), op=request.op).validate()
        return None, schedule, EncodedSchedule(schedule.encode())
    if request.algo == "file":
        p, schedule = _from_file(request, count, dtype)
        return p, schedule, EncodedSchedule(schedule.encode())
    p = plan(topology, request.collective, root=root)
    if request.algo == "blink-tuned":
        schedule = _tuned(topology, request.collective, root, count, dtype).schedule  # validated by lower()
        if schedule.op != request.op:
            schedule = dataclasses.replace(schedule, op=request.op).validate()
    else:
        schedule = p.lower(size, dtype, chunks=request.chunks, launch_s=request.launch_s,
                           op=request.op)
    return p, schedule, EncodedSchedule(schedule.encode())


@functools.lru_cache(maxsize=64)
def _tuned(topology, collective, root, count, dtype):
    """The plan's lowering tuned for the CUDA executor (the analytic estimate ranks every
    candidate, the best :func:`tune_simulate_top` are simulated), with its predicted time
    (``sim.Tuned.seconds``: the simulated transfer and the executor's costs): the
    choice is kept on disk, since tuning a whole DGX-1 plan at 256 MB takes up to about half
    a second; the op does not change it, nor the time."""
    return tune(plan(topology, collective, root=root), count * DTYPES[dtype][1], dtype, cache=True,
                executor=CUDA_STREAM, simulate_top=tune_simulate_top(count * DTYPES[dtype][1]))


def _gpu_key(about, **fields) -> dict:
    """The key of a disk entry about the request ``about`` on GPUs: what every such entry depends on
    (the sources, this module's included, the topology, the CUDA executor's costs and how
    tuning simulates), and ``fields``."""
    return {"sources": [source_digest(), _rules_digest()], "topology": about.topology.fingerprint(),
            "reduce_gbps": about.topology.reduce_gbps, "executor": dataclasses.asdict(CUDA_STREAM),
            "simulate_top": [TUNE_SIMULATE_TOP, TUNE_SIMULATE_TOP_LARGE, TUNE_LARGE_BYTES], **fields}


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
    key = _gpu_key(request, collective=request.collective, root=root, op=request.op, count=count, dtype=dtype)
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
    seconds = _tuned(request.topology, request.collective, root, count, dtype).seconds
    text = _describe(p, schedule, "the fastest subset by simulation")
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


_BASELINES = {"ring": ring_allreduce, "tree": double_binary_tree, "chain": _chain}


@functools.lru_cache(maxsize=16)
def _baseline(name, topology, size_bytes, dtype):
    """The baseline ``name``'s allreduce as built, not validated: on GPUs its bound against NCCL
    is taken on it, and :func:`schedule_for` validates the same one where it runs or is
    simulated (built once)."""
    return _BASELINES[name](topology, size_bytes, dtype)
_SHARDED = ("reduce_scatter", "allgather")
_LAX = {("allreduce", "sum"): "lax.psum", ("allreduce", "max"): "lax.pmax",
        ("allreduce", "min"): "lax.pmin", ("reduce_scatter", "sum"): "lax.psum_scatter",
        ("allgather", "sum"): "lax.all_gather", ("broadcast", "sum"): "lax.psum of the root's value",
        # the hierarchical pmax/pmin's in-process phase
        ("reduce_scatter", "max"): "lax.pmax (this device's shard kept)",
        ("reduce_scatter", "min"): "lax.pmin (this device's shard kept)"}


def lax_equivalent(collective: str, op: str = "sum") -> str:
    """What the ops run instead of the planned collective, as explain() names it."""
    return _LAX[collective, op]


def _describe(p, schedule, fewer="the value is too small for more") -> str:
    full = len(p.trees) + sum(1 for t in p.trees if t.up_edges)  # a split tree also reduces up another
    unit = "tree(s)" if full == len(p.trees) else "reduce and broadcast trees"
    used = (f"{full} {unit}" if schedule.ntrees == full else f"{schedule.ntrees} of {full} {unit} ({fewer})")
    return (f"{p.family} plan on {p.topology.name}: {used}, "
            f"rate {p.rate_gbps:.3g} GB/s (bound {p.bound_gbps:.3g}, {p.ring_text()}), "
            f"{len(schedule.chunks)} chunk(s), {schedule.num_steps} steps")


def decide(count: int, dtype: str, nranks: int, *, collective: str = "allreduce",
           op: str = "sum", root: Optional[int] = None, topology=None, min_bytes=None,
           chunks=None, platform: Optional[str] = None, processes: int = 1) -> Decision:
    """The decision for a ``collective`` over ``nranks`` devices whose vector
    holds ``count`` elements of ``dtype`` (one dtype group of a call; the
    whole vector, ``nranks`` shards, for reduce_scatter and allgather).

    ``topology``, ``min_bytes`` and ``chunks`` are the ops' keywords (None:
    the settings' defaults); ``platform`` the backend whose executor runs it
    (default: jax's default backend); ``processes`` how many processes of one
    host the devices live in (more than one: the host transport, and lax
    across processes, each predicted by its own measurements).
    """
    dtype = np.dtype(dtype).name
    fallback = lax_equivalent(collective, op)
    if dtype not in SUPPORTED_DTYPES:
        return Decision(f"unsupported dtype {dtype}: jax_blink raises TypeError")
    nbytes = count * np.dtype(dtype).itemsize
    what = f"{dtype} x {count} ({nbytes} B{' in all' if collective in _SHARDED else ' per device'})"
    threshold = settings.min_bytes(min_bytes)
    if nranks == 1:
        return Decision(f"{what}: {fallback} (the reduced axes have a single device)")
    if nranks > MAX_RANKS:
        return Decision(f"{what}: {fallback} (the reduced axes have {nranks} devices; the planner "
                        f"plans for at most {MAX_RANKS})")
    if count == 0:
        return Decision(f"{what}: {fallback} (the value is empty)")
    if nbytes < threshold:
        return Decision(f"{what}: {fallback} (below min_bytes {threshold})")
    platform = platform or jax.default_backend()
    request = PlanRequest(topology_for(topology, nranks), settings.chunks(chunks),
                          launch_s(platform), collective, op, root)
    if collective != "allreduce":
        request = _tuned_on_gpu(request, platform)
        if request.algo == "blink-tuned":
            return _choose_tuned(request, count, dtype, what, fallback)
        p, schedule, encoded = schedule_for(request, count, dtype)
        return Decision(f"{what}: {_describe(p, schedule)}", request, encoded)
    return _choose(request, count, dtype, platform, what, fallback, processes)


_NAMES = {"blink": "blink plan", "blink-tuned": "blink plan (tuned by simulation)",
          "ring": "NCCL's ring", "tree": "NCCL's double binary tree", "chain": "a pipelined chain"}


def _choose(request, count, dtype, platform, what, fallback, processes=1):
    """The allreduce's algorithm: ``JAX_BLINK_PLAN``, else ``JAX_BLINK_ALGO``,
    else (``auto``) the fastest predicted one. On GPUs the simulator predicts
    the transfers of the tuned plan and of the baselines our executor runs
    (ring, tree, chain), to which the CUDA executor's costs are added
    (``planning.cost.CUDA_STREAM``: per call, and per step of the busiest
    rank); the lax collective is NCCL as its own tuner predicts it
    (``sim.nccl``: ring, tree or NVLS with LL, LL128 or Simple), or where the
    topology names no GPU, NCCL's ring and tree simulated. A baseline that
    the topology's links or the size cannot carry (two ranks with no link or
    switch path between them) is listed as n/a and not chosen. On CPU
    devices the CPU model (:func:`jax_blink.ops.predict.cpu_allreduce`: this
    machine's profile, else the recorded costs) predicts the plan and lax: in
    one process, or across processes of one host (the host transport against
    lax over gloo)."""
    forced = settings.algo()
    if settings.plan_file():
        request = dataclasses.replace(request, algo="file", plan_file=settings.plan_file())
        p, schedule, encoded = schedule_for(request, count, dtype)
        return Decision(f"{what}: JAX_BLINK_PLAN {request.plan_file}: "
                        + (_describe(p, schedule) if p is not None else
                           f"{len(schedule.chunks)} chunk(s), {schedule.num_steps} steps"),
                        request, encoded)
    if forced == "lax":
        return Decision(f"{what}: {fallback} (JAX_BLINK_ALGO=lax)")
    gpu = platform in ("cuda", "gpu")
    if forced == "auto":
        candidates = ("blink-tuned", "ring", "tree", "chain") if gpu else ("blink",)
        predicted, how, bounds = _predicted(request, count, dtype, gpu, candidates, processes)
        runnable = {k: v for k, v in predicted.items() if v is not None}
        choice = min(runnable, key=runnable.get)  # ties: ours first (dict order), lax last

        def shown(k, v):
            if k in bounds:
                return f"{k} >= {bounds[k] * 1e6:.4g} us (a bound: not simulated)"
            return f"{k} {v * 1e6:.4g} us" if v is not None else f"{k} n/a (this topology or size cannot carry it)"

        times = ", ".join(shown(k, v) for k, v in {**predicted, **bounds}.items())
        why = f"predicted fastest; {how}: {times}"
        if choice == "lax":
            return Decision(f"{what}: {fallback} ({why})")
    else:  # forced: nothing to predict
        choice = "blink-tuned" if gpu and forced == "blink" else forced
        why = f"JAX_BLINK_ALGO={forced}"
    request = dataclasses.replace(request, algo=choice)
    try:
        if choice == "blink-tuned":
            text, encoded, _ = tuned_schedule(request, count, dtype)
        else:
            p, schedule, encoded = schedule_for(request, count, dtype)
            text = (_describe(p, schedule) if p is not None else
                    f"{_NAMES[choice]} on {request.topology.name}, {len(schedule.chunks)} chunk(s), "
                    f"{schedule.num_steps} steps")
    except (TopologyError, ScheduleError) as e:
        if forced == "auto":
            raise
        raise ValueError(f"JAX_BLINK_ALGO={forced}: {_NAMES[choice]} cannot run {what} on "
                         f"{request.topology.name}: {e}. Use JAX_BLINK_ALGO=auto") from None
    return Decision(f"{what}: {text} ({why})", request, encoded)


_PREDICTION_FORMAT = "jax_blink.gpu_prediction"


@functools.lru_cache(maxsize=1)
def _rules_digest() -> str:
    """:func:`planning.cache.files_digest` of this module: with
    :func:`planning.cache.source_digest`, what a kept prediction depends on besides its
    request."""
    return files_digest([Path(__file__)])


@functools.lru_cache(maxsize=64)
def _predicted_cached(request, count, dtype, candidates):
    """On GPUs: ``((name, seconds or None), ...)``, how ``lax`` was predicted, and ``((name,
    bound), ...)``: candidates not simulated because a lower bound of their time already
    exceeds NCCL's.

    The prediction is kept on disk beside the plan cache, keyed by
    everything it depends on (the sources included: :func:`planning.cache.source_digest`
    and this module's),
    so a later process decides without planning, tuning or simulating."""
    size = count * DTYPES[dtype][1]
    key = _gpu_key(request, request=[request.chunks, request.launch_s, request.collective, request.root],
                   size_bytes=size, dtype=dtype, candidates=list(candidates))
    kept = load_keyed("decide", _PREDICTION_FORMAT, key)
    try:
        if kept is not None:
            times, how, bounds = kept
            return (tuple((str(k), None if v is None else float(v)) for k, v in times), str(how),
                    tuple((str(k), float(v)) for k, v in bounds))
    except (TypeError, ValueError) as e:
        logger.warning("jax_blink decision cache: ignoring an entry and predicting afresh: %s", e)
    predicted = _predict_gpu(request, count, dtype, candidates, size)
    store_keyed("decide", _PREDICTION_FORMAT, key, predicted)
    return predicted


@gc_paused
def _predict_gpu(request, count, dtype, candidates, size):
    """:func:`_predicted_cached` on GPUs, computed (with the cyclic collector paused, as
    planning, lowering and simulating allocate many containers that outlive its passes:
    0.08 s of 0.84 s on the whole DGX-1 P100 at 256 MB)."""
    model = nccl_model.predict(request.topology, size)
    bounds = {}
    if model is not None:
        # what no schedule of ours can beat: the CUDA executor's per-call cost, and for the plan
        # also its certified rate (for a baseline, below: its busiest link's time); a candidate
        # bound to lose to NCCL is not planned or simulated
        floor = CUDA_STREAM.call_s
        if floor >= model.seconds:
            bounds = {name: floor for name in candidates}
        elif "blink-tuned" in candidates:
            p = plan(request.topology, request.collective)
            if floor + size / (p.rate_gbps * 1e9) >= model.seconds:
                bounds["blink-tuned"] = floor + size / (p.rate_gbps * 1e9)
        if len(bounds) == len(candidates):
            return ((("lax", model.seconds),), f"lax = {model.describe()}",
                    tuple(bounds.items()))
    out, transfer = {}, {}
    for name in dict.fromkeys(candidates + ("ring", "tree")):
        if name in bounds:
            continue
        if name == "blink-tuned":  # tuning simulated it already, for the CUDA executor
            out[name] = _tuned(request.topology, request.collective, None, count, dtype).seconds
            continue
        try:
            if model is not None:  # no transfer beats its busiest link: bound to lose to NCCL?
                # (the bound on the lowering as built, before schedule_for validates it: a ring at
                # 256 MB validates in 0.09 s)
                built = _baseline(name, request.topology, size, dtype)
                floor_s = CUDA_STREAM.seconds(busiest_arc_s(built, request.topology), built)
                if floor_s >= model.seconds:
                    bounds[name] = floor_s
                    continue
            schedule = schedule_for(dataclasses.replace(request, algo=name), count, dtype)[1]
        except (TopologyError, ScheduleError):  # a baseline this topology or size cannot carry
            out[name] = None  # is left out of the comparison
            continue
        transfer[name] = simulate(schedule, request.topology).time_s
        out[name] = CUDA_STREAM.seconds(transfer[name], schedule)  # run by jax_blink's executor
    if model is not None:
        out["lax"] = model.seconds
        how = f"simulated with the CUDA executor's costs; lax = {model.describe()}"
    else:  # NCCL's own ring and tree, simulated; its own executor's costs unknown here
        nccl = [transfer[k] for k in ("ring", "tree") if out[k] is not None]
        out["lax"] = min(nccl) if nccl else None  # NCCL picks the faster of its two
        how = ("simulated with the CUDA executor's costs; lax = NCCL's ring and tree simulated (no "
               f"NCCL model for {request.topology.name}: it names no GPU)")
    return (tuple((k, v) for k, v in out.items() if k in candidates or k == "lax"), how,
            tuple(bounds.items()))


def _nccl_equivalent(request, count, dtype):
    """NCCL running the lax equivalent of ``request``'s collective (not the allreduce) by its
    tuner's model, or None without one. ``lax.psum_scatter`` and ``lax.all_gather`` are
    NCCL's own reduce-scatter and all-gather; ``lax.pmax``/``pmin`` (a reduce-scatter's) and
    the broadcast's psum of the root's value are NCCL's allreduce of the whole vector."""
    size = count * DTYPES[dtype][1]
    if request.collective == "broadcast" or request.op != "sum":
        return nccl_model.predict(request.topology, size)
    return nccl_model.predict_collective(request.topology, request.collective, size)


_OTHER_PREDICTION_FORMAT = "jax_blink.gpu_prediction_other"


@functools.lru_cache(maxsize=256)
@gc_paused
def _other_predicted(request, count, dtype):
    """``(NCCL's seconds or None, how NCCL runs it, the tuned plan's seconds or None)`` for a
    collective other than the allreduce on GPUs (:func:`_nccl_equivalent`,
    :func:`tuned_schedule`; the plan is not tuned where NCCL takes less than the CUDA
    executor's per-call cost), kept on disk like the allreduce's prediction."""
    key = _gpu_key(request, collective=request.collective, root=request.root, op=request.op, count=count,
                   dtype=dtype)
    kept = load_keyed("decide", _OTHER_PREDICTION_FORMAT, key)
    if kept is not None:
        try:
            theirs, how, ours = kept
            if theirs is None and ours is None:
                raise ValueError("it holds no time")
            return (None if theirs is None else float(theirs), str(how), None if ours is None else float(ours))
        except (TypeError, ValueError) as e:
            logger.warning("jax_blink decision cache: ignoring an entry and predicting afresh: %s", e)
    nccl = _nccl_equivalent(request, count, dtype)
    theirs, how = (None, "") if nccl is None else (nccl.seconds, nccl.describe())
    ours = None if theirs is not None and theirs <= CUDA_STREAM.call_s else tuned_schedule(request, count, dtype)[2]
    store_keyed("decide", _OTHER_PREDICTION_FORMAT, key, [theirs, how, ours])
    return theirs, how, ours


def _choose_tuned(request, count, dtype, what, fallback):
    """A reduce-scatter, all-gather or broadcast on GPUs: the plan's lowering tuned for the
    CUDA executor, unless NCCL running the lax equivalent is predicted faster
    (:func:`_other_predicted`; with ``JAX_BLINK_ALGO=auto``, otherwise the plan). Below the
    executor's per-call cost NCCL wins without planning."""
    if settings.algo() != "auto":
        text, encoded, _ = tuned_schedule(request, count, dtype)
        return Decision(f"{what}: {text} (tuned for the CUDA executor: JAX_BLINK_ALGO={settings.algo()})",
                        request, encoded)
    theirs, how, ours = _other_predicted(request, count, dtype)

    def unit(seconds):
        return f"{seconds * 1e6:.4g} us"

    if ours is None and theirs is not None:
        return Decision(f"{what}: {fallback} (predicted faster: {how} {unit(theirs)}; no schedule on the "
                        f"CUDA executor takes less than its call, {unit(CUDA_STREAM.call_s)})")
    if theirs is not None and theirs <= ours:
        return Decision(f"{what}: {fallback} (predicted faster: {how} {unit(theirs)}, the tuned plan "
                        f"{unit(ours)} with the CUDA executor's costs)")
    text, encoded, _ = tuned_schedule(request, count, dtype)
    against = (f"; lax = {how} {unit(theirs)}" if theirs is not None
               else f"; no NCCL model for {request.topology.name}")
    return Decision(f"{what}: {text} (tuned for the CUDA executor: {unit(ours)}{against})", request, encoded)


def _tuned_on_gpu(request, platform):
    """``request`` for a collective other than the allreduce: on GPUs, unless ``chunks``
    is given, its plan's lowering tuned for the CUDA executor (``blink-tuned``: the pipeline
    model's chunks alone put tens of thousands of steps, each an API call, on a whole
    DGX-1's reduce-scatter)."""
    if platform in ("cuda", "gpu") and request.chunks is None and request.topology.n > 1:
        return dataclasses.replace(request, algo="blink-tuned")
    return request


def _gpu_seconds(request, count, dtype):
    """The predicted time of what :func:`decide` runs for ``request`` (not the allreduce) on
    GPUs: its schedule on the CUDA executor (the simulated transfer and the executor's costs;
    tuning simulated it already), or NCCL's lax equivalent where that is predicted faster."""
    if request.algo != "blink-tuned":
        schedule = schedule_for(request, count, dtype)[1]
        return CUDA_STREAM.seconds(simulate(schedule, request.topology).time_s, schedule)
    if settings.algo() != "auto":
        return tuned_schedule(request, count, dtype)[2]
    theirs, _, ours = _other_predicted(request, count, dtype)
    return min(t for t in (theirs, ours) if t is not None)


def across_hosts(groups, processes: int, per_process: int, *, collective: str = "allreduce",
                 topology=None, chunks=None):
    """``(lax_faster, why)``: whether NCCL over all the call's GPUs is predicted faster than
    Blink's phases across processes (:mod:`jax_blink.ops.hierarchical`), for ``collective``
    (``"allreduce"``, ``"reduce_scatter"`` or ``"allgather"``) of ``groups`` (``(count,
    dtype)`` per dtype group, each its own collective; ``count``: the elements of each
    device's input), ``per_process`` GPUs in each of ``processes`` processes, each process
    taken as a host reaching the network at ``JAX_BLINK_NETWORK_GBPS``, else at the
    bandwidth found in sysfs (:func:`jax_blink.topo.detect.detect_network_gbps`).

    The phases: the in-process reduce-scatter and all-gather that will run (the schedules
    of :func:`schedule_for`, simulated, with the CUDA executor's costs, or NCCL's own where
    that is predicted faster), and across the processes NCCL's collective of each GPU's
    shard, one GPU per host on its share of the host's network (``sim.nccl.predict_hosts``,
    ``predict_collective_hosts``):

    * allreduce: reduce-scatter inside, allreduce of the shard across, all-gather inside;
    * reduce-scatter: reduce-scatter inside, reduce-scatter of the shard across;
    * all-gather: all-gather across, all-gather inside of the gathered blocks.

    lax: NCCL's collective over every GPU (the same model). Where the network bandwidth is
    unknown or the topology names no GPU there is no prediction: the phases run, as ``why``
    says. Each group's times add up, on each side."""
    if collective not in _PHASES:
        raise ValueError(f"across_hosts: no phases for {collective!r}; use allreduce, reduce_scatter or allgather")
    groups = tuple((count, dtype) for count, dtype in groups if count and dtype in DTYPES)
    if not groups:  # the in-process phases leave these to lax
        return False, "no prediction across hosts: no value of a dtype jax_blink reduces"
    network, source = settings.network_gbps(), "JAX_BLINK_NETWORK_GBPS"
    if network is None:
        found = _detected_network()
        if found is not None:
            network, source = found[0], f"found in sysfs: {found[1]}"
    host = topology_for(topology, per_process)
    if network is None:
        return False, ("no prediction across hosts: no network found in sysfs; set "
                       "JAX_BLINK_NETWORK_GBPS to each host's network bandwidth to compare with "
                       "NCCL over all GPUs")
    if gpu_of(host) is None:
        return False, f"no prediction across hosts: no NCCL model for {host.name} (it names no GPU)"
    return _across_hosts(groups, processes, host, network, settings.chunks(chunks), source, collective)


#: Per collective across hosts: the in-process phase before the processes' collective, the
#: collective across them, and the in-process phase after (None: none).
_PHASES = {"allreduce": ("reduce_scatter", "allreduce", "allgather"),
           "reduce_scatter": ("reduce_scatter", "reduce_scatter", None),
           "allgather": (None, "allgather", "allgather")}
_PHASE_NAMES = {"reduce_scatter": "reduce-scatter", "allreduce": "allreduce", "allgather": "all-gather"}


def phases_name(collective: str) -> str:
    """How explain() names the phases of ``collective`` across hosts: "three phases" for the
    allreduce, "two phases" for the reduce-scatter and all-gather (see :data:`_PHASES`)."""
    return f"{'three' if all(_PHASES[collective]) else 'two'} phases"


@functools.lru_cache(maxsize=1)
def _detected_network():
    """:func:`jax_blink.topo.detect.detect_network_gbps`, once per process."""
    from jax_blink.topo.detect import detect_network_gbps

    return detect_network_gbps()


@functools.lru_cache(maxsize=64)
def _across_hosts(groups, processes, host, network, chunks, source, collective):
    """:func:`across_hosts`, predicted."""
    k = host.n
    before, across, after = _PHASES[collective]
    phases, lax = [0.0, 0.0, 0.0], 0.0
    one = host.subset([0])
    for count, dtype in groups:
        item = DTYPES[dtype][1]
        # elements (as NCCL counts them: a reduce-scatter's or all-gather's whole vector) of the
        # in-process phases, of the collective across the hosts, and of lax's over all GPUs
        if collective == "allreduce":
            local = -(-count // k) * k  # padded to a multiple of k
            shard, whole = local // k, count
        elif collective == "reduce_scatter":
            local, shard, whole = count, count // k, count
        else:  # the all-gather gathers the processes' blocks across, then the k devices' inside
            local = whole = count * processes * k
            shard = count * processes
        for i, phase in ((0, before), (2, after)) if k > 1 else ():
            if phase is not None:
                request = _tuned_on_gpu(PlanRequest(host, chunks, launch_s("gpu"), phase), "gpu")
                phases[i] += _gpu_seconds(request, local, dtype)
        phases[1] += nccl_model.predict_collective_hosts(one, processes, network / k, across, shard * item).seconds
        lax += nccl_model.predict_collective_hosts(host, processes, network, collective, whole * item).seconds
    ours = sum(phases)
    parts = ", ".join(f"{label} {t * 1e6:.4g}" for label, t in (
        (f"in-process {_PHASE_NAMES[before]}" if before else None, phases[0]),
        (f"across {processes} hosts", phases[1]),
        (f"{_PHASE_NAMES[after]}" if after else None, phases[2])) if label)
    name = phases_name(collective)
    times = (f"{name} {ours * 1e6:.4g} us ({parts}), NCCL over all {processes * k} GPUs {lax * 1e6:.4g} us; "
             f"{network:g} GB/s per host ({source}), NCCL by its tuner's model")
    if lax <= ours:
        return True, f"predicted faster than the {name}: {times}"
    return False, f"predicted fastest: {times}"


def _predicted(request, count, dtype, gpu, candidates, processes=1):
    """``(predicted seconds per candidate and lax, how, bounds)``, by the model of the platform;
    None for a schedule the topology or size cannot carry. The reduction (sum, max,
    min) does not change a prediction, so they share one."""
    if not gpu:  # read afresh: a calibration may have written this machine's profile since
        p = predict.cpu_allreduce(count * DTYPES[dtype][1], processes, request.topology.n // max(processes, 1))
        out = {"blink": p.blink_s} if "blink" in candidates else {}
        out["lax"] = p.lax_s
        return out, f"CPU model{' across processes' if processes > 1 else ''} from {p.source}", {}
    request = dataclasses.replace(request, op="sum")
    times, how, bounds = _predicted_cached(request, count, dtype, tuple(candidates))
    return dict(times), how, dict(bounds)
