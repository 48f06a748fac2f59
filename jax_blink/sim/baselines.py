"""Baseline collective schedules to compare Blink plans against.

Every baseline is a :class:`~jax_blink.schedule.Schedule` on the same
topology as the plan, so :func:`jax_blink.simulate` (or an executor)
runs it exactly as it runs a plan. Transfers between ranks with no direct link
take the link graph's default routes through the topology's switches (PCIe
switches, CPUs, NVSwitch: :meth:`jax_blink.topo.LinkGraph.route`), as
NCCL's P2P/SHM transports do.

``nccl-ring``
    NCCL's ring algorithm. The rings are :func:`jax_blink.planning.rings.best_rings`:
    the best fractional packing of directed Hamiltonian rings on the NVLinks,
    each ring carrying a share of the data proportional to its bandwidth.
    Where the NVLinks form no ring -- as on many partial DGX-1 allocations --
    NCCL fell back to one ring over PCIe in PCI (rank) order, NVLink hops
    used where consecutive ranks have one; so does this baseline.
    Format version 1 moved a chunk across a directed link at most once, and a
    ring allreduce crosses some links twice with the same chunk, so each ring
    here reduce-scatters in its own direction and all-gathers in the opposite
    one (version 2 allows repeats: :func:`jax_blink.schedule.lower_ring` writes
    NCCL's ring exactly; this baseline is unchanged).
    On ring sets closed under reversal (all but a few DGX-1 allocations) every
    link carries exactly NCCL's bytes; otherwise the load is spread more evenly
    than NCCL's, so the baseline is never slower than NCCL's rings on the
    bandwidth term.
``nccl-dbtree``
    NCCL's double binary tree (NCCL >= 2.4): two complementary binary trees
    (NCCL's ``ncclGetDtree``: the second tree mirrors the first for an even
    number of ranks and shifts it by one for an odd number), each reducing up
    and broadcasting down half the data. Ranks are numbered along the best
    NVLink ring when there is one, so that tree neighbours tend to be NVLink
    neighbours, else in rank order.
``rs-ag``
    Direct reduce-scatter + all-gather: rank ``j`` owns the ``j``-th ``1/n``
    of the vector; every rank sends its part of slice ``j`` straight to ``j``,
    which reduces it and sends the sum straight back (``n`` star trees).
``chain``
    Linear pipeline (Wang et al., arXiv 1611.04255): reduce along a chain of
    all ranks to its head, broadcast back along it, in pipelined chunks. The
    chain is the best NVLink ring cut open, else rank order.

Every baseline splits its data into pipeline chunks chosen by the cost
model's :func:`~jax_blink.planning.cost.pipeline_chunks`, the same
latency/bandwidth trade-off Blink's lowering makes, times ``chunk_scale``;
:func:`jax_blink.sim.tune_baseline` searches that scale by simulation, as
:func:`jax_blink.sim.tune` searches Blink's, so that comparisons
(:func:`jax_blink.sim.compare`) score both sides after the same search.

Pure Python: never imports jax.
"""

from __future__ import annotations

from types import SimpleNamespace

from ..planning.cost import MAX_CHUNKS, pipeline_chunks
from ..planning.rings import best_rings
from ..planning.tree import tree_depth
from ..schedule import DTYPES, Schedule, ScheduleError, Step, dtype_name, lower_trees
from ..schedule.lower import split_proportional
from .model import SimModel

__all__ = ["BASELINES", "baseline", "all_baselines", "ring_allreduce", "double_binary_tree",
           "rs_ag", "chain"]

#: Baseline names, in the order reports list them.
BASELINES = ("nccl-ring", "nccl-dbtree", "rs-ag", "chain")


def _count(size_bytes, dtype):
    dtype = dtype_name(dtype)
    itemsize = DTYPES[dtype][1]
    if not isinstance(size_bytes, int) or size_bytes < itemsize or size_bytes % itemsize:
        raise ScheduleError(f"size_bytes must be a positive multiple of the {dtype} item size "
                            f"({itemsize}), got {size_bytes!r}")
    return size_bytes // itemsize, dtype


def _need_ranks(topology, what):
    if topology.n < 2:
        raise ScheduleError(f"{what} needs at least 2 ranks; {topology.name} has {topology.n}")


def _ring_orders(topology):
    """NVLink rings and their GB/s, or the PCIe fallback ring in rank order."""
    rings = best_rings(topology)
    if rings.rings:
        return [tuple(r) for r in rings.rings], list(rings.weights_gbps), True
    graph = _graph(topology)
    order = tuple(range(topology.n))
    width = min(graph.route_bandwidth_gbps(u, v) for u, v in zip(order, order[1:] + order[:1]))
    return [order], [width], False


def _graph(topology):
    """The link graph over every kind of link: the routes baselines' data takes."""
    return topology.link_graph(topology.kinds())


