"""What a collective call does: the planned collective (plan and schedule), or
its lax equivalent and why.

One chooser serves every op (at trace time) and :func:`jax_blink.explain`, so the two
cannot disagree: :func:`decide` for a call's dtype group (in one process or over the
processes of one host), :func:`across` for a call whose devices span hosts, and
:func:`bucket_size` for how a pytree's leaves are bucketed. Its numbers come from one
entry point, :func:`jax_blink.choice.predict.predict` (this machine's profile where one
covers the call, else the recorded costs or the simulator, each answer naming its source).
What runs is :mod:`jax_blink.choice.requests`' (the plan inputs travel with the primitive as
a hashable :class:`~jax_blink.choice.requests.PlanRequest`, the encoded schedule as an
:class:`~jax_blink.choice.requests.EncodedSchedule`, so lowering reads no module-global state
and plans nothing).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

import jax

from jax_blink import _ffi, settings
from jax_blink.choice import across_hosts as _across_hosts, log, predict_cpu
from jax_blink.choice.predict import predict
from jax_blink.choice.requests import (PlanRequest, EncodedSchedule, describe, launch_s, schedule_for,
                                     topology_for, tuned_on_gpu, tuned_schedule)
from jax_blink.planning import MAX_RANKS
from jax_blink.planning.cost import CUDA_STREAM, bucket_bytes as _model_bytes
from jax_blink.schedule import DTYPES, ScheduleError
from jax_blink.topo import TopologyError

__all__ = ["Decision", "decide", "across", "bucket_size", "environment_reason", "lax_equivalent", "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = tuple(DTYPES)


@dataclasses.dataclass(frozen=True)
class Decision:
    """The outcome for one dtype group of one psum call. ``source`` and ``predicted``
    (``(candidate, seconds)`` pairs, the lax equivalent as ``"lax"``) are those of a choice
    made from predictions; ``undecided``: the measurement could not tell the candidates
    apart (their difference within its spread), so the default ran."""

    text: str                                 # one line, as explain() prints it
    request: Optional[PlanRequest] = None     # None: the lax equivalent
    schedule: Optional[EncodedSchedule] = None
    source: str = ""
    predicted: tuple = ()
    undecided: bool = False
    phases: bool = False                      # Blink's phases across processes (:func:`across`)

    @property
    def uses_blink(self) -> bool:
        return self.request is not None or self.phases

    @property
    def chosen(self) -> str:
        """The candidate that runs: ``"lax"``, ``"phases"`` (across processes), or the
        planned algorithm (``"blink"``, ``"blink-tuned"``, ``"ring"``, ...)."""
        if self.phases:
            return "phases"
        return self.request.algo if self.request is not None else "lax"


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


def _slow_ranks(value, collective: str) -> tuple:
    """``slow_ranks`` as a sorted tuple of ints (the planner checks the ranks themselves)."""
    if value is None:
        return ()
    if collective != "allreduce":
        raise ValueError(f"slow_ranks applies to the allreduces (psum, pmean, pmax, pmin), not {collective}")
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"slow_ranks must be a sequence of rank numbers, got {value!r:.60}")
    ranks = list(value)
    if not all(isinstance(r, (int, np.integer)) and not isinstance(r, bool) for r in ranks):
        raise TypeError(f"slow_ranks must be a sequence of rank numbers, got {ranks!r:.60}")
    return tuple(sorted(int(r) for r in ranks))


def decide(count: int, dtype: str, nranks: int, *, collective: str = "allreduce",
           op: str = "sum", root: Optional[int] = None, topology=None, min_bytes=None,
           chunks=None, platform: Optional[str] = None, processes: int = 1,
           slow_ranks=None) -> Decision:
    """The decision for a ``collective`` over ``nranks`` devices whose vector
    holds ``count`` elements of ``dtype`` (one dtype group of a call; the
    whole vector, ``nranks`` shards, for reduce_scatter and allgather).

    ``topology``, ``min_bytes`` and ``chunks`` are the ops' keywords (None:
    the settings' defaults); ``platform`` the backend whose executor runs it
    (default: jax's default backend); ``processes`` how many processes of one
    host the devices live in (more than one: the host transport, and lax
    across processes, each predicted by its own measurements); ``slow_ranks``
    (allreduce) the ranks the plan should make leaves of its trees
    (:func:`jax_blink.planning.plan`'s ``slow_ranks``).
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
                          launch_s(platform), collective, op, root,
                          slow_ranks=_slow_ranks(slow_ranks, collective))
    if collective != "allreduce":
        if settings.algo() == "lax":  # every collective, on every platform
            return Decision(f"{what}: {fallback} (JAX_BLINK_ALGO=lax)")
        request = tuned_on_gpu(request, platform)
        if request.algo == "blink-tuned":
            return _with_executor(_choose_tuned(request, count, dtype, what, fallback), platform)
        if platform == "cpu" and settings.algo() == "auto":
            return _cpu_decision(request, count, dtype, what, fallback, processes)
        p, schedule, encoded = schedule_for(request, count, dtype)
        return _with_executor(Decision(f"{what}: {describe(p, schedule)}", request, encoded), platform)
    return _with_executor(_choose(request, count, dtype, platform, what, fallback, processes), platform)


def across(name: str, axes: tuple, lax_text: str, collective: str, groups: dict, processes: int,
           per_process: int, *, platform: Optional[str] = None, topology=None, chunks=None) -> Decision:
    """The decision for a call whose devices span hosts: Blink's phases across processes
    (:mod:`jax_blink.ops.hierarchical`; ``chosen == "phases"``) or ``lax_text``, lax's
    collective over all the devices. ``groups``: ``{dtype: elements of each device's input}``
    (one collective each); ``processes`` units of ``per_process`` devices. With
    ``JAX_BLINK_ALGO=auto``, on GPUs :func:`jax_blink.choice.across_hosts.across_hosts`
    predicts both sides; on CPU devices a reduce-scatter or all-gather asks
    :func:`jax_blink.choice.predict_cpu.cpu_spanning` (this machine's profile, the phases where
    it cannot tell), else :func:`~jax_blink.choice.predict_cpu.spanning_default`; otherwise the
    phases run. A decision made from a prediction is recorded for ``explain()``."""
    platform = platform or jax.default_backend()
    head = f"{name} over {axes}"
    if settings.algo() != "auto":
        return Decision(f"{head}: {_across_hosts.phases_name(collective)} across processes "
                        f"(JAX_BLINK_ALGO={settings.algo()})", phases=True)
    if platform in ("cuda", "gpu"):
        lax_faster, why = _across_hosts.across_hosts(tuple((c, d) for d, c in groups.items()), processes,
                                                     per_process, collective=collective,
                                                     topology=topology, chunks=chunks)
        fields = {"source": "NCCL's tuner model and the CUDA executor's simulated phases"}
    elif collective in _SHARDED:
        nbytes = sum(c * np.dtype(d).itemsize for d, c in groups.items())
        p = predict_cpu.cpu_spanning(collective, nbytes, processes, per_process)
        if p is None:
            lax_faster, source = predict_cpu.spanning_default(collective, nbytes)
            why = f"{'lax' if lax_faster else 'the phases'} predicted faster at {nbytes} B per device: {source}"
            fields = {"source": source}
        else:
            lax_faster, why, fields = _verdict(p.blink_s, p.lax_s, p.spread_s, p.source,
                                               "CPU model across hosts", "phases")
    else:
        return Decision(f"{head}: three phases across processes", phases=True)
    d = (Decision(f"{head}: {lax_text} ({why})", **fields) if lax_faster else
         Decision(f"{head}: {_across_hosts.phases_name(collective)} across processes ({why})",
                  phases=True, **fields))
    log.record(d.text)
    return d


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.4g} us"


