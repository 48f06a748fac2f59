"""The CPU predictions psum's choices read: one interface over two sources of numbers.

* this machine's profile (:mod:`jax_blink.choice.machine`, measured by ``python -m
  jax_blink calibrate``), where there is one for the layout of the call;
* else the costs recorded on a 2-core AMD EPYC VM (:mod:`jax_blink.planning.cost`).

:func:`cpu_allreduce` and :func:`cpu_collective` give both executors' times, the
measured spread between them and the source, which ``explain()`` repeats. psum's ``auto`` choice on CPU devices and the bucket size use it;
GPU predictions (a GPU machine's profile, else the simulator with the CUDA executor's
costs and NCCL's model) are :mod:`jax_blink.choice.predict_gpu`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from jax_blink.choice import machine
from jax_blink.planning import profile as profiles
from jax_blink.planning.cost import (CPU_ALLREDUCE_US, CPU_CROSS_PROCESS_BYTES, CPU_HOST_ALLREDUCE_US,
                                     cpu_allreduce_seconds, fixed_seconds)

__all__ = ["CpuPrediction", "cpu_allreduce", "cpu_collective", "cpu_spanning", "spanning_default", "blink_fixed_seconds",
           "tuned_bucket_bytes"]


def _nearest(layouts, processes: int, devices: Optional[int], hosts: bool = False):
    """``(profile, layout)``: this machine's profile and its layout nearest the call's among
    those it has in ``layouts(profile)`` (layout None where it has none, profile None where
    there is no profile); ``hosts``: among its layouts measured as separate hosts."""
    found = machine.profile()
    if found is None:
        return None, None
    return found, profiles.nearest_layout(layouts(found), processes, devices if devices is not None else 1 << 20,
                                          hosts)


def _table(processes: int, devices: Optional[int]):
    """``(table, source)``: the profile's nearest layout, else the recorded table."""
    found, layout = _nearest(lambda p: p.tables, processes, devices)
    if layout is not None:
        return found.tables[layout], found.named(layout)
    table = CPU_HOST_ALLREDUCE_US if processes > 1 else CPU_ALLREDUCE_US
    kind = "several processes" if processes > 1 else "one process"
    why = "no profile" if found is None else f"the profile has no layout of {kind}"
    return table, f"defaults recorded on a 2-core AMD EPYC ({why}: `python -m jax_blink calibrate`)"


@dataclasses.dataclass(frozen=True)
class CpuPrediction:
    """What one collective adds to a program, by jax_blink's CPU executor and by lax
    (seconds), and where the numbers come from; ``spread_s``: how far apart the two could
    be by noise alone where the profile measured that (None: not measured); ``measured_here``:
    the numbers are this machine's profile's."""

    blink_s: float
    lax_s: float
    source: str
    spread_s: Optional[float] = None
    measured_here: bool = False  # this machine's profile, not costs recorded elsewhere


def cpu_allreduce(size_bytes: float, processes: int = 1, devices: Optional[int] = None) -> CpuPrediction:
    """The predicted allreduce of ``size_bytes`` per device over ``devices`` devices in each
    of ``processes`` processes of one host (None: the most devices measured): from the
    profile's nearest layout (:func:`jax_blink.planning.profile.nearest_layout`), else from
    the recorded tables
    (:data:`~jax_blink.planning.cost.CPU_ALLREDUCE_US` in one process,
    :data:`~jax_blink.planning.cost.CPU_HOST_ALLREDUCE_US` across processes)."""
    table, source = _table(processes, devices)
    found, layout = _nearest(lambda p: p.tables, processes, devices)
    spread = found.spread_seconds("allreduce", size_bytes, layout) if layout is not None else None
    return CpuPrediction(cpu_allreduce_seconds("blink", size_bytes, table),
                         cpu_allreduce_seconds("lax", size_bytes, table), source, spread, layout is not None)


def cpu_collective(collective: str, size_bytes: float, processes: int = 1,
                   devices: Optional[int] = None) -> Optional[CpuPrediction]:
    """The predicted ``collective`` (``"allreduce"``, ``"reduce_scatter"`` or ``"allgather"``)
    of ``size_bytes`` of input per device: the allreduce as :func:`cpu_allreduce`; the
    others from the profile's nearest layout that measured them, None where it measured
    none (no recorded costs stand in for them)."""
    if collective == "allreduce":
        return cpu_allreduce(size_bytes, processes, devices)
    found, layout = _nearest(lambda p: p.layouts(collective), processes, devices)
    return None if layout is None else _measured(found, collective, size_bytes, layout)


def _measured(found: profiles.Profile, collective: str, size_bytes: float, layout: str) -> CpuPrediction:
    table = found.table(collective, layout)
    return CpuPrediction(cpu_allreduce_seconds("blink", size_bytes, table),
                         cpu_allreduce_seconds("lax", size_bytes, table), found.named(layout),
                         found.spread_seconds(collective, size_bytes, layout), True)


def cpu_spanning(collective: str, size_bytes: float, processes: int = 2,
                 per_process: Optional[int] = None) -> Optional[CpuPrediction]:
    """The predicted reduce-scatter or all-gather of ``size_bytes`` of input per device over
    CPU devices that span hosts, ``per_process`` in each of ``processes``: Blink's phases
    (``blink_s``: in-host Blink, lax across) against lax over all the devices, from the
    profile's nearest layout measured as separate hosts (``"2x2:hosts"``); None where it
    measured none (:func:`spanning_default` stands in)."""
    found, layout = _nearest(lambda p: p.layouts(collective), processes, per_process, hosts=True)
    return None if layout is None else _measured(found, collective, size_bytes, layout)


def spanning_default(collective: str, size_bytes: float) -> tuple:
    """``(lax_faster, source)`` where no profile measured CPU devices spanning hosts: the range
    of sizes where the phases won on a 2-core AMD EPYC
    (:data:`~jax_blink.planning.cost.CPU_CROSS_PROCESS_BYTES`)."""
    low, high = CPU_CROSS_PROCESS_BYTES[collective]
    return (not low <= size_bytes <= high,
            f"the phases won between {low:g} and {high:g} B per device on a 2-core AMD EPYC "
            "(planning.cost.CPU_CROSS_PROCESS_BYTES; no profile measured CPU hosts: "
            "`python -m jax_blink calibrate`)")


def tuned_bucket_bytes(nbytes: float, processes: int = 1, devices: Optional[int] = None) -> tuple:
    """``(bytes, source)``: the bucket size this machine's profile measured best in training
    steps for a pytree of ``nbytes`` per device
    (:meth:`jax_blink.planning.profile.Profile.bucket_bytes`) in the nearest layout it
    measured; ``(None, why)`` where it measured none."""
    found, layout = _nearest(lambda p: p.buckets, processes, devices)
    if layout is None:
        return None, "no profile" if found is None else "the profile measured no training steps"
    return found.bucket_bytes(layout, nbytes), found.named(layout)


def blink_fixed_seconds(processes: int = 1, devices: Optional[int] = None) -> float:
    """jax_blink's fixed per-call cost in the same table
    (:func:`jax_blink.planning.cost.fixed_seconds`): what a gradient bucket pays per call."""
    return fixed_seconds("blink", _table(processes, devices)[0])