def _route_alpha_s(graph, model, pairs):
    """Largest start-up cost (step overhead + route latency) over ``pairs``."""
    return model.step_overhead_us * 1e-6 + max(model.route_latency_s(graph, graph.route(u, v)) for u, v in pairs)


def ring_allreduce(topology, size_bytes: int, dtype="float32", *, rings=None, loops=None,
                   model: SimModel | None = None, chunk_scale: float = 1.0) -> Schedule:
    """NCCL-style ring allreduce (see the module docstring).

    Parameters
    ----------
    topology : Topology
    size_bytes : int
        Bytes of the vector; a multiple of the dtype's item size.
    dtype : str or numpy dtype
    rings : sequence of (order, weight), optional
        Rings as rank orders with relative data shares; by default the best
        NVLink rings or the PCIe fallback ring.
    loops : int, optional
        Pipeline loops per ring (each loop is a full ring allreduce of
        ``n`` chunks); by default :func:`pipeline_chunks` for the ring.
    model : SimModel, optional
        Costs used to choose ``loops``.
    chunk_scale : float
        Multiplies the model's loop count (:func:`jax_blink.sim.tune_baseline`
        searches it).

    Returns
    -------
    Schedule
        Tree ``i`` of the schedule is ring ``i``.

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> s = ring_allreduce(Topology.preset("dgx1-v100").subset([0, 1, 2, 3]), 2**20)
    >>> s.validate().ntrees, s.collective  # four NVLink rings of 25 GB/s
    (4, 'allreduce')
    """
    _need_ranks(topology, "a ring allreduce")
    count, dtype = _count(size_bytes, dtype)
    model = SimModel() if model is None else model
    graph = _graph(topology)
    n = topology.n
    if rings is None:
        orders, weights, _ = _ring_orders(topology)
    else:
        orders, weights = [tuple(o) for o, _ in rings], [float(w) for _, w in rings]
    for order in orders:
        if sorted(order) != list(range(n)):
            raise ScheduleError(f"ring {order} is not an order of the ranks 0..{n - 1}")
    itemsize = DTYPES[dtype][1]
    chunk_table, rank_steps = [], [[] for _ in range(n)]  # rank_steps: (sort key, op, chunk, peer, tree)
    used = [(o, c, w) for o, c, w in zip(orders, _split(count, weights, n), weights) if c]
    for tree, (order, share, weight_gbps) in enumerate(used):
        hops = list(zip(order, order[1:] + order[:1]))
        k = loops
        if k is None:
            alpha = _route_alpha_s(graph, model, hops + [(v, u) for u, v in hops])
            k = _scaled(pipeline_chunks(2, share * itemsize / n, weight_gbps, alpha), chunk_scale)
        loop_counts = [c for c in _split(share, [1.0] * max(1, min(k, share // n)), n) if c]
        for loop, loop_count in enumerate(loop_counts):
            base = len(chunk_table)
            start = chunk_table[-1][0] + chunk_table[-1][1] if chunk_table else 0
            for piece in _split(loop_count, [1.0] * n, 1):
                chunk_table.append((start, piece))
                start += piece
            _ring_loop(rank_steps, order, base, tree, loop)
    # below n elements per loop some of a loop's n pieces are empty: their steps move nothing, so
    # they are dropped (every other piece still goes round the whole ring) and the chunks renumbered
    kept = {c: i for i, c in enumerate(c for c, (_, size) in enumerate(chunk_table) if size)}
    chunk_table = [piece for piece in chunk_table if piece[1]]
    steps = tuple(_with_deps([(op, kept[c], peer, tree) for _, op, c, peer, tree in sorted(r, key=lambda s: s[0])
                              if c in kept]) for r in rank_steps)
    return Schedule(n, count, "allreduce", -1, dtype, len(used), tuple(chunk_table), steps)


def _split(total, weights, minimum):
    """Integer parts of ``total`` proportional to ``weights``, each >= ``minimum``.

    Parts that would fall below ``minimum`` are dropped (returned as 0) and
    their share goes to the others.
    """
    weights = list(weights)
    while True:
        wsum = sum(w for w in weights if w > 0)
        exact = [total * w / wsum if w > 0 else 0.0 for w in weights]
        small = [i for i, e in enumerate(exact) if 0 < e < minimum]
        if not small or len(small) == sum(w > 0 for w in weights):
            break
        weights[min(small, key=lambda i: exact[i])] = 0.0
    return split_proportional(total, [max(w, 0.0) for w in weights])


def _ring_loop(rank_steps, order, base, tree, loop):
    """Append one ring allreduce of chunks ``base..base+n-1`` to ``rank_steps``.

    Position ``p`` reduce-scatters forward (to ``order[p+1]``) and, owning
    chunk ``p+1`` afterwards, all-gathers backward (to ``order[p-1]``). Each
    step gets the sort key ``(level, tree, position in the loop)``; the level
    is a wavefront, ``loop + step`` (``loop + n - 1 + step`` for the
    all-gather), so that a channel sends step ``s`` of the next loop while
    step ``s + 1`` of this loop still waits for its data: the latency of a
    ring step is hidden behind other loops' transfers, as NCCL's slices in
    flight hide it, and reduce-scatter and all-gather of successive loops
    overlap.
    """
    n = len(order)
    for p, rank in enumerate(order):
        nxt, prv = order[(p + 1) % n], order[(p - 1) % n]
        for s in range(n - 1):
            level = loop + s
            rank_steps[rank].append(((level, tree, 2 * s), "SEND", base + (p - s) % n, nxt, tree))
            rank_steps[rank].append(((level, tree, 2 * s + 1), "RECV_REDUCE", base + (p - s - 1) % n, prv, tree))
        for s in range(n - 1):
            level = loop + n - 1 + s
            rank_steps[rank].append(((level, tree, 2 * (n + s)), "SEND", base + (p + 1 + s) % n, prv, tree))
            rank_steps[rank].append(((level, tree, 2 * (n + s) + 1), "RECV_COPY", base + (p + 2 + s) % n, nxt, tree))


def _with_deps(ordered):
    """Steps of one rank from ``(op, chunk, peer, tree)`` in execution order.

    Dependencies follow the determinism rule of ``docs/schedule_format.md``:
    a step depends on the last earlier non-SEND step of its chunk, and a
    non-SEND step also on the SENDs of its chunk since then.
    """
    steps, last_write, sends_since = [], {}, {}
    for i, (op, chunk, peer, tree) in enumerate(ordered):
        deps = [last_write[chunk]] if chunk in last_write else []
        if op == "SEND":
            sends_since.setdefault(chunk, []).append(i)
        else:
            deps += sends_since.pop(chunk, [])
            last_write[chunk] = i
        steps.append(Step(op, chunk, peer, tree, tuple(sorted(deps))))
    return tuple(steps)


def _btree_parent(nranks, rank):
    """Parent of ``rank`` in NCCL's binary tree (``ncclGetBtree``), -1 at the root."""
    if rank == 0:
        return -1
    bit = 1
    while bit < nranks and not bit & rank:
        bit <<= 1
    up = (rank ^ bit) | (bit << 1)
    return up if up < nranks else rank ^ bit


def _dtree_edges(nranks):
    """Edges ``(parent, child)`` of NCCL's two complementary binary trees over positions."""
    first = [(_btree_parent(nranks, r), r) for r in range(nranks) if r != 0]
    if nranks % 2:
        def second(r):  # shift by one
            u = _btree_parent(nranks, (r - 1) % nranks)
            return -1 if u == -1 else (u + 1) % nranks
    else:
        def second(r):  # mirror
            u = _btree_parent(nranks, nranks - 1 - r)
            return -1 if u == -1 else nranks - 1 - u
    roots = [0, next(r for r in range(nranks) if second(r) == -1)]
    return [(roots[0], first), (roots[1], [(second(r), r) for r in range(nranks) if second(r) != -1])]


def _best_order(topology):
    """Rank order along the heaviest NVLink ring, else rank order."""
    rings = best_rings(topology)
    if rings.rings:
        return tuple(max(zip(rings.weights_gbps, rings.rings))[1])
    return tuple(range(topology.n))


def _scaled(k, scale):
    """The chunk count ``k`` times ``scale``, at least 1 and at most MAX_CHUNKS."""
    return min(max(round(k * scale), 1), MAX_CHUNKS)


def _lower(trees, topology, count, dtype, model, collective, root, bandwidth_share, chunk_scale=1.0):
    """Lower trees with per-tree pipeline chunks from :func:`pipeline_chunks` (times ``chunk_scale``)."""
    graph = _graph(topology)
    itemsize = DTYPES[dtype][1]
    wsum = sum(t.weight for t in trees)
    chunks = []
    for t in trees:
        hops = [(p, c) for p, c in t.edges]
        alpha = _route_alpha_s(graph, model, hops + [(c, p) for p, c in hops])
        width = min(graph.route_bandwidth_gbps(p, c) for p, c in hops) * bandwidth_share
        depth = tree_depth(t.root, t.edges) * (2 if collective == "allreduce" else 1)
        chunks.append(_scaled(pipeline_chunks(depth, count * itemsize * t.weight / wsum, width, alpha),
                              chunk_scale))
    return lower_trees(trees, nranks=topology.n, collective=collective, root=root, count=count,
                       dtype=dtype, chunks=chunks)


def double_binary_tree(topology, size_bytes: int, dtype="float32", *, order=None,
                       model: SimModel | None = None, chunk_scale: float = 1.0) -> Schedule:
    """NCCL-style double binary tree allreduce (see the module docstring).

    Parameters
    ----------
    topology : Topology
    size_bytes : int
    dtype : str or numpy dtype
    order : sequence of int, optional
        Rank at each tree position; by default along the best NVLink ring.
    model : SimModel, optional
        Costs used to choose the pipeline chunks.

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> double_binary_tree(Topology.preset("dgx1-p100"), 2**20).validate().ntrees
    2
    """
    _need_ranks(topology, "a double binary tree")
    count, dtype = _count(size_bytes, dtype)
    order = _best_order(topology) if order is None else tuple(order)
    if sorted(order) != list(range(topology.n)):
        raise ScheduleError(f"order {order} is not an order of the ranks 0..{topology.n - 1}")
    trees = [SimpleNamespace(root=order[root], edges=[(order[p], order[c]) for p, c in edges], weight=1.0)
             for root, edges in _dtree_edges(topology.n)]
    return _lower(trees, topology, count, dtype, SimModel() if model is None else model,
                  "allreduce", -1, 0.5, chunk_scale)


def rs_ag(topology, size_bytes: int, dtype="float32", *, model: SimModel | None = None,
          chunk_scale: float = 1.0) -> Schedule:
    """Direct reduce-scatter + all-gather allreduce (see the module docstring).

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> rs_ag(Topology.preset("shm:4"), 4096).validate().ntrees
    4
    """
    _need_ranks(topology, "reduce-scatter + all-gather")
    count, dtype = _count(size_bytes, dtype)
    n = topology.n
    trees = [SimpleNamespace(root=j, edges=[(j, i) for i in range(n) if i != j], weight=1.0)
             for j in range(n)]
    return _lower(trees, topology, count, dtype, SimModel() if model is None else model,
                  "allreduce", -1, 1.0 / (n - 1), chunk_scale)


def chain(topology, size_bytes: int, dtype="float32", *, collective: str = "allreduce",
          root: int = 0, order=None, model: SimModel | None = None,
          chunk_scale: float = 1.0) -> Schedule:
    """Linear pipeline along a chain of all ranks (see the module docstring).

    Parameters
    ----------
    topology : Topology
    size_bytes : int
    dtype : str or numpy dtype
    collective : str
        ``"allreduce"`` (reduce to the head, broadcast back), ``"broadcast"``
        or ``"reduce"``.
    root : int
        Head of the chain for broadcast/reduce (ignored for allreduce, whose
        head is the first rank of ``order``).
    order : sequence of int, optional
        The chain; by default the best NVLink ring cut open (rotated to start
        at ``root`` for broadcast/reduce), else rank order.
    model : SimModel, optional
        Costs used to choose the pipeline chunks.

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> s = chain(Topology.preset("dgx1-v100"), 2**20, collective="broadcast", root=3)
    >>> s.validate().root
    3
    """
    if collective not in ("allreduce", "broadcast", "reduce"):
        raise ScheduleError(f"unknown collective {collective!r}")
    _need_ranks(topology, "a chain")
    count, dtype = _count(size_bytes, dtype)
    if order is None:
        order = _best_order(topology)
        if collective != "allreduce":
            i = order.index(root)
            order = order[i:] + order[:i]
    order = tuple(order)
    if sorted(order) != list(range(topology.n)):
        raise ScheduleError(f"order {order} is not an order of the ranks 0..{topology.n - 1}")
    if collective != "allreduce" and order[0] != root:
        raise ScheduleError(f"a {collective} chain must start at its root {root}, got {order}")
    tree = SimpleNamespace(root=order[0], edges=list(zip(order, order[1:])), weight=1.0)
    return _lower([tree], topology, count, dtype, SimModel() if model is None else model,
                  collective, order[0] if collective != "allreduce" else -1, 1.0, chunk_scale)


def baseline(name: str, topology, size_bytes: int, dtype="float32", *,
             model: SimModel | None = None, chunk_scale: float = 1.0) -> Schedule:
    """The allreduce baseline called ``name`` (one of :data:`BASELINES`), its
    pipeline chunks the cost model's times ``chunk_scale``.

    Raises
    ------
    ScheduleError
        If ``name`` is unknown.
    """
    builders = {"nccl-ring": ring_allreduce, "nccl-dbtree": double_binary_tree,
                "rs-ag": rs_ag, "chain": chain}
    if name not in builders:
        raise ScheduleError(f"unknown baseline {name!r}; expected one of {BASELINES}")
    return builders[name](topology, size_bytes, dtype, model=model, chunk_scale=chunk_scale)


def all_baselines(topology, size_bytes: int, dtype="float32", *,
                  model: SimModel | None = None) -> dict:
    """``{name: Schedule}`` for every allreduce baseline of :data:`BASELINES`."""
    return {name: baseline(name, topology, size_bytes, dtype, model=model) for name in BASELINES}
