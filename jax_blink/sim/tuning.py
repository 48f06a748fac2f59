"""Latency-aware lowering: the fastest lowering of a plan at one size, found by simulation.

A plan maximises bandwidth; at small sizes fewer trees and fewer chunks cost
less latency. :func:`tune` lowers a plan with its heaviest ``m`` trees for
a grid of ``m`` (and, for allreduce, a star packing), scales the cost model's
chunk counts by powers of two, simulates each, and returns the fastest. A
simulation of a full DGX-1 V100 schedule takes 0.02 s at 1 MB (4,984 steps)
and 0.17 s at 256 MB (21,504 steps) on two cores, and the search simulates
tens of candidates, so psum, which tunes at trace time on a GPU topology,
simulates only the few best by an analytic estimate (``simulate_top``).

Pure Python: never imports jax.
"""

from __future__ import annotations

import collections
import dataclasses
import logging

from ..planning import Tree
from ..planning.cache import CACHE_VERSION, load_keyed, source_digest, store_keyed
from ..planning.cost import MAX_CHUNKS
from ..schedule import dtype_name
from ..topo import TopologyError
from ..schedule import Schedule
from .model import SimError, SimModel
from .simulator import SimResult, simulate

__all__ = ["tune", "tune_baseline", "estimate_seconds", "Tuned", "SUBSET_FRACTIONS", "ESTIMATE_SCALES"]

