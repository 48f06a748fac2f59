"""Simulation: play schedules over a topology's links, tune lowerings, compare with baselines.

Modules: :mod:`~jax_blink.sim.model` (:class:`SimModel`, :class:`SimError`),
:mod:`~jax_blink.sim.simulator` (:func:`simulate`, the event loop),
:mod:`~jax_blink.sim.tuning` (:func:`tune`, latency-aware lowering, and :func:`tune_baseline`),
:mod:`~jax_blink.sim.baselines` (NCCL-style ring, double binary tree,
reduce-scatter + all-gather, chain), :mod:`~jax_blink.sim.comparison`
(:func:`compare`, :func:`sweep_subsets`), :mod:`~jax_blink.sim.closed_form`
(the busiest arc and a plan's slowest pipelined tree, the forms the
simulator is checked against), :mod:`~jax_blink.sim.hosts`
(:func:`compare_hosts`: the three-phase allreduce against NCCL's flat ring
and hierarchical tree over several hosts). Costs come from the one cost model,
:mod:`jax_blink.planning.cost`; routes from :class:`jax_blink.topo.LinkGraph`.
Pure Python: never imports jax.
"""

from .comparison import compare, sweep_subsets
from .hosts import compare_hosts
from .model import DEFAULT_REDUCE_GBPS, SimError, SimModel
from .simulator import SimResult, bus_factor, simulate
from .tuning import Tuned, tune, tune_baseline

__all__ = ["simulate", "SimModel", "SimResult", "SimError", "bus_factor", "tune", "tune_baseline", "Tuned", "compare",
           "sweep_subsets", "compare_hosts", "DEFAULT_REDUCE_GBPS"]
