"""jax_blink: topology-aware collectives for JAX (Blink, MLSys 2020).

Public API only. Names are loaded lazily (PEP 562) so that the planning
half (``Topology``, ``plan``, ``Schedule``, ``simulate``) can be imported
without importing jax; only the ops (``psum``, ``all_gather``, ``pvary``, ``explain``, ...) and the
extension loader touch jax.

The packages follow the data flow: :mod:`jax_blink.topo` (topologies and the
link graph) -> :mod:`jax_blink.planning` (tree packing, the cost model) ->
:mod:`jax_blink.schedule` (the contract with the executors) ->
:mod:`jax_blink.sim` (simulation and baselines); none of them imports jax.
"""

import importlib

__version__ = "0.1.0"

# public name -> defining module (relative to this package)
_EXPORTS = {
    "Topology": "topo",
    "Link": "topo",
    "TopologyError": "topo",
    "preset_names": "topo",
    "plan": "planning",
    "Plan": "planning",
    "Tree": "planning",
    "PlanError": "planning",
    "plan_hosts": "planning",
    "HostPlan": "planning",
    "Schedule": "schedule",
    "Step": "schedule",
    "ScheduleError": "schedule",
    "simulate": "sim",
    "psum": "ops",
    "pmean": "ops",
    "pmax": "ops",
    "pmin": "ops",
    "psum_scatter": "ops",
    "all_gather": "ops",
    "broadcast": "ops",
    "pvary": "ops",
    "explain": "ops",
    "calibrate": "measure.calibration",
    "machine_profile": "choice.machine:profile",
    "stats": "measure.lateness",
    "slow_ranks": "measure.lateness",
    "has_cuda_support": "_ffi",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'jax_blink' has no attribute {name!r}")
    module, _, attribute = module.partition(":")
    value = getattr(importlib.import_module(f"jax_blink.{module}"), attribute or name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
