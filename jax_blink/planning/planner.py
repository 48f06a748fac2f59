"""The planner's entry point :func:`plan`: weighted spanning trees that maximise throughput.

Given a :class:`~jax_blink.topo.Topology`, :func:`plan` solves the
tree-packing LP exactly by column generation (cvxpy + HiGHS; a new tree is a
minimum spanning tree or minimum arborescence under the dual link prices),
certifies the rate against bounds computed without the LP
(:mod:`jax_blink.planning.bounds`), then picks the fewest trees that keep the optimal
rate (or a rate within ``tolerance``) with a MILP, shallow trees breaking ties.

Collectives and families (:mod:`jax_blink.planning.collectives`):

* broadcast / reduce: arborescences from / into the root;
* allreduce, family ``"tree"`` (Blink): undirected spanning trees, each
  reduced up to its root and broadcast back down, so a tree edge loads both
  directions of its link;
* allreduce, family ``"rsag"`` (reduce-scatter + all-gather): every rank roots
  trees of equal total weight, carrying its own 1/N slice up and down them.
  Both families load links alike, so their optimal rates agree; the planner
  computes both, keeps the faster, and on a tie prefers ``"rsag"`` when its
  trees are no deeper (every rank then does an equal share of the reduction,
  e.g. N depth-1 stars on shared memory).
* allreduce, family ``"split"``, only where some link's two directions
  differ (measured asymmetric PCIe): each piece is reduced up an
  arborescence into a root and broadcast down another arborescence out of
  it, so each phase can use the faster direction of a link. It contains the
  two families above, so its optimum is at least theirs (on symmetric links
  it is equal, so it is not planned there); it is kept only where it is
  faster, and not with ``max_trees``. Its bound is the split cut bound and
  LP duality (:func:`~jax_blink.planning.bounds.split_cut_bound`).
* reduce_scatter / allgather, family ``"rsag"`` only (ForestColl): every rank
  roots arborescences of equal total weight ``x``, into it (reduce-scatter:
  its 1/N slice reduced child to parent) or out of it (all-gather: its slice
  sent parent to child); the rate, nccl-tests' algbw, is ``N x``, certified
  by the cut bound of :func:`~jax_blink.planning.bounds.shard_bound`.

Links: by default (``links="all"``) the trees use every link the topology
has, NVLink, PCIe switches, QPI and NICs together (Blink's hybrid
transfers), and the certificate is over that same graph. ``links="fast"``
plans over NVLink alone wherever it joins all ranks (slow links then only
bridge NVLink islands), the planner's behaviour before hybrid plans, for
comparison. ``Plan.link_kinds`` records which kinds a plan may use,
``bound_gbps`` bounds throughput over those links, and
:meth:`Plan.rate_by_kind` says how much of the rate each kind carries
(full DGX-1V allreduce: 94.86 GB/s over all links, 85.71 over NVLink alone;
DGX-1P 54.86 and 45.71; broadcast from GPU 0 on the DGX-1V 166 and 150).

Planning time grows quickly with the rank count (allreduce on two cores:
shm:8 in 0.2 s, shm:32 in 0.6 s, shm:64 in 3 s, shm:128 in about 26 s;
reduce-scatter and all-gather price an arborescence per rank in every round:
a DGX-1 in 0.3 s, shm:8 in 0.05 s, shm:32 in 3 s, shm:64 in 7 s; ad hoc,
November 2026), so :func:`plan` refuses more than :data:`MAX_RANKS` ranks at
once, before any work.

This module is the driver: it checks the arguments, consults the cache
(:mod:`jax_blink.planning.cache`), packs each family (:mod:`jax_blink.planning.packing`,
:mod:`jax_blink.planning.fewest`), chooses between them, certifies the rate and
returns a checked :class:`~jax_blink.planning.result.Plan`.

Pure Python: never imports jax.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import time

import numpy as np

from ..topo import LINK_CHOICES, Topology
from . import cache as plan_cache
from .bounds import certified_bound
from .collectives import COLLECTIVES, FAMILIES, ROOTED
from .errors import PlanError
from .fewest import exact_weights, fewest_trees, lp_support
from .leaves import pack_leaves
from .packing import Packer
from .result import RATE_RTOL, Plan
from .rings import best_rings

__all__ = ["plan", "MAX_RANKS"]

#: The most ranks :func:`plan` plans for (see the module docstring for times).
MAX_RANKS = 64


def plan(topology: Topology, collective: str = "allreduce", root: int | None = None,
         max_trees: int | None = None, tolerance: float = 0.0, cache: bool = True, links: str = "all",
         slow_ranks=None) -> Plan:
    """Pack weighted spanning trees for ``collective`` on ``topology``.

    Parameters
    ----------
    topology : Topology
        At least two and at most :data:`MAX_RANKS` ranks, all joined by links.
    collective : {"allreduce", "broadcast", "reduce", "reduce_scatter", "allgather"}
        :data:`~jax_blink.planning.collectives.COLLECTIVES`.
    root : int, optional
        Root of a broadcast/reduce (default 0); must be None for the others.
    max_trees : int, optional
        Use at most this many trees (the rate may then fall below the bound);
        reduce-scatter and all-gather need at least one tree per rank.
    tolerance : float
        Accept a rate this fraction below the optimum if it saves trees
        (``0 <= tolerance < 1``).
    cache : bool
        Look up and store the plan in the process and disk caches
        (:mod:`jax_blink.planning.cache`: a disk entry is used only after it
        is checked against the request and its certificate). Processes that
        share the disk cache plan a request once, under its lock, and all use
        that plan (:func:`~jax_blink.planning.cache.planning`).
    links : {"all", "fast"}
        ``"all"`` (default): pack trees over every link of the topology
        (hybrid NVLink + PCIe/QPI/NIC transfers). ``"fast"``: over NVLink
        alone wherever it joins all ranks, else over every link, for
        comparison (:meth:`~jax_blink.topo.Topology.planning_kinds`).
    slow_ranks : sequence of int, optional
        Allreduce only: ranks that arrive late. The plan's trees then have
        them as leaves (never a root or a parent), so a late rank delays
        only its own last hop, wherever such trees reach the optimal rate
        within ``tolerance`` (:mod:`~jax_blink.planning.leaves`); otherwise
        the plan is the unrestricted one. :attr:`Plan.note` says which.

    Returns
    -------
    Plan

    Raises
    ------
    PlanError
        For bad arguments, more than :data:`MAX_RANKS` ranks, or a topology
        whose ranks are not all connected.

    Examples
    --------
    >>> p = plan(Topology.preset("dgx1-v100"), "broadcast", root=0)
    >>> round(p.rate_gbps, 6), p.bound_gbps  # NVLink and PCIe together
    (166.0, 166.0)
    >>> round(plan(Topology.preset("dgx1-v100"), "broadcast", links="fast").rate_gbps, 6)
    150.0
    >>> g = plan(Topology.preset("shm:4"), "allgather")  # 10 GB/s ports: 10 * 4 / 3
    >>> round(g.rate_gbps, 6), round(g.busbw_gbps, 6)
    (13.333333, 10.0)
    """
    if not isinstance(topology, Topology):
        raise PlanError(f"plan() needs a jax_blink.Topology, got {type(topology).__name__}")
    if collective not in COLLECTIVES:
        raise PlanError(f"unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")
    n = topology.n
    if n < 2:
        raise PlanError(f"{topology.name} has {n} rank; a collective needs no plan for one rank")
    if n > MAX_RANKS:
        raise PlanError(f"{topology.name} has {n} ranks; plan() plans for at most {MAX_RANKS} ranks "
                        f"(planning time grows steeply with the rank count)")
    if collective not in ROOTED:
        if root is not None:
            raise PlanError(f"{collective} has no root; pass root=None (got {root!r})")
    else:
        root = 0 if root is None else root
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < n:
            raise PlanError(f"root {root!r} is out of range: {topology.name} has ranks 0..{n - 1}")
        root = int(root)
    if max_trees is not None and (isinstance(max_trees, bool) or not isinstance(max_trees, (int, np.integer))
                                  or max_trees < 1):
        raise PlanError(f"max_trees must be a positive integer or None, got {max_trees!r}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real) or not 0 <= tolerance < 1:
        raise PlanError(f"tolerance must be a number in [0, 1), got {tolerance!r}")
    if max_trees is not None and "tree" not in FAMILIES[collective] and max_trees < n:
        raise PlanError(f"max_trees={max_trees} is too few for {collective}: every rank roots at least one "
                        f"tree, so {topology.name} needs max_trees >= {n}")
    if not isinstance(links, str) or links not in LINK_CHOICES:
        raise PlanError(f"links={links!r:.40} is not one of {', '.join(map(repr, LINK_CHOICES))}: 'all' plans "
                        f"over every link (NVLink, PCIe, QPI, NICs), 'fast' over NVLink alone where it joins the ranks")
    max_trees = None if max_trees is None else int(max_trees)
    tolerance = float(tolerance)
    slow = _slow_ranks(slow_ranks, topology, collective)

    options = (collective, root, max_trees, tolerance, links) + ((slow,) if slow else ())
    if not cache:
        return _plan_uncached(topology, collective, root, max_trees, tolerance, links, slow)[0]
    cached = plan_cache.lookup(topology, options)
    if cached is None:
        # processes sharing the cache plan a request once and load that plan: the time-limited
        # MILP may keep different packings under different loads (plan_cache.planning)
        with plan_cache.planning(topology, options):
            cached = plan_cache.lookup(topology, options)
            if cached is None:
                result, certificate = _plan_uncached(topology, collective, root, max_trees, tolerance, links,
                                                     slow)
                plan_cache.store(result, options, certificate)
                return result
    return cached if cached.topology is topology else dataclasses.replace(cached, topology=topology)


def _slow_ranks(slow_ranks, topology, collective) -> tuple:
    """``slow_ranks`` checked and sorted (``()`` for None)."""
    if slow_ranks is None:
        return ()
    if isinstance(slow_ranks, (str, bytes)) or not hasattr(slow_ranks, "__iter__"):
        raise PlanError(f"slow_ranks must be a sequence of rank numbers, got {slow_ranks!r:.60}")
    slow = list(slow_ranks)
    for r in slow:
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or not 0 <= r < topology.n:
            raise PlanError(f"slow rank {r!r:.20} is out of range: {topology.name} has ranks 0..{topology.n - 1}")
    if len(set(slow)) != len(slow):
        raise PlanError(f"slow_ranks {slow} names a rank twice")
    if slow and collective != "allreduce":
        raise PlanError(f"slow_ranks applies to allreduce plans (their trees reduce up and broadcast down); "
                        f"{collective} takes none")
    if slow and len(slow) >= topology.n:
        raise PlanError(f"slow_ranks names all {topology.n} ranks; a tree needs a fast rank at its root")
    return tuple(sorted(int(r) for r in slow))


def _with_slow_leaves(result, graph, slow, tolerance, max_trees):
    """``result``, or the packing whose ``slow`` ranks are leaves where it reaches the certified
    optimum (``result.bound_gbps``) within ``tolerance``; either way it records ``slow``
    (:attr:`Plan.slow_ranks`: the lowering reduces them last) and its :attr:`Plan.note` says
    which trees it kept."""
    restricted = pack_leaves(graph, slow)
    names = ", ".join(map(str, slow))
    kept = "; the plan keeps its trees and reduces them after every other child"
    if restricted is None:
        return dataclasses.replace(result, slow_ranks=slow,
                                   note=f"slow ranks {names}: no spanning tree has them all as leaves "
                                        f"(the other ranks are not joined without them){kept}")
    _, rate, trees = restricted
    fits = max_trees is None or len(trees) <= max_trees
    optimum = result.bound_gbps  # certified: the unrestricted packing's optimum
    if rate >= optimum * (1 - tolerance) * (1 - RATE_RTOL) and fits:
        return dataclasses.replace(result, family="tree", rate_gbps=rate, trees=trees, slow_ranks=slow,
                                   note=f"slow ranks {names} are leaves of every tree "
                                        f"({rate:.4g} GB/s of the optimum {optimum:.4g})")
    return dataclasses.replace(result, slow_ranks=slow,
                               note=f"slow ranks {names}: trees with them as leaves reach {rate:.4g} GB/s, "
                                    f"below the optimum {optimum:.4g} (tolerance {tolerance:g}"
                                    + ("" if fits else f", max_trees {max_trees}") + f"){kept}")


def _plan_uncached(topology, collective, root, max_trees, tolerance, links, slow=()):
    """Plan afresh: pack each family, keep the faster, certify it.

    Returns the checked :class:`Plan` and its certificate (the arc prices of
    each family's LP, from which its bound follows).
    """
    import cvxpy  # noqa: F401  (imported here, once per process, so plan_seconds is planning only)
    import networkx  # noqa: F401

    start = time.perf_counter()
    if topology.unreachable():
        parts = topology.components()
        raise PlanError(f"{topology.name} is disconnected: no link joins its {len(parts)} groups of "
                        f"ranks {' and '.join(str(list(p)) for p in parts)}; add the missing links or "
                        "plan on a connected subset")
    kinds = topology.planning_kinds(links)
    graph = topology.link_graph(kinds)
    # rsag needs a tree rooted at every rank; split gains only where a link's directions differ
    families = tuple(f for f in FAMILIES[collective]
                     if (f != "rsag" or max_trees is None or max_trees >= topology.n)
                     and (f != "split" or max_trees is None and not graph.symmetric))
    results = {}
    for family in families:
        # an allreduce's rsag packs the tree family's undirected trees, rooted at every rank: its
        # trees, each at 1/n of its weight per root, reach the same rate (column generation then
        # has little left to price)
        start_trees = results["tree"][1] if family == "rsag" and "tree" in results else ()
        _, rate, trees, arc_price = _pack(graph, collective, family, root, max_trees, tolerance, start_trees)
        results[family] = (rate, trees, arc_price)
    family = families[0]
    if "rsag" in results and "tree" in results:
        tree_rate, rsag_rate = results["tree"][0], results["rsag"][0]
        tie = math.isclose(tree_rate, rsag_rate, rel_tol=RATE_RTOL)
        # on a tie the shallower, then the one of fewer trees (each costs steps)
        rsag_shape = (max(t.depth for t in results["rsag"][1]), len(results["rsag"][1]))
        trees_shape = (max(t.depth for t in results["tree"][1]), len(results["tree"][1]))
        if rsag_rate > tree_rate and not tie or tie and rsag_shape <= trees_shape:
            family = "rsag"
    if "split" in results and results["split"][0] > results[family][0] * (1 + RATE_RTOL):
        family = "split"
    rate, trees, _ = results[family]
    certificate = [r[2] for r in results.values()]
    bound = certified_bound(graph, collective, root, certificate)
    rings = best_rings(topology)
    result = Plan(collective, root, family, rate, bound, rings.rate_gbps(collective), trees,
                  time.perf_counter() - start, topology, kinds)
    if slow:
        result = _with_slow_leaves(result, graph, slow, tolerance, max_trees)
        result = dataclasses.replace(result, plan_seconds=time.perf_counter() - start)
    return result.check(), certificate


def _pack(graph, collective, family, root, max_trees, tolerance, start_trees=()):
    """Pack one family: its LP-optimal rate, the rate and trees after minimising the tree
    count, and the LP's arc duals (for the certificate). ``start_trees`` (undirected trees
    of an allreduce) start the column generation, as columns rooted at every rank."""
    packer = Packer(graph, collective, family, root)
    for tree in start_trees:
        for r in range(graph.n):
            packer.add(r, tree.edges, tree.paths)
    lp_rate, _, arc_price = packer.generate()
    target = lp_rate * (1.0 - tolerance) * (1 - 1e-9)
    candidates = []
    fewer_than = None  # the MILP seeks only packings of fewer trees than the carved one
    if family == "tree":  # rsag's per-root balance already forces one tree per rank
        carved = packer.carve(lp_rate)
        packer.widest(runs=2)
        if carved is not None and (max_trees is None or len(carved) <= max_trees):
            candidates.append(exact_weights(packer, carved))
            if max_trees is None and candidates[-1][0] >= target:
                fewer_than = len(candidates[-1][1])
    for attempt in range(4):  # add columns until the MILP reaches the target
        chosen = fewest_trees(packer, target, max_trees, fewer_than)
        if chosen:  # (none: nothing beats the carved packing in the MILP's time)
            candidates.append(exact_weights(packer, chosen))
        if candidates[-1][0] >= target or max_trees is None:
            break
        packer.widest(runs=2, seed=attempt + 1)
    if tolerance > 0 and max_trees is None:
        # the time-limited MILP may do better aiming at the optimum itself
        chosen = fewest_trees(packer, lp_rate * (1 - 1e-9), None, fewer_than)
        if chosen:
            candidates.append(exact_weights(packer, chosen))
    if max_trees is None:  # the time-limited MILP may fall short, or stop at more trees than the LP's own
        candidates.append(exact_weights(packer, lp_support(packer)))
    reaching = [c for c in candidates if c[0] >= target]
    best = (min(reaching, key=lambda c: (len(c[1]), -c[0])) if reaching
            else max(candidates, key=lambda c: (c[0], -len(c[1]))))
    return lp_rate, best[0], best[1], arc_price
