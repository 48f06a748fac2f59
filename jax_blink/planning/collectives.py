"""The collectives the planner plans, and what each asks of a tree packing.

The planner owns this vocabulary (the schedule format has its own list of the
collectives it can carry, :data:`jax_blink.schedule.constants.COLLECTIVES`;
:meth:`~jax_blink.planning.Plan.lower` lowers only the plans of those).

=================  =========  ==============  =====================================  =========
collective         root       tree direction  trees                                  busbw/algbw
=================  =========  ==============  =====================================  =========
``allreduce``      none       both            ``"tree"``, ``"rsag"`` or ``"split"``  2(N-1)/N
``broadcast``      argument   down            arborescences out of the root          1
``reduce``         argument   up              arborescences into the root            1
``reduce_scatter`` each rank  up              ``"rsag"``: into every rank, equal     (N-1)/N
``allgather``      each rank  down            ``"rsag"``: out of every rank, equal   (N-1)/N
=================  =========  ==============  =====================================  =========

Rates are algorithm bandwidth as nccl-tests defines it, ``S / t`` for the
full vector of ``S`` bytes (for reduce-scatter the input of each rank, for
all-gather the output of each rank). In the ``"rsag"`` family every rank
``r`` roots trees of total weight ``x`` GB/s that move its own ``S / N``
bytes (reduce-scatter: reduced into ``r`` child to parent; all-gather: sent
from ``r`` parent to child), all ranks at once, so ``t = (S / N) / x`` and
the rate is ``N x``.

The ``"split"`` family (allreduce, planned where some link's two directions
differ) reduces each piece up an arborescence into a root and broadcasts it
down a *different* arborescence out of that root, so the reduce and the
broadcast may each take the faster direction of a link; its trees are
:class:`~jax_blink.planning.tree.Tree` s with ``up_edges``. On links whose
two directions are equal it reaches the ``"tree"`` family's rate, so it is
not planned there.

Pure Python: never imports jax.
"""

from __future__ import annotations

from .errors import PlanError

__all__ = ["COLLECTIVES", "DIRECTIONS", "ROOTED", "FAMILIES", "FAMILY_TEXT", "bus_factor"]

#: Link directions a tree loads, by collective: parent to child (``"down"``),
#: child to parent (``"up"``), or both (allreduce: reduced up, broadcast down).
DIRECTIONS = {"allreduce": "both", "broadcast": "down", "reduce": "up", "reduce_scatter": "up",
              "allgather": "down"}
#: The collectives :func:`jax_blink.planning.plan` plans.
COLLECTIVES = tuple(DIRECTIONS)
#: The collectives with one root, given to :func:`~jax_blink.planning.plan`.
ROOTED = ("broadcast", "reduce")
#: The plan families each collective may be planned with.
FAMILIES = {"allreduce": ("tree", "rsag", "split"), "broadcast": ("tree",), "reduce": ("tree",),
            "reduce_scatter": ("rsag",), "allgather": ("rsag",)}
#: What a family means for a collective (:meth:`~jax_blink.planning.Plan.family_text`).
FAMILY_TEXT = {
    ("allreduce", "tree"): "each tree reduced up to its root and broadcast back down",
    ("allreduce", "rsag"): "reduce-scatter + all-gather: every rank roots trees for its own slice",
    ("allreduce", "split"): "each piece reduced up one tree into its root and broadcast down another",
    ("broadcast", "tree"): "arborescences out of the root",
    ("reduce", "tree"): "arborescences into the root",
    ("reduce_scatter", "rsag"): "every rank roots in-trees reducing its own 1/N slice",
    ("allgather", "rsag"): "every rank roots out-trees sending its own 1/N slice",
}


def bus_factor(collective: str, nranks: int) -> float:
    """nccl-tests' busbw / algbw for ``collective`` on ``nranks`` ranks.

    ``2 (n - 1) / n`` for allreduce, ``(n - 1) / n`` for reduce-scatter and
    all-gather, 1 for broadcast and reduce (and for one rank).

    Examples
    --------
    >>> bus_factor("allreduce", 8), bus_factor("allgather", 8), bus_factor("broadcast", 8)
    (1.75, 0.875, 1.0)
    """
    if collective not in DIRECTIONS:
        raise PlanError(f"unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")
    if nranks <= 1:
        return 1.0
    if collective == "allreduce":
        return 2.0 * (nranks - 1) / nranks
    if collective in ("reduce_scatter", "allgather"):
        return (nranks - 1) / nranks
    return 1.0
