"""Planning: pack weighted spanning trees into a topology's links, certify and cache them.

Modules: :mod:`~jax_blink.plan.planner` (:func:`plan`, the driver),
:mod:`~jax_blink.plan.result` (:class:`Plan`: invariants, JSON, lowering),
:mod:`~jax_blink.plan.tree` (:class:`Tree`, tree depth),
:mod:`~jax_blink.plan.packing` (the LP by column generation),
:mod:`~jax_blink.plan.fewest` (the MILP choosing few trees),
:mod:`~jax_blink.plan.bounds` (certified bounds),
:mod:`~jax_blink.plan.rings` (the NCCL-style ring baseline),
:mod:`~jax_blink.plan.cost` (the one cost model: latencies, step costs,
pipelining), :mod:`~jax_blink.plan.cache` (process and disk cache),
:mod:`~jax_blink.plan.errors` (:class:`PlanError`). Pure Python: never
imports jax.

``jax_blink.plan`` is also the name of the public function :func:`plan`,
which shadows this package as an attribute of ``jax_blink``: import its
modules with ``from jax_blink.plan import cost`` or
``from jax_blink.plan.cost import LATENCY_US``, not ``import jax_blink.plan.cost``.
"""

from ..schedule.constants import COLLECTIVES
from .cache import cache_dir, clear_memory_cache
from .cost import CUDA_LAUNCH_SECONDS, LATENCY_US, MAX_CHUNKS_PER_TREE
from .errors import PlanError
from .planner import plan
from .result import Plan
from .tree import Tree

__all__ = ["plan", "Plan", "Tree", "PlanError", "COLLECTIVES", "CUDA_LAUNCH_SECONDS", "LATENCY_US",
           "MAX_CHUNKS_PER_TREE", "cache_dir", "clear_memory_cache"]
