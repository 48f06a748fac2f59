"""The CPU predictions psum's choices read: one interface over two sources of numbers.

* this machine's profile (:mod:`jax_blink.ops.machine`, measured by ``python -m
  jax_blink calibrate``), where there is one for the layout of the call;
* else the costs recorded on a 2-core AMD EPYC VM (:mod:`jax_blink.planning.cost`).

:func:`cpu_allreduce` gives both executors' times and names the source, which
``explain()`` repeats. psum's ``auto`` choice on CPU devices and the bucket size use it;
GPU predictions (the simulator with the CUDA executor's costs, NCCL's model) are
:mod:`jax_blink.ops.decide`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from jax_blink.ops import machine
from jax_blink.planning import profile as profiles
from jax_blink.planning.cost import (CPU_ALLREDUCE_US, CPU_HOST_ALLREDUCE_US, cpu_allreduce_seconds,
                                     fixed_seconds)

__all__ = ["CpuPrediction", "cpu_allreduce", "blink_fixed_seconds"]


def _table(processes: int, devices: Optional[int]):
    """``(table, source)``: the profile's nearest layout, else the recorded table."""
    found = machine.profile()
    layout = None
    if found is not None:
        layout = profiles.nearest_layout(found.tables, processes, devices if devices is not None else 1 << 20)
    if layout is not None:
        kind = "quick " if found.quick else ""
        return found.tables[layout], f"this machine's {kind}profile ({layout}, {found.created[:10] or 'undated'})"
    table = CPU_HOST_ALLREDUCE_US if processes > 1 else CPU_ALLREDUCE_US
    kind = "several processes" if processes > 1 else "one process"
    why = "no profile" if found is None else f"the profile has no layout of {kind}"
    return table, f"defaults recorded on a 2-core AMD EPYC ({why}: `python -m jax_blink calibrate`)"


@dataclasses.dataclass(frozen=True)
class CpuPrediction:
    """What one allreduce adds to a program, by jax_blink's CPU executor and by lax
    (seconds), and where the numbers come from."""

    blink_s: float
    lax_s: float
    source: str


def cpu_allreduce(size_bytes: float, processes: int = 1, devices: Optional[int] = None) -> CpuPrediction:
    """The predicted allreduce of ``size_bytes`` per device over ``devices`` devices in each
    of ``processes`` processes of one host (None: the most devices measured): from the
    profile's nearest layout (:func:`jax_blink.planning.profile.nearest_layout`), else from
    the recorded tables
    (:data:`~jax_blink.planning.cost.CPU_ALLREDUCE_US` in one process,
    :data:`~jax_blink.planning.cost.CPU_HOST_ALLREDUCE_US` across processes)."""
    table, source = _table(processes, devices)
    return CpuPrediction(cpu_allreduce_seconds("blink", size_bytes, table),
                         cpu_allreduce_seconds("lax", size_bytes, table), source)


def blink_fixed_seconds(processes: int = 1, devices: Optional[int] = None) -> float:
    """jax_blink's fixed per-call cost in the same table
    (:func:`jax_blink.planning.cost.fixed_seconds`): what a gradient bucket pays per call."""
    return fixed_seconds("blink", _table(processes, devices)[0])
