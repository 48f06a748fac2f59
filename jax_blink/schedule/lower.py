"""Lowering weighted spanning trees into a chunked, pipelined :class:`~jax_blink.schedule.Schedule`.

:func:`lower_trees` splits the vector among the trees by weight and each
tree's share into pipeline chunks, emits the reduce-up / broadcast-down
steps of every chunk, and orders each rank's steps by their earliest start
so that in-order execution pipelines all trees and chunks.

Pure Python: never imports jax.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Sequence

import numpy as np

from .constants import COLLECTIVE_CODE, COLLECTIVES, DTYPES, ScheduleError, dtype_name
from .format import Schedule, Step

__all__ = ["lower_trees", "split_proportional"]


def split_proportional(total: int, weights: Sequence[float]) -> list:
    """Split ``total`` units into integers proportional to ``weights``
    (largest-remainder rounding; sums exactly to ``total``)."""
    wsum = float(sum(weights))
    if wsum <= 0:
        raise ScheduleError("tree weights must sum to a positive value")
    exact = [total * w / wsum for w in weights]
    parts = [int(e) for e in exact]
    order = sorted(range(len(weights)), key=lambda i: (parts[i] - exact[i], i))
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


def _children(edges, nranks, root):
    """Children lists of a rooted tree given (parent, child) edges; checks it spans."""
    children = defaultdict(list)
    parent = {}
    for p, c in edges:
        if c in parent or c == root:
            raise ScheduleError(f"tree rooted at {root}: rank {c} has two parents")
        parent[c] = p
        children[p].append(c)
    seen, stack = {root}, [root]
    while stack:
        for c in children[stack.pop()]:
            seen.add(c)
            stack.append(c)
    if len(seen) != nranks or len(parent) != nranks - 1:
        missing = sorted(set(range(nranks)) - seen)
        raise ScheduleError(f"tree rooted at {root} does not span the ranks: unreachable {missing}")
    return {p: sorted(cs) for p, cs in children.items()}, parent


def lower_trees(trees: Iterable, *, nranks: int, collective: str, root: int = -1,
                count: int, dtype, chunks=1, align_bytes: int = 64, routes=None) -> Schedule:
    """Lower weighted spanning trees into a pipelined :class:`Schedule`.

    ``[0, count)`` is split among the trees in proportion to their weights
    (bandwidth shares), each tree's segment into ``chunks`` pieces. For each
    piece an allreduce reduces up the tree (children's partial sums into their
    parent, children in ascending rank order) and broadcasts the root's result
    down it; a reduce does only the first phase, a broadcast only the second.
    Each rank's steps are ordered by their earliest possible time in the
    dependency graph, so that in-order execution pipelines the pieces of all
    trees.

    Parameters
    ----------
    trees : iterable
        Objects with ``root`` (int), ``edges`` (``(parent, child)`` pairs in
        broadcast direction) and ``weight`` (float > 0).
    nranks, collective, root, count, dtype
        As in :class:`Schedule`; ``root`` is ignored for allreduce (each tree
        has its own) and must equal every tree's root otherwise.
    chunks : int or sequence of int
        Pipeline chunks per tree (clamped to what the segment can hold).
    align_bytes : int
        Chunk boundaries fall on multiples of this many bytes where possible.
    routes : sequence, optional
        Per tree, the node path of each of its edges, in the order of
        ``edges`` (parent first, switch nodes in between): the routes the
        planner chose, carried in :attr:`Schedule.routes` for the simulator.

    Examples
    --------
    >>> from types import SimpleNamespace as T
    >>> star = T(root=0, edges=[(0, 1), (0, 2)], weight=1.0)
    >>> s = lower_trees([star], nranks=3, collective="allreduce", count=100,
    ...                 dtype="float32", chunks=2).validate()
    >>> len(s.chunks), s.num_steps
    (2, 16)
    """
    trees = list(trees)
    dtype = dtype_name(dtype)
    if collective not in COLLECTIVE_CODE:
        raise ScheduleError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")
    if count < 1:
        raise ScheduleError(f"count must be >= 1, got {count}")
    if not trees:
        raise ScheduleError("lower_trees needs at least one tree")
    if collective == "allreduce":
        root = -1
    elif any(t.root != root for t in trees):
        raise ScheduleError(f"every {collective} tree must be rooted at {root}")
    def positive_int(k):
        return isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)) and k >= 1

    per_tree_chunks = ([chunks] * len(trees) if isinstance(chunks, (int, np.integer, bool, np.bool_))
                       else list(chunks) if isinstance(chunks, (list, tuple, np.ndarray)) else None)
    if per_tree_chunks is None or len(per_tree_chunks) != len(trees) \
            or not all(positive_int(k) for k in per_tree_chunks):
        raise ScheduleError(f"chunks must be a positive int or one positive int per tree ({len(trees)}), "
                            f"got {chunks!r:.60}")
    per_tree_routes = [None] * len(trees) if routes is None else [tuple(map(tuple, r)) for r in routes]
    if len(per_tree_routes) != len(trees):
        raise ScheduleError(f"routes lists {len(per_tree_routes)} trees, expected one per tree ({len(trees)})")
    for tree, paths in zip(trees, per_tree_routes):
        if paths is not None and [(p[0], p[-1]) for p in paths] != [tuple(e) for e in tree.edges]:
            raise ScheduleError(f"tree rooted at {tree.root}: routes {[list(p) for p in paths]} do not "
                                f"join the ends of its edges {[list(e) for e in tree.edges]} in order")

    align = max(1, align_bytes // DTYPES[dtype][1])
    units = -(-count // align)  # aligned blocks; the last may be short
    shares = split_proportional(units, [t.weight for t in trees])

    chunk_table = []
    work = []  # (tree index in schedule, tree, chunk ids)
    kept_routes = []
    start_unit = 0
    for tree, share, k, paths in zip(trees, shares, per_tree_chunks, per_tree_routes):
        if share == 0:
            continue
        kept_routes.append(paths)
        ids = []
        for piece in split_proportional(share, [1.0] * min(k, share)):
            lo = start_unit * align
            start_unit += piece
            hi = min(start_unit * align, count)
            ids.append(len(chunk_table))
            chunk_table.append((lo, hi - lo))
        work.append((len(work), tree, ids))

    # Each rank's steps in semantic order per (rank, chunk), before sorting.
    raw = [[] for _ in range(nranks)]  # (op, chunk, peer, tree)
    for tindex, tree, ids in work:
        children, parent = _children(tree.edges, nranks, tree.root)
        order = _postorder(tree.root, children)
        for c in ids:
            if collective != "broadcast":
                for v in order:  # children before parents
                    for ch in children.get(v, ()):
                        raw[v].append(("RECV_REDUCE", c, ch, tindex))
                    if v != tree.root:
                        raw[v].append(("SEND", c, parent[v], tindex))
            if collective != "reduce":
                for v in reversed(order):  # parents before children
                    if v != tree.root:
                        raw[v].append(("RECV_COPY", c, parent[v], tindex))
                    for ch in children.get(v, ()):
                        raw[v].append(("SEND", c, ch, tindex))
    steps = _order_steps(raw)
    return Schedule(nranks, count, collective, root, dtype, len(work),
                    tuple(chunk_table), steps, () if routes is None else tuple(kept_routes))


def _postorder(root, children):
    out, stack = [], [(root, False)]
    while stack:
        v, expanded = stack.pop()
        if expanded:
            out.append(v)
        else:
            stack.append((v, True))
            stack.extend((c, False) for c in reversed(children.get(v, ())))
    return out


def _order_steps(raw):
    """Add chain dependencies and sort each rank's steps by earliest start.

    Within a (rank, chunk), each step depends on the previous non-SEND step
    and a non-SEND step also on the SENDs since then (the determinism rule).
    Steps are then levelled by longest path in the graph of those
    dependencies, SEND->RECV matches, and the executors' "receiver has read
    it before the sender overwrites it" waits (a chain of RECV_REDUCEs of one
    chunk counts as one level), and each rank's list is sorted by (level,
    semantic position): in-order execution is deadlock-free and pipelined.

    Linear in the number of steps (and their dependencies) but for the final
    per-rank sort: every lookup (the step a RECV matches, the sender's next
    write of the chunk) is precomputed by one pass over each rank's steps.
    """
    local_deps = []
    next_write = []  # per rank and step: the rank's next non-SEND step of the same chunk, or -1
    for steps in raw:
        deps = []
        last_write, sends_since = {}, defaultdict(list)
        for i, (op, chunk, _, _) in enumerate(steps):
            d = [last_write[chunk]] if chunk in last_write else []
            if op != "SEND":
                d += sends_since[chunk]
                last_write[chunk] = i
                sends_since[chunk] = []
            else:
                sends_since[chunk].append(i)
            deps.append(d)
        local_deps.append(deps)
        following, upcoming = [-1] * len(steps), {}
        for i in range(len(steps) - 1, -1, -1):
            op, chunk = steps[i][0], steps[i][1]
            following[i] = upcoming.get(chunk, -1)
            if op != "SEND":
                upcoming[chunk] = i
        next_write.append(following)

    # Global graph over nodes offset[r] + i, edges as (successor, level increment).
    offset = [0]
    for steps in raw:
        offset.append(offset[-1] + len(steps))
    total = offset[-1]
    succs = [[] for _ in range(total)]
    indeg = [0] * total

    def edge(u, v, inc):
        succs[u].append((v, inc))
        indeg[v] += 1

    send_at = {}
    for r, steps in enumerate(raw):
        base = offset[r]
        for i, (op, chunk, peer, _) in enumerate(steps):
            deps = local_deps[r][i]
            # consecutive RECV_REDUCEs of a chunk share a level, so they stay
            # adjacent and an executor can fuse them into one pass
            chained = op == "RECV_REDUCE" and len(deps) == 1 and steps[deps[0]][0] == op
            for d in deps:
                edge(base + d, base + i, 0 if chained else 1)
            if op == "SEND":
                send_at[(r, peer, chunk)] = i
    for r, steps in enumerate(raw):
        for i, (op, chunk, peer, _) in enumerate(steps):
            if op != "SEND":
                j = send_at[(peer, r, chunk)]
                edge(offset[peer] + j, offset[r] + i, 1)
                # the sender's next write of this chunk waits for this read
                k = next_write[peer][j]
                if k >= 0:
                    edge(offset[r] + i, offset[peer] + k, 1)
    level = [0] * total
    ready = [v for v in range(total) if indeg[v] == 0]
    seen = 0
    while ready:  # longest path: the order nodes are taken in does not change it
        v = ready.pop()
        seen += 1
        lv = level[v]
        for s, inc in succs[v]:
            if level[s] < lv + inc:
                level[s] = lv + inc
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if seen != total:
        raise ScheduleError("internal error: lowered steps form a dependency cycle")

    out = []
    for r, steps in enumerate(raw):
        base = offset[r]
        order = sorted(range(len(steps)), key=lambda i: (level[base + i], i))
        new_index = {old: new for new, old in enumerate(order)}
        out.append(tuple(
            Step(steps[i][0], steps[i][1], steps[i][2], steps[i][3],
                 tuple(sorted(new_index[d] for d in local_deps[r][i])))
            for i in order))
    return tuple(out)
