"""How long each candidate takes here for one call: the one entry point the chooser asks.

:func:`predict` reads, in order, what covers the call: on CPU devices this machine's
profile (its nearest layout, with the measured spread), else the costs recorded in
:mod:`jax_blink.planning.cost` (:mod:`jax_blink.choice.predict_cpu`); on GPUs this
machine's profile where it measured the call's devices, else the simulator with the CUDA
executor's costs and NCCL's tuner model (:mod:`jax_blink.choice.predict_gpu`). Every
answer names its source, which ``explain()`` prints.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from jax_blink.choice import predict_cpu, predict_gpu
from jax_blink.schedule import DTYPES

__all__ = ["Prediction", "predict", "GPU_ALLREDUCE_CANDIDATES"]

#: The schedules of jax_blink's CUDA executor a GPU allreduce is chosen among (and lax).
GPU_ALLREDUCE_CANDIDATES = ("blink-tuned", "ring", "tree", "chain")


@dataclasses.dataclass(frozen=True)
class Prediction:
    """Seconds per candidate (``"lax"``: the lax equivalent; None: the topology or size
    cannot carry it), where they come from, and how far apart noise alone could put the
    plan and lax (``spread_s``, where a profile measured it). ``bounds``: candidates not
    simulated, a lower bound of their time already losing."""

    times: dict
    source: str
    spread_s: Optional[float] = None
    bounds: dict = dataclasses.field(default_factory=dict)


def predict(request, count: int, dtype: str, platform: str, processes: int = 1) -> Optional[Prediction]:
    """The prediction of ``request`` (a :class:`~jax_blink.choice.requests.PlanRequest`) for a
    vector of ``count`` elements of ``dtype`` (a reduce-scatter's or all-gather's whole
    vector) on ``platform``'s devices, in ``processes`` processes of one host. None where
    nothing covers it: a CPU reduce-scatter or all-gather no profile measured, or a CPU
    broadcast where this machine did not measure the allreduce (lax's broadcast is a psum;
    costs recorded elsewhere do not stand in for it)."""
    nbytes = count * DTYPES[dtype][1]
    if platform not in ("cuda", "gpu"):
        collective = request.collective
        measured = "allreduce" if collective == "broadcast" else collective
        n = request.topology.n
        p = predict_cpu.cpu_collective(measured, nbytes // n if collective == "allgather" else nbytes,
                                       processes, n // max(processes, 1))
        if p is None or (measured != collective and not p.measured_here):
            return None
        return Prediction({"blink": p.blink_s, "lax": p.lax_s}, p.source, p.spread_s)
    if request.collective != "allreduce":
        theirs, how, ours = predict_gpu.other(request, count, dtype)
        return Prediction({"blink-tuned": ours, "lax": theirs}, how)
    request = dataclasses.replace(request, op="sum")  # the reduction changes no prediction
    measured = predict_gpu.measured_allreduce(request, nbytes, processes)
    if measured is not None:  # read afresh, as the CPU's
        return Prediction(measured[0], measured[1])
    times, how, bounds = predict_gpu.allreduce(request, count, dtype, GPU_ALLREDUCE_CANDIDATES)
    return Prediction(dict(times), how, bounds=dict(bounds))
