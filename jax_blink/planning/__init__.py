"""Planning: pack weighted spanning trees into a topology's links, certify and cache them.

Modules: :mod:`~jax_blink.planning.planner` (:func:`plan`, the driver),
:mod:`~jax_blink.planning.collectives` (the collectives planned:
:data:`COLLECTIVES`, their tree directions, families and bus bandwidth),
:mod:`~jax_blink.planning.result` (:class:`Plan`: invariants, JSON, lowering),
:mod:`~jax_blink.planning.hosts` (:func:`plan_hosts`: Blink's three-phase
allreduce over several hosts),
:mod:`~jax_blink.planning.tree` (:class:`Tree`, tree depth),
:mod:`~jax_blink.planning.packing` (the LP by column generation),
:mod:`~jax_blink.planning.fewest` (the MILP choosing few trees),
:mod:`~jax_blink.planning.bounds` (certified bounds),
:mod:`~jax_blink.planning.rings` (the NCCL-style ring baseline),
:mod:`~jax_blink.planning.cost` (the one cost model: latencies, step costs,
pipelining), :mod:`~jax_blink.planning.cache` (process and disk cache),
:mod:`~jax_blink.planning.errors` (:class:`PlanError`). Pure Python: never
imports jax.
"""

from .cache import cache_dir, clear_memory_cache
from .cost import CUDA_LAUNCH_SECONDS, LATENCY_US, MAX_CHUNKS_PER_TREE
from .collectives import COLLECTIVES
from .errors import PlanError
from .hosts import HostPlan, plan_hosts
from .planner import MAX_RANKS, plan
from .result import Plan
from .tree import Tree

__all__ = ["plan", "Plan", "plan_hosts", "HostPlan", "Tree", "PlanError", "COLLECTIVES", "CUDA_LAUNCH_SECONDS", "LATENCY_US",
           "MAX_CHUNKS_PER_TREE", "MAX_RANKS", "cache_dir", "clear_memory_cache"]
