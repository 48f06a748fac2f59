"""The GPU predictions psum's choices read: for an allreduce over the devices a GPU
machine's profile measured (``python -m jax_blink calibrate`` on that machine), the tuned
plan on the CUDA executor and lax (NCCL) as measured there (:func:`measured_allreduce`);
otherwise a schedule's transfer simulated (:func:`jax_blink.sim.simulate`) with the CUDA
executor's costs (:data:`jax_blink.planning.cost.CUDA_STREAM`), and NCCL running the lax
equivalent by its tuner's model (:mod:`jax_blink.sim.nccl`), kept on disk beside the plan
cache, keyed by everything they depend on (:func:`jax_blink.choice.requests.gpu_key`), so
that a later process decides without planning, tuning or simulating.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

from jax_blink import settings
from jax_blink._gcpause import gc_paused
from jax_blink.choice import machine
from jax_blink.choice.requests import (baseline, gpu_key, schedule_for, topology_for, tuned,
                                     tuned_schedule)
from jax_blink.planning import plan
from jax_blink.planning.cache import load_keyed, store_keyed
from jax_blink.planning.cost import CUDA_STREAM
from jax_blink.schedule import DTYPES, ScheduleError
from jax_blink.sim import nccl as nccl_model, simulate
from jax_blink.sim.closed_form import busiest_arc_s
from jax_blink.topo import TopologyError

__all__ = ["allreduce", "measured_allreduce", "other", "nccl_equivalent", "seconds"]

logger = logging.getLogger("jax_blink")

_PREDICTION_FORMAT = "jax_blink.gpu_prediction"


def measured_allreduce(request, size_bytes: float, processes: int = 1):
    """``({"blink-tuned": seconds, "lax": seconds}, how)``: an allreduce of ``size_bytes`` per
    device as this GPU machine's profile measured it (the tuned plan on the CUDA executor, and
    lax.psum, that is NCCL, interpolated between the measured sizes); None where the profile
    does not cover the call, which the simulator then predicts: no profile, a CPU machine's,
    devices in several processes, another device count than it measured, or a topology other
    than the one detected here (``topology=``, ``JAX_BLINK_TOPOLOGY``), whose links the
    measurement did not run on."""
    found = machine.profile()
    if found is None or found.key.get("platform", "cpu") == "cpu" or processes != 1:
        return None
    layout = f"1x{request.topology.n}"
    if (layout not in found.tables or settings.topology_source()
            or request.topology != topology_for(None, request.topology.n)):
        return None
    return ({"blink-tuned": found.allreduce_seconds("blink", size_bytes, layout),
             "lax": found.allreduce_seconds("lax", size_bytes, layout)},
            f"measured by {found.named(layout)}")


@functools.lru_cache(maxsize=64)
def allreduce(request, count, dtype, candidates):
    """On GPUs: ``((name, seconds or None), ...)``, how ``lax`` was predicted, and ``((name,
    bound), ...)``: candidates not simulated because a lower bound of their time already
    exceeds NCCL's.

    The prediction is kept on disk beside the plan cache, keyed by
    everything it depends on (the sources included: :func:`planning.cache.source_digest`
    and this module's),
    so a later process decides without planning, tuning or simulating."""
    size = count * DTYPES[dtype][1]
    key = gpu_key(request, request=[request.chunks, request.launch_s, request.collective, request.root],
                   size_bytes=size, dtype=dtype, candidates=list(candidates))
    kept = load_keyed("decide", _PREDICTION_FORMAT, key)
    try:
        if kept is not None:
            times, how, bounds = kept
            return (tuple((str(k), None if v is None else float(v)) for k, v in times), str(how),
                    tuple((str(k), float(v)) for k, v in bounds))
    except (TypeError, ValueError) as e:
        logger.warning("jax_blink decision cache: ignoring an entry and predicting afresh: %s", e)
    predicted = _predict_allreduce(request, count, dtype, candidates, size)
    store_keyed("decide", _PREDICTION_FORMAT, key, predicted)
    return predicted


@gc_paused
def _predict_allreduce(request, count, dtype, candidates, size):
    """:func:`allreduce` on GPUs, computed (with the cyclic collector paused, as
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
            out[name] = tuned(request.topology, request.collective, None, count, dtype, request.slow_ranks).seconds
            continue
        try:
            if model is not None:  # no transfer beats its busiest link: bound to lose to NCCL?
                # (the bound on the lowering as built, before schedule_for validates it: a ring at
                # 256 MB validates in 0.09 s)
                built = baseline(name, request.topology, size, dtype)
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


def nccl_equivalent(request, count, dtype):
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
def other(request, count, dtype):
    """``(NCCL's seconds or None, how NCCL runs it, the tuned plan's seconds or None)`` for a
    collective other than the allreduce on GPUs (:func:`nccl_equivalent`,
    :func:`tuned_schedule`; the plan is not tuned where NCCL takes less than the CUDA
    executor's per-call cost), kept on disk like the allreduce's prediction."""
    key = gpu_key(request, collective=request.collective, root=request.root, op=request.op, count=count,
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
    nccl = nccl_equivalent(request, count, dtype)
    theirs, how = (None, "") if nccl is None else (nccl.seconds, nccl.describe())
    ours = None if theirs is not None and theirs <= CUDA_STREAM.call_s else tuned_schedule(request, count, dtype)[2]
    store_keyed("decide", _OTHER_PREDICTION_FORMAT, key, [theirs, how, ours])
    return theirs, how, ours


def seconds(request, count, dtype):
    """The predicted time of what :func:`decide` runs for ``request`` (not the allreduce) on
    GPUs: its schedule on the CUDA executor (the simulated transfer and the executor's costs;
    tuning simulated it already), or NCCL's lax equivalent where that is predicted faster."""
    if request.algo != "blink-tuned":
        schedule = schedule_for(request, count, dtype)[1]
        return CUDA_STREAM.seconds(simulate(schedule, request.topology).time_s, schedule)
    if settings.algo() != "auto":
        return tuned_schedule(request, count, dtype)[2]
    theirs, _, ours = other(request, count, dtype)
    return min(t for t in (theirs, ours) if t is not None)