_GB = 1e9
logger = logging.getLogger(__name__)
#: The subsets :func:`tune` tries: the fewest heaviest trees holding at least
#: each of these fractions of the plan's weight (plus all, one and two trees).
#: Hybrid plans have long tails of light trees (a full DGX-1V allreduce: 31
#: trees, the lightest 4 under 3% of the weight), which is what dropping
#: trees saves at small sizes.
SUBSET_FRACTIONS = (0.999, 0.995, 0.99, 0.98, 0.97, 0.95, 0.9, 0.8, 0.65, 0.5, 0.35, 0.2)


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
    seconds : float or None
        The predicted time of a call on the executor :func:`tune` was given
        (its :class:`~jax_blink.planning.cost.ExecutorCost` over the simulated
        transfer), else the simulated time.
    """

    schedule: Schedule
    result: SimResult
    num_trees: int
    chunks: tuple
    candidates: int
    seconds: float | None = None


def tune(plan, size_bytes: int, dtype="float32", model: SimModel | None = None,
         max_chunks: int = MAX_CHUNKS, stars: bool = True, cache: bool = False,
         executor=None, simulate_top: int | None = None) -> Tuned:
    """The fastest lowering of ``plan`` at ``size_bytes``, by simulation.

    Candidates:

    * the plan's ``m`` heaviest trees (weights kept, so the data splits among
      them as in the plan): all of them, one, two, and the fewest holding
      each fraction of :data:`SUBSET_FRACTIONS` of the weight (only all of
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

    With ``cache``, the choice (which candidate, its chunks, its simulated
    result) is kept on disk beside the plan cache (``tune-<hash>.json`` in
    :func:`jax_blink.settings.cache_dir`), keyed by the plan's trees and
    topology, the size, dtype, model, options and the sources
    (:func:`jax_blink.planning.cache.source_digest`); a later call lowers only
    that candidate. psum on a GPU topology tunes this way at
    trace time (the full search of a whole DGX-1 V100's plan for the CUDA
    executor takes 1.2 s at 1 MB and 5.8 s at 256 MB on two cores;
    ``simulate_top`` a fraction of that). An entry that does not fit is ignored with a warning and the
    plan tuned afresh: it can only name a candidate, whose schedule is
    lowered and validated as ever.

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
    cache : bool
        Look the choice up on disk and store it there.
    executor : ExecutorCost, optional
        The executor that will run the schedule
        (:data:`jax_blink.planning.cost.CUDA_STREAM`): candidates are compared
        by its predicted time, the simulated transfer plus its per-call and
        per-step costs, so that chunk counts and subsets are chosen for it.
        None: by the simulated time alone.
    simulate_top : int, optional
        Rank every candidate at chunk scales 1/1024 to 64 by the analytic estimate
        of :func:`estimate_seconds` (no lowering, no simulation), lower and
        simulate only this many of the best, and keep the fastest simulated
        (psum's decision at trace time); None: the search above, simulating
        every step of it.

    Returns
    -------
    Tuned
    """
    if max_chunks < 1:
        raise SimError(f"max_chunks must be >= 1, got {max_chunks}")
    trees = sorted(plan.trees, key=lambda t: -t.weight)
    sizes = {len(trees)}
    if plan.collective not in ("reduce_scatter", "allgather"):  # those need a tree rooted at every rank
        total, held, m = sum(t.weight for t in trees), 0.0, 0
        for fraction in sorted(SUBSET_FRACTIONS):
            while held < fraction * total * (1 - 1e-12) and m < len(trees):
                held += trees[m].weight
                m += 1
            sizes.add(max(m, 1))
        sizes |= {min(2, len(trees)), 1}
    candidates = [dataclasses.replace(plan, trees=tuple(trees[:m])) for m in sorted(sizes, reverse=True)]
    num_subsets = len(candidates)
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
    key = _cache_key(plan, size_bytes, dtype, model, max_chunks, stars, executor, simulate_top) if cache else None

    def scored(schedule, trees, chunks, tried):
        result = simulate(schedule, plan.topology, model=model)
        seconds = result.time_s if executor is None else executor.seconds(result.time_s, schedule)
        return Tuned(schedule, result, trees, chunks, tried, seconds)

    if key is not None:
        hit = _cached_choice(key, candidates, max_chunks, plan.topology.n)
        if hit is not None:
            index, chunks, result = hit
            schedule = candidates[index].lower(size_bytes, dtype, chunks=list(chunks))
            if len(result.tree_finish_s) == schedule.ntrees:  # else: simulate it again
                seconds = result.time_s if executor is None else executor.seconds(result.time_s, schedule)
                return Tuned(schedule, result, len(candidates[index].trees), chunks, 0, seconds)
            return scored(schedule, len(candidates[index].trees), chunks, 1)
    if simulate_top is not None:
        best, best_index, tried = _simulate_best_estimates(
            candidates, size_bytes, dtype, max_chunks, executor, model or SimModel(), simulate_top, scored)
        if key is not None:
            _store_choice(key, best_index, best)
        return dataclasses.replace(best, candidates=tried)
    best, best_index, tried = None, 0, 0
    fixed_s = 0.0 if executor is None else executor.call_s
    for index, sub in enumerate(candidates):
        subset = sub.trees
        bandwidth_s = size_bytes / (sum(t.weight for t in subset) * _GB)
        if best is not None and index < num_subsets and bandwidth_s + fixed_s >= best.seconds:
            continue  # a subset of the plan's trees too narrow to win
        base = sub.chunks_for(size_bytes)

        def run(scale):
            chunks = tuple(min(max(round(k * scale), 1), max_chunks) for k in base)
            return scored(sub.lower(size_bytes, dtype, chunks=list(chunks)), len(subset), chunks, 0)

        fastest, count = _fastest_scale(run)
        tried += count
        if best is None or fastest.seconds < best.seconds:
            best, best_index = fastest, index
    if key is not None:
        _store_choice(key, best_index, best)
    return dataclasses.replace(best, candidates=tried)


#: The chunk scales :func:`tune` estimates each candidate at with ``simulate_top``.
ESTIMATE_SCALES = tuple(2.0 ** e for e in range(-10, 7))


def estimate_seconds(plan, chunks, size_bytes: int, executor=None, model: SimModel | None = None) -> float:
    """An analytic estimate of a lowering's time, without lowering it.

    Per tree, the Linear Pipelining form: the pipeline fills in ``H - 1`` steps
    of ``alpha + S_T / (k r_T)`` (``H`` its hops, both phases of an allreduce;
    ``k`` its chunks; ``S_T`` its share of the bytes, by weight; ``r_T`` its
    slowest link's bandwidth, the tree alone; ``alpha`` the model's step
    overhead plus the latency of its slowest route), then its chunks leave at
    the slower of ``k`` such steps and the busy time of its busiest link, which
    every tree of the lowering shares. The slowest tree sets the transfer; with
    ``executor``, the transfer and the busiest rank's steps (each tree edge is a
    step per chunk at each end, each way) as
    :class:`~jax_blink.planning.cost.ExecutorCost` combines them. One tree
    alone: the simulator's time; trees sharing links: below it by at most the
    fill's slowdown (the simulator shares links during the fill too). It ranks
    candidates; the simulator scores them.
    """
    model = model or SimModel()
    graph = plan.topology.link_graph(plan.link_kinds)
    total = sum(t.weight for t in plan.trees)
    arcs, busy = _arc_loads(plan, size_bytes, graph)
    steps = [0] * plan.topology.n
    transfer = 0.0
    for tree, used, k in zip(plan.trees, arcs, chunks):
        share = size_bytes * tree.weight / total
        rate = min((graph.capacity_gbps[a] for a in used), default=tree.weight)  # alone on its links
        route_s = max((sum(model.latency_s(graph.arc_kind[graph.index[x, y]]) for x, y in zip(path, path[1:]))
                       for path in tree.paths + tree.up_paths), default=0.0)
        step_s = model.step_overhead_us * 1e-6 + route_s + share / (k * rate * _GB)
        hops = tree.round_trip if plan.collective == "allreduce" else tree.depth
        # the pipeline fills in hops - 1 steps, then its k chunks leave at the pace of the
        # tree's busiest link, which the other trees share
        transfer = max(transfer, (hops - 1) * step_s + max([k * step_s] + [busy[a] for a in used]))
        for u, v in tuple(tree.edges) + tuple(tree.reduce_edges):
            steps[u] += k
            steps[v] += k
    if executor is None:
        return transfer
    return executor.call_seconds(transfer, max(steps))


def transfer_floor_s(plan, size_bytes: int) -> float:
    """A lower bound on the simulated transfer of any lowering of ``plan``: the
    seconds its busiest link needs for the bytes every tree puts on it (each
    tree's share by weight). The simulator shares a link's capacity among its
    flows, so no lowering moves those bytes faster (tests/sim checks the bound
    against simulations of every preset)."""
    _, busy = _arc_loads(plan, size_bytes, plan.topology.link_graph(plan.link_kinds))
    return max(busy.values(), default=0.0)


def _arc_loads(plan, size_bytes, graph):
    """``(arcs, busy)``: the arcs each tree of ``plan`` sends over (:func:`_tree_arcs`),
    and the seconds each arc carries data for, over every tree (its share by weight)."""
    total = sum(t.weight for t in plan.trees)
    arcs = [_tree_arcs(tree, plan.collective, graph) for tree in plan.trees]
    busy = collections.Counter()
    for tree, used in zip(plan.trees, arcs):
        for a in used:
            busy[a] += size_bytes * tree.weight / total / (graph.capacity_gbps[a] * _GB)
    return arcs, busy


def _tree_arcs(tree, collective, graph) -> list:
    """The link-graph arcs ``tree`` sends over in ``collective`` (a route through a
    switch: each of its arcs), with repeats: down its paths to broadcast, up its
    reduce paths to reduce."""
    used = []
    if collective != "reduce":
        used += [graph.index[x, y] for path in tree.paths for x, y in zip(path, path[1:])]
    if collective in ("allreduce", "reduce", "reduce_scatter"):
        used += [graph.index[y, x] for path in tree.reduce_paths for x, y in zip(path, path[1:])]
    return used


def _simulate_best_estimates(candidates, size_bytes, dtype, max_chunks, executor, model, top, scored):
    """``(best Tuned, its candidate index, simulations)``: every candidate at every scale
    of :data:`ESTIMATE_SCALES`, ranked by :func:`estimate_seconds`; the ``top`` best
    lowered and simulated (but for those whose :func:`transfer_floor_s` and the
    executor's call cannot beat a lowering already simulated). Refining the two best of them
    by the simulated doubling and halving of :func:`tune`'s search, as this did until
    November 2026, changed no choice by 1% (against the exhaustive search: the 6 GPU presets
    and 224 DGX-1 V100 allocations of 2 to 7 GPUs, at 1, 16 and 256 MB) and took 40% of
    the tuning time (41 s of 689 tunings, 25 s without), so it is not done."""
    ranked = []
    for index, sub in enumerate(candidates):
        base = sub.chunks_for(size_bytes)
        seen = set()
        for scale in ESTIMATE_SCALES:
            chunks = tuple(min(max(round(k * scale), 1), max_chunks) for k in base)
            if chunks in seen:
                continue
            seen.add(chunks)
            ranked.append((estimate_seconds(sub, chunks, size_bytes, executor, model), index, chunks))
    ranked.sort(key=lambda r: r[0])
    simulated = {}  # candidate index -> its best simulated lowering
    fixed_s = 0.0 if executor is None else executor.call_s
    floors = {}  # candidate index -> transfer_floor_s, plus the executor's fixed cost
    count = 0
    for _, index, chunks in ranked[:max(1, top)]:
        sub = candidates[index]
        if index not in floors:
            floors[index] = transfer_floor_s(sub, size_bytes) + fixed_s
        if simulated and floors[index] >= min(t.seconds for t in simulated.values()):
            continue  # cannot beat what was simulated: not lowered, not simulated
        tuned = scored(sub.lower(size_bytes, dtype, chunks=list(chunks)), len(sub.trees), chunks, 0)
        count += 1
        if index not in simulated or tuned.seconds < simulated[index].seconds:
            simulated[index] = tuned
    best_index = min(simulated, key=lambda i: simulated[i].seconds)
    return simulated[best_index], best_index, count


def _fastest_scale(run):
    """``(fastest, simulations)``: ``run(scale)`` (a :class:`Tuned` whose chunks are the
    model's times ``scale``) at 1, then doubling, then halving the scale while that makes
    the predicted time (``Tuned.seconds``) shorter."""
    here = {1.0: run(1.0)}
    for step in (2.0, 0.5):
        scale = 1.0
        while True:
            nxt = scale * step
            if nxt not in here:
                here[nxt] = run(nxt)
            if here[nxt].seconds >= here[scale].seconds or here[nxt].chunks == here[scale].chunks:
                break
            scale = nxt
    return min(here.values(), key=lambda t: t.seconds), len(here)


def tune_baseline(name: str, topology, size_bytes: int, dtype="float32",
                  model: SimModel | None = None) -> Tuned:
    """The fastest chunking of the allreduce baseline ``name`` (one of
    :data:`jax_blink.sim.baselines.BASELINES`), by the search :func:`tune` gives
    each Blink candidate: the cost model's chunks scaled by powers of two while
    the simulation gets faster. ``num_trees`` is the schedule's tree count (its
    rings, for the ring), ``chunks`` a one-tuple of its total chunk count.

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> t = tune_baseline("nccl-ring", Topology.preset("dgx1-v100").subset([0, 1, 2, 3]), 2**20)
    >>> t.candidates >= 2 and t.result.time_s > 0
    True
    """
    from .baselines import baseline

    def run(scale):
        schedule = baseline(name, topology, size_bytes, dtype, model=model, chunk_scale=scale)
        result = simulate(schedule, topology, model=model)
        return Tuned(schedule, result, schedule.ntrees, (len(schedule.chunks),), 0, result.time_s)

    fastest, count = _fastest_scale(run)
    return dataclasses.replace(fastest, candidates=count)


_ENTRY_FORMAT = "jax_blink.tune_cache"


def _cache_key(plan, size_bytes, dtype, model, max_chunks, stars, executor, simulate_top) -> dict:
    """Everything a cached tuning answers, as a JSON object."""
    return {"cache_version": CACHE_VERSION, "sources": source_digest(), "subset_fractions": list(SUBSET_FRACTIONS),
            "simulate_top": simulate_top, "estimate_scales": list(ESTIMATE_SCALES),
            "executor": None if executor is None else dataclasses.asdict(executor),
            "topology": plan.topology.fingerprint(), "collective": plan.collective, "root": plan.root,
            "link_kinds": list(plan.link_kinds), "trees": [t.to_dict() for t in plan.trees],
            "size_bytes": int(size_bytes), "dtype": dtype_name(dtype), "max_chunks": int(max_chunks),
            "stars": bool(stars), "model": repr(model or SimModel()), "reduce_gbps": plan.topology.reduce_gbps}


def _store_choice(key: dict, index: int, best: Tuned) -> None:
    r = best.result
    store_keyed("tune", _ENTRY_FORMAT, key, {
        "candidate": index, "chunks": list(best.chunks),
        "result": {"time_s": r.time_s, "size_bytes": r.size_bytes, "collective": r.collective, "nranks": r.nranks,
                   "links": [[a, b, r.link_utilisation[a, b], r.link_bytes.get((a, b), 0)]
                             for a, b in r.link_utilisation],
                   "tree_finish_s": list(r.tree_finish_s), "rank_finish_s": list(r.rank_finish_s)}})


def _cached_choice(key, candidates, max_chunks, nranks):
    """``(candidate index, chunks, SimResult)`` from the disk entry for ``key``, or None
    (with a warning where an entry exists but does not fit)."""
    value = load_keyed("tune", _ENTRY_FORMAT, key)
    if value is None:
        return None
    try:
        index, chunks, r = value["candidate"], tuple(value["chunks"]), value["result"]
        if (type(index) is not int or not 0 <= index < len(candidates)
                or len(chunks) != len(candidates[index].trees)
                or not all(type(k) is int and 1 <= k <= max_chunks for k in chunks)):
            raise SimError(f"candidate {index!r:.20} with chunks {chunks!r:.60} does not fit the plan")
        links = {(int(a), int(b)): (float(u), float(c)) for a, b, u, c in r["links"]}
        result = SimResult(float(r["time_s"]), int(r["size_bytes"]), str(r["collective"]), int(r["nranks"]),
                           {k: v[0] for k, v in links.items()}, {k: v[1] for k, v in links.items()},
                           tuple(map(float, r["tree_finish_s"])), tuple(map(float, r["rank_finish_s"])))
        if result.nranks != nranks or not result.time_s > 0 or len(result.rank_finish_s) != nranks:
            raise SimError("its simulated result is not one of this plan's")
        return index, chunks, result
    except (SimError, KeyError, TypeError, ValueError) as e:
        logger.warning("jax_blink tuning cache: ignoring an entry and tuning afresh: %s", e)
        return None
