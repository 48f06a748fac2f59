"""Lowering weighted spanning trees into a chunked, pipelined :class:`~jax_blink.schedule.Schedule`.

:func:`lower_trees` splits the vector (or, for reduce_scatter and
allgather, each rank's shard) among the trees by weight and each tree's
share into pipeline chunks, emits the reduce-up / broadcast-down steps of
every chunk, and orders each rank's steps by their earliest start so that
in-order execution pipelines all trees and chunks. :func:`lower_ring`
writes NCCL's ring algorithm (allreduce, reduce_scatter, allgather).

Pure Python: never imports jax.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Sequence

import numpy as np

from .._gcpause import gc_paused
from .constants import COLLECTIVES, DTYPES, REDUCE_OPS, ROOTED, ScheduleError, dtype_name, io_counts
from .format import Schedule, Step

__all__ = ["lower_trees", "lower_ring", "split_proportional"]


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


def _children(edges, nranks, root, late=frozenset()):
    """Children lists of a rooted tree given (parent, child) edges, in ascending rank order
    with the ranks of ``late`` last; checks it spans."""
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
    return {p: sorted(cs, key=lambda c: (c in late, c)) for p, cs in children.items()}, parent


def _positive_int(k) -> bool:
    return isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)) and k >= 1


def _check_common(collective, count, dtype, op, allowed=COLLECTIVES):
    dtype = dtype_name(dtype)
    if collective not in allowed:
        raise ScheduleError(f"unknown collective {collective!r}; expected one of {allowed}")
    if op not in REDUCE_OPS:
        raise ScheduleError(f"unknown reduce op {op!r:.40}; expected one of {REDUCE_OPS}")
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise ScheduleError(f"count must be an int >= 1, got {count!r:.40}")
    return dtype


def lower_trees(trees: Iterable, *, nranks: int, collective: str, root: int = -1,
                count: int, dtype, chunks=1, align_bytes: int = 64, routes=None, op: str = "sum",
                late: Iterable[int] = ()) -> Schedule:
    """Lower weighted spanning trees into a pipelined :class:`Schedule`.

    allreduce, broadcast, reduce: ``[0, count)`` is split among the trees in
    proportion to their weights (bandwidth shares), each tree's segment into
    ``chunks`` pieces. For each piece an allreduce reduces up the tree
    (children's partial results into their parent, children in ascending
    rank order but the ranks of ``late`` last) and broadcasts the root's result down it; a reduce does only
    the first phase, a broadcast only the second. An allreduce tree with
    ``up_edges`` (the planner's ``"split"`` family) reduces up those edges
    into the same root instead, and gets a second tree index in the
    schedule for that phase (its routes are the tree's ``up_paths``).

    reduce_scatter, allgather: every rank roots at least one tree. Shard
    ``r`` (``[r * count / nranks, (r + 1) * count / nranks)``) is split among
    the trees rooted at ``r`` in proportion to their weights, each piece into
    ``chunks`` pieces (boundaries aligned relative to the shard's start). A
    reduce_scatter reduces each piece up its tree to the root only; an
    allgather broadcasts each piece down from its root only.

    Each rank's steps are ordered by their earliest possible time in the
    dependency graph, so that in-order execution pipelines the pieces of all
    trees.

    Parameters
    ----------
    trees : iterable
        Objects with ``root`` (int), ``edges`` (``(parent, child)`` pairs in
        broadcast direction) and ``weight`` (float > 0); for an allreduce,
        optionally ``up_edges`` (``(parent, child)`` pairs of another tree
        to reduce up) and, with ``routes``, ``up_paths``.
    nranks, collective, root, count, dtype
        As in :class:`Schedule`; ``root`` is ignored for allreduce,
        reduce_scatter and allgather (each tree has its own) and must equal
        every tree's root otherwise. ``count`` is the full vector's length.
    chunks : int or sequence of int
        Pipeline chunks per tree (clamped to what the segment can hold).
    align_bytes : int
        Chunk boundaries fall on multiples of this many bytes (from the
        start of the vector, or of the shard) where possible.
    routes : sequence, optional
        Per tree, the node path of each of its edges, in the order of
        ``edges`` (parent first, switch nodes in between): the routes the
        planner chose, carried in :attr:`Schedule.routes` for the simulator.
    op : str
        ``"sum"``, ``"max"`` or ``"min"``: what RECV_REDUCE computes
        (recorded in the schedule).
    late : iterable of int
        Ranks expected to arrive late (``plan(slow_ranks=...)``): every parent
        reduces them after its other children, so that while it waits for
        one it has folded in everything else of every chunk (the executors
        run any step whose dependencies are met; a chunk's reductions are
        one chain).

    Examples
    --------
    >>> from types import SimpleNamespace as T
    >>> star = T(root=0, edges=[(0, 1), (0, 2)], weight=1.0)
    >>> s = lower_trees([star], nranks=3, collective="allreduce", count=100,
    ...                 dtype="float32", chunks=2).validate()
    >>> len(s.chunks), s.num_steps
    (2, 16)
    >>> stars = [T(root=r, edges=[(r, c) for c in range(3) if c != r], weight=1.0) for r in range(3)]
    >>> rs = lower_trees(stars, nranks=3, collective="reduce_scatter", count=30, dtype="float32",
    ...                  op="max").validate()
    >>> rs.out_count, rs.chunks
    (10, ((0, 10), (10, 10), (20, 10)))
    """
    trees = list(trees)
    dtype = _check_common(collective, count, dtype, op)
    if not trees:
        raise ScheduleError("lower_trees needs at least one tree")
    sharded = collective in ("reduce_scatter", "allgather")
    if collective not in ROOTED:
        root = -1
    elif any(t.root != root for t in trees):
        raise ScheduleError(f"every {collective} tree must be rooted at {root}")
    if sharded:
        io_counts(collective, count, nranks)
        unrooted = sorted(set(range(nranks)) - {t.root for t in trees})
        if unrooted:
            raise ScheduleError(f"a {collective} needs a tree rooted at every rank (its shard goes up or down "
                                f"its trees); no tree is rooted at rank(s) {unrooted[:16]}")

    per_tree_chunks = ([chunks] * len(trees) if isinstance(chunks, (int, np.integer, bool, np.bool_))
                       else list(chunks) if isinstance(chunks, (list, tuple, np.ndarray)) else None)
    if per_tree_chunks is None or len(per_tree_chunks) != len(trees) \
            or not all(_positive_int(k) for k in per_tree_chunks):
        raise ScheduleError(f"chunks must be a positive int or one positive int per tree ({len(trees)}), "
                            f"got {chunks!r:.60}")
    per_tree_routes = [None] * len(trees) if routes is None else [tuple(map(tuple, r)) for r in routes]
    if len(per_tree_routes) != len(trees):
        raise ScheduleError(f"routes lists {len(per_tree_routes)} trees, expected one per tree ({len(trees)})")
    late = frozenset(int(r) for r in late)
    up_edges = [tuple(getattr(t, "up_edges", ()) or ()) for t in trees]
    if collective != "allreduce" and any(up_edges):
        raise ScheduleError(f"only an allreduce reduces up a tree of its own (up_edges); this is a {collective}")
    per_tree_up_routes = [None] * len(trees)
    if routes is not None:
        for i, (t, up) in enumerate(zip(trees, up_edges)):
            if up and getattr(t, "up_paths", None) is None:
                raise ScheduleError(f"tree rooted at {t.root} has up_edges but no up_paths for its routes")
            per_tree_up_routes[i] = tuple(map(tuple, t.up_paths)) if up else None
    checks = [(t, p, t.edges) for t, p in zip(trees, per_tree_routes)]
    checks += [(t, p, e) for t, p, e in zip(trees, per_tree_up_routes, up_edges) if e]
    for tree, paths, edges in checks:
        if paths is not None and [(p[0], p[-1]) for p in paths] != [tuple(e) for e in edges]:
            raise ScheduleError(f"tree rooted at {tree.root}: routes {[list(p) for p in paths]} do not "
                                f"join the ends of its edges {[list(e) for e in edges]} in order")

    align = max(1, align_bytes // DTYPES[dtype][1])
    # (start, end, tree indices): the vector, or each shard with the trees rooted at its rank
    if sharded:
        shard = count // nranks
        regions = [(r * shard, (r + 1) * shard, [i for i, t in enumerate(trees) if t.root == r])
                   for r in range(nranks)]
    else:
        regions = [(0, count, list(range(len(trees))))]

    chunk_table = []
    work = []  # (edges reduced up, their tree index in the schedule, the tree, its index, chunk ids)
    kept_routes = []
    for lo_region, hi_region, members in regions:
        units = -(-(hi_region - lo_region) // align)  # aligned blocks; the last may be short
        shares = split_proportional(units, [trees[i].weight for i in members])
        start_unit = 0
        for i, share in zip(members, shares):
            if share == 0:
                continue
            index = up_index = len(kept_routes)
            kept_routes.append(per_tree_routes[i])
            if up_edges[i]:
                up_index = len(kept_routes)
                kept_routes.append(per_tree_up_routes[i])
            ids = []
            for piece in split_proportional(share, [1.0] * min(per_tree_chunks[i], share)):
                lo = lo_region + start_unit * align
                start_unit += piece
                hi = min(lo_region + start_unit * align, hi_region)
                ids.append(len(chunk_table))
                chunk_table.append((lo, hi - lo))
            work.append((up_edges[i] or trees[i].edges, up_index, trees[i], index, ids))

    # Each rank's steps in semantic order per (rank, chunk), before sorting.
    raw = [[] for _ in range(nranks)]  # (op, chunk, peer, tree)
    up = collective in ("allreduce", "reduce", "reduce_scatter")
    down = collective in ("allreduce", "broadcast", "allgather")
    for reduce_edges, up_index, tree, tindex, ids in work:
        children, parent = _children(tree.edges, nranks, tree.root, late)
        order = _postorder(tree.root, children)
        up_children, up_parent = _children(reduce_edges, nranks, tree.root, late)
        up_order = _postorder(tree.root, up_children)
        for c in ids:
            if up:
                for v in up_order:  # children before parents
                    for ch in up_children.get(v, ()):
                        raw[v].append(("RECV_REDUCE", c, ch, up_index))
                    if v != tree.root:
                        raw[v].append(("SEND", c, up_parent[v], up_index))
            if down:
                for v in reversed(order):  # parents before children
                    if v != tree.root:
                        raw[v].append(("RECV_COPY", c, parent[v], tindex))
                    for ch in children.get(v, ()):
                        raw[v].append(("SEND", c, ch, tindex))
    steps = _order_steps(raw)
    return Schedule(nranks, count, collective, root, dtype, len(kept_routes),
                    tuple(chunk_table), steps, () if routes is None else tuple(kept_routes), op)


def lower_ring(order: Sequence[int], *, collective: str, count: int, dtype, chunks=1, op: str = "sum") -> Schedule:
    """NCCL's ring algorithm over the ranks in ``order`` as a :class:`Schedule`.

    The vector is split into one segment per rank (for reduce_scatter and
    allgather the segment of rank ``x`` is its shard; for allreduce
    ``[x * count // n, (x + 1) * count // n)``), each segment into ``chunks``
    pipeline chunks. Going around the ring (position ``p`` sends to position
    ``p + 1``), the segment of the rank at position ``p`` is reduced in
    ``n - 1`` steps starting at position ``p + 1`` and completes at ``p``
    (reduce-scatter); from there it is copied around in ``n - 1`` more steps
    (all-gather). An allreduce does both phases, exactly NCCL's ring
    allreduce; a reduce_scatter the first, an allgather the second (the
    segment leaving its owner). A link carries a chunk once in each phase:
    the schedule repeats (sender, receiver, chunk) triples.

    Parameters
    ----------
    order : sequence of int
        A permutation of ``range(n)``: the ring.
    collective : str
        ``"allreduce"``, ``"reduce_scatter"`` or ``"allgather"``.
    count, dtype, op
        As in :class:`Schedule`.
    chunks : int
        Pipeline chunks per segment (clamped to the segment's length).

    Examples
    --------
    >>> s = lower_ring([0, 2, 1, 3], collective="allreduce", count=8, dtype="float32").validate()
    >>> s.num_steps  # 4 ranks x 3 reduce-scatter + 3 all-gather steps x (send + receive)
    48
    """
    dtype = _check_common(collective, count, dtype, op, allowed=("allreduce", "reduce_scatter", "allgather"))
    order = list(order)
    n = len(order)
    if n < 1 or sorted(int(x) for x in order) != list(range(n)) \
            or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in order):
        raise ScheduleError(f"order must be a permutation of range(n), got {order!r:.80}")
    if not _positive_int(chunks):
        raise ScheduleError(f"chunks must be a positive int, got {chunks!r:.60}")
    io_counts(collective, count, n)
    chunk_table = []
    raw = [[] for _ in range(n)]
    rs = collective in ("allreduce", "reduce_scatter")
    ag = collective in ("allreduce", "allgather")
    at = lambda q: int(order[q % n])  # noqa: E731  the rank at ring position q
    pieces = []  # (ring position whose segment it is, offset, length), by offset
    for p in range(n):
        x = at(p)
        lo, hi = x * count // n, (x + 1) * count // n
        if hi > lo:
            start = lo
            for length in split_proportional(hi - lo, [1.0] * min(chunks, hi - lo)):
                pieces.append((p, start, length))
                start += length
    pieces.sort(key=lambda piece: piece[1])
    for c, (p, lo, length) in enumerate(pieces):
        chunk_table.append((lo, length))
        if rs:  # positions p+1 (sends its input), p+2, ..., p+n (= p: completes it)
            for j in range(1, n + 1):
                v = at(p + j)
                if j > 1:
                    raw[v].append(("RECV_REDUCE", c, at(p + j - 1), 0))
                if j < n:
                    raw[v].append(("SEND", c, at(p + j + 1), 0))
        if ag:  # position p sends the result on; positions p+1, ..., p+n-1 copy it
            for j in range(0, n):
                v = at(p + j)
                if j > 0:
                    raw[v].append(("RECV_COPY", c, at(p + j - 1), 0))
                if j < n - 1:
                    raw[v].append(("SEND", c, at(p + j + 1), 0))
    return Schedule(n, count, collective, -1, dtype, 1, tuple(chunk_table), _order_steps(raw), (), op)


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


@gc_paused
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
        for i, (op, chunk, peer, _) in enumerate(steps):
            d = [last_write[chunk]] if chunk in last_write else []
            if op != "SEND":
                d += sends_since[chunk]
                last_write[chunk] = i
                sends_since[chunk] = []
            else:
                # a repeated (sender, receiver, chunk) SEND follows the previous one
                d += [j for j in sends_since[chunk] if steps[j][2] == peer][-1:]
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

    send_at = defaultdict(list)  # (sender, receiver, chunk) -> the SENDs' indices, in order
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
                send_at[(r, peer, chunk)].append(i)
    received = defaultdict(int)  # the k-th RECV of a triple matches its k-th SEND
    for r, steps in enumerate(raw):
        for i, (op, chunk, peer, _) in enumerate(steps):
            if op != "SEND":
                key = (peer, r, chunk)
                j = send_at[key][received[key]]
                received[key] += 1
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