def _verdict(ours_s: float, lax_s: float, spread_s: Optional[float], source: str, of: str,
             ours: str = "blink") -> tuple:
    """``(lax_faster, why, Decision fields)`` from predicted times: the faster where the two
    differ by more than their measured spread (``spread_s``; None: not measured), else
    jax_blink's candidate (``ours``), saying the measurement could not tell."""
    fields = dict(source=source, predicted=((ours, ours_s), ("lax", lax_s)))
    times = f"{ours} {_us(ours_s)}, lax {_us(lax_s)}"
    if spread_s is not None and abs(ours_s - lax_s) <= spread_s:
        fields["undecided"] = True
        return False, (f"the measurement could not tell: {of} from {source}: {times}, apart by no more "
                       f"than their measured spread {_us(spread_s)}; the {'plan' if ours == 'blink' else ours} "
                       "by default"), fields
    spread = f" (spread {_us(spread_s)})" if spread_s is not None else ""
    return lax_s < ours_s, f"predicted fastest; {of} from {source}: {times}{spread}", fields


def _cpu_decision(request, count, dtype, what, fallback, processes) -> Decision:
    """On CPU devices with ``JAX_BLINK_ALGO=auto``: jax_blink's executor or lax, from
    :func:`~jax_blink.choice.predict.predict` (a broadcast reads the allreduce's numbers). The
    faster where the two differ by more than their measured spread; else the plan, saying the
    measurement could not tell; the plan, with no prediction, where nothing covers the call."""
    p = predict(request, count, dtype, "cpu", processes)
    if p is None:
        plan, schedule, encoded = schedule_for(request, count, dtype)
        return Decision(f"{what}: {describe(plan, schedule)}", request, encoded)
    of = "CPU model" + (" across processes" if processes > 1 else "") + (
        " of the allreduce" if request.collective == "broadcast" else "")
    lax, why, fields = _verdict(p.times["blink"], p.times["lax"], p.spread_s, p.source, of)
    if lax:
        return Decision(f"{what}: {fallback} ({why})", **fields)
    plan, schedule, encoded = schedule_for(request, count, dtype)
    return Decision(f"{what}: {describe(plan, schedule)} ({why})", request, encoded, **fields)


