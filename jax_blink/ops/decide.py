"""What a collective call does: the planned collective (plan and schedule), or
its lax equivalent and why.

One decision function, :func:`decide`, serves every op (at trace time) and
:func:`jax_blink.explain`, so the two cannot disagree. The
plan inputs travel with the primitive as a hashable :class:`PlanRequest` and
the encoded schedule as an :class:`EncodedSchedule`, so lowering reads no
module-global state and plans nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import os
import types
from typing import Optional

import numpy as np

import jax

from jax_blink import _ffi, settings
from jax_blink.planning import CUDA_LAUNCH_SECONDS, MAX_RANKS, plan
from jax_blink.schedule import DTYPES, lower_trees
from jax_blink.topo import Topology, TopologyError, load_topology

__all__ = ["PlanRequest", "EncodedSchedule", "Decision", "decide", "environment_reason",
           "topology_for", "schedule_for", "launch_s", "record", "recent", "lax_equivalent",
           "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = tuple(DTYPES)

logger = logging.getLogger("jax_blink")
if settings.debug():
    logging.basicConfig()
    logger.setLevel(logging.DEBUG)

_DECISIONS = collections.deque(maxlen=64)


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


def topology_for(value, nranks: int) -> Topology:
    """The topology of ``nranks`` reduced devices: ``value`` (a Topology or a
    preset name), else ``JAX_BLINK_TOPOLOGY``, else on GPUs the detected
    allocation, else ``shm:N``."""
    if value is None:
        source = settings.topology_source()
        if source:
            value = load_topology(source)  # a preset name or a JSON file
        elif jax.default_backend() == "gpu":
            value, why = _detected_allocation(nranks)
            if value is None:
                value = Topology.preset(f"shm:{nranks}")
                record(f"topology: shm:{nranks} ({why}; pass topology= or set "
                       "JAX_BLINK_TOPOLOGY)")
        else:
            value = Topology.preset(f"shm:{nranks}")
    elif isinstance(value, str):
        value = Topology.preset(value)
    if value.n != nranks:
        raise ValueError(
            f"topology {value.name!r} has {value.n} ranks but the reduced axes have {nranks} "
            f"devices; pass a topology of {nranks} ranks (e.g. topology.subset([...]))")
    return value


@functools.lru_cache(maxsize=256)
def schedule_for(request: PlanRequest, count: int, dtype: str):
    """``(plan, schedule, encoded)`` of ``request``'s collective for a vector of
    ``count`` elements of ``dtype`` (the whole vector: ``n`` shards for
    reduce_scatter and allgather), cached.

    One rank needs no plan (None): its schedule has no steps and the custom
    call copies the input. The ops leave single devices to lax; tests bind
    the primitive directly to check the handler on one device.
    """
    topology = request.topology
    root = request.root if request.collective in ("broadcast", "reduce") else None
    if topology.n == 1:
        alone = types.SimpleNamespace(root=0, edges=(), weight=1.0)
        schedule = lower_trees([alone], nranks=1, collective=request.collective,
                               root=-1 if root is None else root, count=count, dtype=dtype,
                               op=request.op)
        return None, schedule, EncodedSchedule(schedule.encode())
    p = plan(topology, request.collective, root=root)
    schedule = p.lower(count * DTYPES[dtype][1], dtype, chunks=request.chunks,
                       launch_s=request.launch_s, op=request.op)
    return p, schedule, EncodedSchedule(schedule.encode())


_SHARDED = ("reduce_scatter", "allgather")
_LAX = {("allreduce", "sum"): "lax.psum", ("allreduce", "max"): "lax.pmax",
        ("allreduce", "min"): "lax.pmin", ("reduce_scatter", "sum"): "lax.psum_scatter",
        ("allgather", "sum"): "lax.all_gather", ("broadcast", "sum"): "lax.psum of the root's value"}


def lax_equivalent(collective: str, op: str = "sum") -> str:
    """What the ops run instead of the planned collective, as explain() names it."""
    return _LAX[collective, op]


def _describe(p, schedule) -> str:
    used = (f"{len(p.trees)} tree(s)" if schedule.ntrees == len(p.trees)
            else f"{schedule.ntrees} of {len(p.trees)} trees (the value is too small for more)")
    return (f"{p.family} plan on {p.topology.name}: {used}, "
            f"rate {p.rate_gbps:.3g} GB/s (bound {p.bound_gbps:.3g}, {p.ring_text()}), "
            f"{len(schedule.chunks)} chunk(s), {schedule.num_steps} steps")


def decide(count: int, dtype: str, nranks: int, *, collective: str = "allreduce",
           op: str = "sum", root: Optional[int] = None, topology=None, min_bytes=None,
           chunks=None, platform: Optional[str] = None) -> Decision:
    """The decision for a ``collective`` over ``nranks`` devices whose vector
    holds ``count`` elements of ``dtype`` (one dtype group of a call; the
    whole vector, ``nranks`` shards, for reduce_scatter and allgather).

    ``topology``, ``min_bytes`` and ``chunks`` are the ops' keywords (None:
    the settings' defaults); ``platform`` the backend whose executor runs it
    (default: jax's default backend).
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
    request = PlanRequest(topology_for(topology, nranks), settings.chunks(chunks),
                          launch_s(platform or jax.default_backend()), collective, op, root)
    p, schedule, encoded = schedule_for(request, count, dtype)
    return Decision(f"{what}: {_describe(p, schedule)}", request, encoded)
