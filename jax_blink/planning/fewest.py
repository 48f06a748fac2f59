"""Fewest trees: the MILP that keeps a target rate with as few (then as shallow) trees as possible.

Every tree costs streams, kernel launches and latency. After the LP,
:func:`fewest_trees` picks the fewest columns of a
:class:`~jax_blink.planning.packing.Packer` whose weights still reach the target
rate (cvxpy with HiGHS, time-limited), and :func:`exact_weights` solves the
LP on the chosen columns for their final weights.

Pure Python: never imports jax.
"""

from __future__ import annotations

import numpy as np

from .errors import PlanError
from .packing import pair_split
from .solver import solve
from .tree import Tree

__all__ = ["fewest_trees", "lp_support", "exact_weights", "MILP_TIME_LIMIT_S"]

#: Time limit of each MILP solve; the solver keeps its best incumbent (on the whole DGX-1s
#: HiGHS spends the limit on cuts at the root). 0.1 s plans as well as 0.25 s, in two thirds
#: of the time (docs/design_notes.md, "The tree-count MILP's time limit"); under load the
#: incumbent may have more trees.
MILP_TIME_LIMIT_S = 0.1


def fewest_trees(packer, target: float, max_trees: int | None, fewer_than: int | None = None) -> list:
    """Fewest (then shallowest) columns of ``packer`` reaching ``target``; returns their indices.

    With ``max_trees``, the rate is maximised under that count first and
    the target lowered to what it reaches. With ``fewer_than`` (the count of a
    packing the caller holds already), only packings of fewer columns are
    sought, and ``[]`` is returned where the time-limited MILP finds none or
    proves there is none: on the whole DGX-1s' broadcasts the carved packing of
    :meth:`~jax_blink.planning.packing.Packer.carve` (6-13 trees) is what the
    MILP does not reach in its time (it stops at 25-36 trees), and the bound
    lets it prove a carved packing optimal in a fraction of its time.

    The MILP is scaled so that the solver's absolute tolerances are relative
    ones: each column's weight is a fraction ``x`` of its widest possible
    weight (``0 <= x <= z``), each capacity row is divided by its capacity,
    and rates are in units of ``target``. Without that, a tiny bottleneck
    (``target`` below the feasibility tolerance) lets every ``z`` be 0.
    Where the time-limited MILP finds no solution that picks a column, the
    columns of the LP optimum are used (:func:`lp_support`).
    """
    import cvxpy as cp

    cols = packer.columns
    m = len(cols)
    if not m or not target > 0:
        raise PlanError(f"internal error: fewest_trees needs columns and a positive target "
                        f"(got {m} columns, target {target!r})")
    cap = packer.graph.capacity_gbps
    big = np.array([np.min(cap[c.use > 0] / c.use[c.use > 0]) for c in cols])
    load = packer.matrix(cols) * big[None, :] / cap[:, None]
    gain = big / target
    z = cp.Variable(m, boolean=True)
    x = cp.Variable(m, nonneg=True)
    base = [load @ x <= 1.0, x <= z]
    if max_trees is not None:
        base.append(cp.sum(z) <= max_trees)
    if packer.family == "rsag":
        t = cp.Variable()
        base.append(packer.root_matrix(cols) @ cp.multiply(gain, x) >= t / packer.n)
        rate = t
    elif packer.family == "split":  # reduce trees count; every rank broadcasts what it reduces
        base.append(packer.balance_matrix(cols) @ cp.multiply(gain, x) <= 0)
        rate = (packer.rate_vector(cols) * gain) @ x
    else:
        rate = gain @ x
    goal = 1.0
    if max_trees is not None:
        best = cp.Problem(cp.Maximize(rate), base)
        solve(best, time_limit_s=MILP_TIME_LIMIT_S, inaccurate_ok=True)
        if best.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) or best.value is None:
            return lp_support(packer, max_trees)
        goal = min(goal, float(best.value) * (1 - 1e-9))
    depth = np.array([c.depth for c in cols], dtype=float)
    epsilon = 1.0 / (m * (depth.max() + 1) + 1)  # depth only breaks ties of the count
    if fewer_than is not None:
        base.append(cp.sum(z) <= fewer_than - 1)
    problem = cp.Problem(cp.Minimize(cp.sum(z) + epsilon * depth @ z), base + [rate >= goal])
    solve(problem, time_limit_s=MILP_TIME_LIMIT_S, inaccurate_ok=True)  # keeps its best incumbent
    chosen = [] if z.value is None else [j for j in range(m) if z.value[j] > 0.5]
    if fewer_than is not None:
        return chosen
    return chosen or lp_support(packer, max_trees)


def lp_support(packer, max_trees: int | None = None) -> list:
    """The columns of the packing LP's optimum over all of ``packer``'s columns.

    With ``max_trees``, the heaviest of them: first the heaviest column of
    each root for ``"rsag"`` (every rank must root a tree), then by weight.
    Used where the time-limited MILP of :func:`fewest_trees` returns nothing.
    """
    _, weights, _, _ = packer.solve_lp(packer.columns)
    order = [j for j in np.argsort(-weights, kind="stable") if weights[j] > 1e-9 * weights.max()]
    if max_trees is None or len(order) <= max_trees:
        return sorted(int(j) for j in order)
    first = {}
    if packer.family == "rsag":
        for j in order:
            first.setdefault(packer.columns[j].root, j)
    picked = list(first.values())
    picked += [j for j in order if j not in picked][:max(0, max_trees - len(picked))]
    return sorted(int(j) for j in picked)


def exact_weights(packer, chosen) -> tuple:
    """Exact weights on the chosen columns, cleared of solver slop.

    Returns
    -------
    (float, tuple of Tree)
        The rate and the trees of positive weight (for ``"split"``, the
        reduce and broadcast columns paired by :func:`~jax_blink.planning.packing.pair_split`).
    """
    cols = [packer.columns[j] for j in chosen]
    rate, weights, _, _ = packer.solve_lp(cols)
    # remove solver slop: scale into capacity, then equalise rsag roots
    load = packer.matrix(cols) @ weights
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(load > 0, packer.graph.capacity_gbps / load, np.inf)
    weights = weights * min(1.0, float(ratio.min()))
    if packer.family == "rsag":
        per_root = packer.root_matrix(cols) @ weights
        share = float(per_root.min())
        weights = weights * np.array([share / per_root[c.root] for c in cols])
    if packer.family == "split":
        trees = pair_split(cols, weights)
        return float(sum(t.weight for t in trees)), trees
    keep = [j for j, wt in enumerate(weights) if wt > 1e-9 * max(weights.max(), 1e-300)]
    trees = tuple(Tree(float(weights[j]), cols[j].root, cols[j].edges, cols[j].paths) for j in keep)
    if packer.family == "rsag":
        rate = packer.n * float(sum(t.weight for t in trees if t.root == 0))
    else:
        rate = float(sum(t.weight for t in trees))
    return rate, trees