def bucket_size(value, platform: str, nbytes: float) -> tuple:
    """``(bytes or None, why)``: the bucket size of a psum of a pytree of ``nbytes`` per
    device over ``platform``'s devices (:mod:`jax_blink.ops.buckets`); None means one
    bucket. ``bucket_bytes=`` / ``JAX_BLINK_BUCKET_BYTES``, else on CPU devices the size this
    machine's profile measured best in the training steps of the model nearest the pytree
    in bytes (:func:`jax_blink.choice.predict_cpu.tuned_bucket_bytes`), else the cost model
    of the executor that will run the buckets (:func:`jax_blink.planning.cost.bucket_bytes`
    over :func:`jax_blink.choice.predict_cpu.cpu_allreduce`)."""
    chosen = settings.bucket_bytes(value)
    if chosen is not None:
        return chosen, "bucket_bytes=" if value is not None else "JAX_BLINK_BUCKET_BYTES"
    if platform == "cpu":
        tuned, where = predict_cpu.tuned_bucket_bytes(nbytes)
        if tuned is not None:
            return tuned, f"the training steps of {where}"
        source = predict_cpu.cpu_allreduce(4).source
        return (_model_bytes(lambda s: predict_cpu.cpu_allreduce(s).blink_s,
                             fixed_s=predict_cpu.blink_fixed_seconds()), f"the CPU model ({source})")
    # On GPUs the CUDA executor enqueues on XLA's compute stream, in program order: a bucket
    # would not overlap the backward pass, only add its per-call cost.
    return None, "one bucket: the CUDA executor runs in the compute stream's order"


def _with_executor(d: Decision, platform) -> Decision:
    """On GPUs, a decision that runs jax_blink's custom call names the CUDA executor that
    runs it (``JAX_BLINK_CUDA_EXECUTOR``: the stream executor, or the device executor)."""
    if not d.uses_blink or platform not in ("cuda", "gpu"):
        return d
    return dataclasses.replace(d, text=f"{d.text}; CUDA executor: {settings.cuda_executor()} "
                                       "(JAX_BLINK_CUDA_EXECUTOR)")


_NAMES = {"blink": "blink plan", "blink-tuned": "blink plan (tuned by simulation)",
          "ring": "NCCL's ring", "tree": "NCCL's double binary tree", "chain": "a pipelined chain"}


