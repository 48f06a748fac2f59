"""jax_blink: topology-aware collectives for JAX (Blink, MLSys 2020).

Public API only. Names are loaded lazily (PEP 562) so that the planning
half (``Topology``, ``plan``, ``Schedule``, ``simulate``) can be imported
without importing jax; only the ops (``psum``, ``pmean``, ``explain``) and the
extension loader touch jax.
"""

import importlib

__version__ = "0.1.0"

# public name -> defining module (relative to this package)
_EXPORTS = {
    "Topology": "topology",
    "Link": "topology",
    "TopologyError": "topology",
    "preset_names": "presets",
    "plan": "planner",
    "Plan": "planner",
    "Tree": "planner",
    "PlanError": "planner",
    "Schedule": "schedule",
    "Step": "schedule",
    "ScheduleError": "schedule",
    "simulate": "simulate",
    "psum": "ops",
    "pmean": "ops",
    "explain": "ops",
    "has_cuda_support": "_ffi",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'jax_blink' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"jax_blink.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
