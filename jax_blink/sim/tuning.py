"""Latency-aware lowering: the fastest lowering of a plan at one size, found by simulation.

A plan maximises bandwidth; at small sizes fewer trees and fewer chunks cost
less latency. :func:`tune` lowers a plan with its heaviest ``m`` trees for
every ``m`` (and, for allreduce, a star packing), scales the cost model's
chunk counts by powers of two, simulates each, and returns the fastest (the
simulation of a 1 MB schedule takes milliseconds).

Pure Python: never imports jax.
"""

from __future__ import annotations

import dataclasses

from ..planning import Tree
from ..planning.cost import MAX_CHUNKS
from ..topo import TopologyError
from ..schedule import Schedule
from .model import SimError, SimModel
from .simulator import SimResult, simulate

__all__ = ["tune", "Tuned"]

_GB = 1e9


@dataclasses.dataclass(frozen=True)
class Tuned:
    """The fastest lowering :func:`tune` found.

    Attributes
    ----------
    schedule : Schedule
    result : SimResult
        Its simulation.
    num_trees : int
        How many of the plan's trees (the heaviest) it uses.
    chunks : tuple of int
        Pipeline chunks per tree used.
    candidates : int
        How many lowerings were simulated.
    """

    schedule: Schedule
    result: SimResult
    num_trees: int
    chunks: tuple
    candidates: int


def tune(plan, size_bytes: int, dtype="float32", model: SimModel | None = None,
         max_chunks: int = MAX_CHUNKS, stars: bool = True) -> Tuned:
    """The fastest lowering of ``plan`` at ``size_bytes``, by simulation.

    Candidates:

    * the plan's ``m`` heaviest trees (weights kept, so the data splits among
      them as in the plan), for ``m = len(plan.trees)`` down to 1 (all of
      them for a reduce-scatter or all-gather, which need a tree rooted at
      every rank). A subset
      whose bandwidth alone (``size / sum of weights``) cannot beat the best
      time so far is skipped, so large sizes cost few simulations;
    * with ``stars`` (allreduce only), the shallowest tree packing: every rank
      roots a star over its routes to all others and carries ``1/n`` of the
      data (the reduce-scatter + all-gather family at depth one: two hops, the
      fewest any allreduce needs). It has less bandwidth than the plan but
      wins at small sizes on well-connected allocations. Where two ranks
      share neither a link nor a switch there is no star packing.

    Each candidate starts from the pipelining model's chunk counts
    (``Plan.chunks_for``) and scales them by powers of two -- doubling, then
    halving -- while that makes the simulation faster.

    Parameters
    ----------
    plan : jax_blink.Plan
    size_bytes : int
    dtype : str or numpy dtype
    model : SimModel, optional
    max_chunks : int
        Upper bound on chunks per tree.
    stars : bool
        Whether the star packing is a candidate.

    Returns
    -------
    Tuned
    """
    if max_chunks < 1:
        raise SimError(f"max_chunks must be >= 1, got {max_chunks}")
    trees = sorted(plan.trees, key=lambda t: -t.weight)
    # a reduce-scatter or all-gather needs a tree rooted at every rank: only all of them
    smallest = len(trees) if plan.collective in ("reduce_scatter", "allgather") else 1
    candidates = [dataclasses.replace(plan, trees=tuple(trees[:m])) for m in range(len(trees), smallest - 1, -1)]
    if stars and plan.collective == "allreduce":
        graph = plan.topology.link_graph(plan.topology.kinds())
        n = plan.topology.n
        others = [[i for i in range(n) if i != j] for j in range(n)]
        try:  # weight: a star's share of its root's slowest route (only its chunking uses it)
            candidates.append(dataclasses.replace(plan, link_kinds=plan.topology.kinds(), trees=tuple(
                Tree(min(graph.route_bandwidth_gbps(j, i) for i in others[j]) / (n - 1), j,
                     tuple((j, i) for i in others[j]), tuple(graph.path(j, i) for i in others[j]))
                for j in range(n))))
        except TopologyError:
            pass  # some two ranks share no link or switch: no star reaches them
    best, tried = None, 0
    for index, sub in enumerate(candidates):
        subset = sub.trees
        bandwidth_s = size_bytes / (sum(t.weight for t in subset) * _GB)
        if best is not None and index < len(trees) and bandwidth_s >= best.result.time_s:
            continue  # a subset of the plan's trees too narrow to win
        base = sub.chunks_for(size_bytes)

        def run(scale):
            chunks = tuple(min(max(round(k * scale), 1), max_chunks) for k in base)
            schedule = sub.lower(size_bytes, dtype, chunks=list(chunks))
            return Tuned(schedule, simulate(schedule, plan.topology, model=model), len(subset),
                         chunks, 0)

        here = {1.0: run(1.0)}
        for step in (2.0, 0.5):
            scale = 1.0
            while True:
                nxt = scale * step
                if nxt not in here:
                    here[nxt] = run(nxt)
                if (here[nxt].result.time_s >= here[scale].result.time_s
                        or here[nxt].chunks == here[scale].chunks):
                    break
                scale = nxt
        tried += len(here)
        fastest = min(here.values(), key=lambda t: t.result.time_s)
        if best is None or fastest.result.time_s < best.result.time_s:
            best = fastest
    return dataclasses.replace(best, candidates=tried)