def _choose(request, count, dtype, platform, what, fallback, processes=1):
    """The allreduce's algorithm: ``JAX_BLINK_PLAN``, else ``JAX_BLINK_ALGO``,
    else (``auto``) the fastest predicted one. On GPUs, where this machine's
    profile measured the call's devices on their detected topology, the
    measured times of the tuned plan and of lax (NCCL) decide
    (:func:`jax_blink.choice.predict_gpu.measured_allreduce`); otherwise the simulator predicts
    the transfers of the tuned plan and of the baselines our executor runs
    (ring, tree, chain), to which the CUDA executor's costs are added
    (``planning.cost.CUDA_STREAM``: per call, and per step of the busiest
    rank); the lax collective is NCCL as its own tuner predicts it
    (``sim.nccl``: ring, tree or NVLS with LL, LL128 or Simple), or where the
    topology names no GPU, NCCL's ring and tree simulated. A baseline that
    the topology's links or the size cannot carry (two ranks with no link or
    switch path between them) is listed as n/a and not chosen. On CPU
    devices the CPU model (:func:`jax_blink.choice.predict_cpu.cpu_allreduce`: this
    machine's profile, else the recorded costs) predicts the plan and lax: in
    one process, or across processes of one host (the host transport against
    lax over gloo)."""
    forced = settings.algo()
    if settings.plan_file():
        request = dataclasses.replace(request, algo="file", plan_file=settings.plan_file())
        p, schedule, encoded = schedule_for(request, count, dtype)
        return Decision(f"{what}: JAX_BLINK_PLAN {request.plan_file}: "
                        + (describe(p, schedule) if p is not None else
                           f"{len(schedule.chunks)} chunk(s), {schedule.num_steps} steps"),
                        request, encoded)
    if forced == "lax":
        return Decision(f"{what}: {fallback} (JAX_BLINK_ALGO=lax)")
    gpu = platform in ("cuda", "gpu")
    if forced == "auto" and not gpu:
        return _cpu_decision(dataclasses.replace(request, algo="blink"), count, dtype, what, fallback,
                             processes)
    if forced == "auto":
        p = predict(request, count, dtype, platform, processes)
        predicted, how, bounds = p.times, p.source, p.bounds
        fields = dict(source=p.source, predicted=tuple(p.times.items()))
        runnable = {k: v for k, v in predicted.items() if v is not None}
        choice = min(runnable, key=runnable.get)  # ties: ours first (dict order), lax last

        def shown(k, v):
            if k in bounds:
                return f"{k} >= {bounds[k] * 1e6:.4g} us (a bound: not simulated)"
            return f"{k} {v * 1e6:.4g} us" if v is not None else f"{k} n/a (this topology or size cannot carry it)"

        times = ", ".join(shown(k, v) for k, v in {**predicted, **bounds}.items())
        why = f"predicted fastest; {how}: {times}"
        if choice == "lax":
            return Decision(f"{what}: {fallback} ({why})", **fields)
    else:  # forced: nothing to predict
        choice = "blink-tuned" if gpu and forced == "blink" else forced
        why, fields = f"JAX_BLINK_ALGO={forced}", {}
    request = dataclasses.replace(request, algo=choice)
    try:
        if choice == "blink-tuned":
            text, encoded, _ = tuned_schedule(request, count, dtype)
        else:
            p, schedule, encoded = schedule_for(request, count, dtype)
            text = (describe(p, schedule) if p is not None else
                    f"{_NAMES[choice]} on {request.topology.name}, {len(schedule.chunks)} chunk(s), "
                    f"{schedule.num_steps} steps")
    except (TopologyError, ScheduleError) as e:
        if forced == "auto":
            raise
        raise ValueError(f"JAX_BLINK_ALGO={forced}: {_NAMES[choice]} cannot run {what} on "
                         f"{request.topology.name}: {e}. Use JAX_BLINK_ALGO=auto") from None
    return Decision(f"{what}: {text} ({why})", request, encoded, **fields)


def _choose_tuned(request, count, dtype, what, fallback):
    """A reduce-scatter, all-gather or broadcast on GPUs: the plan's lowering tuned for the
    CUDA executor, unless NCCL running the lax equivalent is predicted faster
    (:func:`jax_blink.choice.predict.predict`; with ``JAX_BLINK_ALGO=auto``, otherwise the plan). Below the
    executor's per-call cost NCCL wins without planning."""
    if settings.algo() != "auto":
        text, encoded, _ = tuned_schedule(request, count, dtype)
        return Decision(f"{what}: {text} (tuned for the CUDA executor: JAX_BLINK_ALGO={settings.algo()})",
                        request, encoded)
    p = predict(request, count, dtype, "gpu")
    theirs, how, ours = p.times["lax"], p.source, p.times["blink-tuned"]
    fields = dict(source=p.source, predicted=tuple(p.times.items()))
    if ours is None and theirs is not None:
        return Decision(f"{what}: {fallback} (predicted faster: {how} {_us(theirs)}; no schedule on the "
                        f"CUDA executor takes less than its call, {_us(CUDA_STREAM.call_s)})", **fields)
    if theirs is not None and theirs <= ours:
        return Decision(f"{what}: {fallback} (predicted faster: {how} {_us(theirs)}, the tuned plan "
                        f"{_us(ours)} with the CUDA executor's costs)", **fields)
    text, encoded, _ = tuned_schedule(request, count, dtype)
    against = (f"; lax = {how} {_us(theirs)}" if theirs is not None
               else f"; no NCCL model for {request.topology.name}")
    return Decision(f"{what}: {text} (tuned for the CUDA executor: {_us(ours)}{against})", request, encoded,
                    **fields)
