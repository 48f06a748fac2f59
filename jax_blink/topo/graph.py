"""The one link graph of a topology: directed arcs, capacities and routes.

:class:`LinkGraph` turns a topology's full-duplex links into directed arcs
(one per link direction, parallel links summed) and owns every routing
decision of jax_blink: the default route data takes between two ranks
(:meth:`LinkGraph.route`), the cheapest routes under arc prices
(:meth:`LinkGraph.routes`), and the cheapest spanning trees built from them
(:meth:`LinkGraph.cheapest_tree`, the pricing step of the planner and of the
dual bound).

Pure Python: never imports jax.
"""

from __future__ import annotations

import heapq
import math
from typing import Sequence

import numpy as np

from .errors import TopologyError

__all__ = ["LinkGraph"]


class LinkGraph:
    """Directed capacity graph of a topology, restricted to some link kinds.

    Each full-duplex link becomes two arcs, each with the bandwidth of its
    direction (:attr:`~jax_blink.topo.Link.forward_gbps`,
    :attr:`~jax_blink.topo.Link.backward_gbps`); parallel links of the kinds
    used between one pair are summed into one arc per direction. Ranks reach each
    other directly or through switch nodes; a *route* is a path whose interior
    nodes are all switches (GPUs never forward in hardware).

    Attributes
    ----------
    n : int
        Ranks.
    num_nodes : int
        Ranks plus switches.
    kinds : tuple of str
        Link kinds included.
    arcs : list of (int, int)
        Arc ``a`` goes ``arcs[a][0] -> arcs[a][1]``; arcs ``2i`` and
        ``2i + 1`` are the two directions of one link, in the order of the
        topology's sorted links.
    capacity_gbps : numpy.ndarray
        Capacity of each arc.
    reverse : numpy.ndarray
        ``reverse[a]`` is the arc in the opposite direction.
    arc_kind : list of str
        Kind of each arc: that of the first of its links in the topology's
        sorted order.
    index : dict
        ``(u, v) -> a`` for every arc.

    Examples
    --------
    >>> from jax_blink.topo import Topology
    >>> g = Topology.preset("dgx1-v100").link_graph()
    >>> g.route_bandwidth_gbps(0, 1), g.route_bandwidth_gbps(0, 5)
    (50.0, 16.0)
    >>> g.path(0, 5)  # 0 -> PCIe switch -> CPU0 -> CPU1 -> PCIe switch -> 5
    (0, 8, 12, 13, 10, 5)
    """

    def __init__(self, topology, kinds: Sequence[str]):
        self.n = topology.n
        self.num_nodes = topology.num_nodes
        self.kinds = tuple(kinds)
        pair = {}
        for l in topology.links:
            if l.kind in self.kinds:
                fwd, back, kind = pair.get((l.u, l.v), (0.0, 0.0, l.kind))
                pair[(l.u, l.v)] = (fwd + l.forward_gbps, back + l.backward_gbps, kind)
        self.arcs, caps, self.arc_kind = [], [], []
        for (u, v), (fwd, back, kind) in sorted(pair.items()):
            self.arcs += [(u, v), (v, u)]
            caps += [fwd, back]
            self.arc_kind += [kind, kind]
        self.capacity_gbps = np.asarray(caps, dtype=float)
        self.index = {arc: a for a, arc in enumerate(self.arcs)}
        self.reverse = np.asarray([a ^ 1 for a in range(len(self.arcs))], dtype=int)
        self.out_arcs = [[] for _ in range(self.num_nodes)]
        for a, (u, _) in enumerate(self.arcs):
            self.out_arcs[u].append(a)
        self._default_routes = {}

    @property
    def symmetric(self) -> bool:
        """Whether every link carries as much one way as the other."""
        return bool(np.array_equal(self.capacity_gbps, self.capacity_gbps[self.reverse]))

    @property
    def has_switches(self) -> bool:
        """Whether any arc touches a switch node."""
        return any(u >= self.n or v >= self.n for u, v in self.arcs)

    # ------------------------------------------------------ default routes
    def route(self, src: int, dst: int) -> tuple:
        """Arc indices of the default route data takes from rank ``src`` to rank ``dst``.

        The direct arc when there is one, else the path through switches only
        with the fewest hops and, among those, the widest bottleneck (ties go
        to the path found first, exploring nodes in ascending order). Network
        (``"net"``) links are used only where no other links join the two
        ranks, as NCCL uses its network transport only between hosts. Schedules
        that carry no routes of their own are simulated on these, and the
        baselines size their pipelines by them.

        Raises
        ------
        TopologyError
            If no link and no switch path joins the two ranks.
        """
        key = (src, dst)
        if key not in self._default_routes:
            route = None
            if "net" in self.kinds:
                try:
                    route = self._fewest_hops_widest(src, dst, avoid="net")
                except TopologyError:
                    pass  # only the network joins them
            self._default_routes[key] = route or self._fewest_hops_widest(src, dst)
        return self._default_routes[key]

    def path(self, src: int, dst: int) -> tuple:
        """Node path of :meth:`route` from ``src`` to ``dst``."""
        return self.path_of(self.route(src, dst))

    def route_bandwidth_gbps(self, src: int, dst: int) -> float:
        """Bottleneck bandwidth of :meth:`route` from ``src`` to ``dst``."""
        return float(min(self.capacity_gbps[a] for a in self.route(src, dst)))

    def _fewest_hops_widest(self, src, dst, avoid=None):
        best = {src: (math.inf, ())}  # node -> (bottleneck GB/s, arcs)
        frontier = [src]
        while frontier and dst not in best:
            nxt = {}
            for node in frontier:
                width, path = best[node]
                for a in self.out_arcs[node]:
                    w = self.arcs[a][1]
                    if w in best or (w < self.n and w != dst) or self.arc_kind[a] == avoid:
                        continue  # ranks do not forward
                    cand = (min(width, float(self.capacity_gbps[a])), path + (a,))
                    if w not in nxt or cand[0] > nxt[w][0]:
                        nxt[w] = cand
            best.update(nxt)
            frontier = sorted(nxt)
        if dst not in best:
            raise TopologyError(f"ranks {src} and {dst} are joined by no link and no switch path "
                                f"(link kinds: {'/'.join(self.kinds) or 'none'})")
        return best[dst][1]

    def arcs_of_path(self, path: Sequence[int]) -> tuple:
        """Arc indices along a node path.

        Raises
        ------
        TopologyError
            If two consecutive nodes of ``path`` are joined by no arc.
        """
        try:
            return tuple(self.index[x, y] for x, y in zip(path, path[1:]))
        except KeyError as e:
            raise TopologyError(f"path {list(path)} uses {e.args[0][0]}-{e.args[0][1]}, which has no "
                                f"{'/'.join(self.kinds)} link") from None

    # -------------------------------------------------------- priced routes
    def routes(self, arc_cost: np.ndarray) -> dict:
        """Cheapest route between every ordered pair of distinct ranks.

        Parameters
        ----------
        arc_cost : numpy.ndarray
            Non-negative cost of each arc.

        Returns
        -------
        dict
            ``(u, v) -> (cost, arcs)`` for each pair that a route joins;
            ``arcs`` is the tuple of arc indices along it. Ties go to fewer hops.
        """
        out = {}
        for s in range(self.n):
            best = {s: (0.0, 0)}
            via = {s: ()}
            heap = [(0.0, 0, s)]
            while heap:
                cost, hops, u = heapq.heappop(heap)
                if (cost, hops) > best[u]:
                    continue
                if u != s and u < self.n:
                    continue  # ranks end routes; only switches forward
                for a in self.out_arcs[u]:
                    v = self.arcs[a][1]
                    cand = (cost + float(arc_cost[a]), hops + 1)
                    if v not in best or cand < best[v]:
                        best[v] = cand
                        via[v] = via[u] + (a,)
                        heapq.heappush(heap, (cand[0], cand[1], v))
            for v in range(self.n):
                if v != s and v in best:
                    out[s, v] = (best[v][0], via[v])
        return out

    def usage(self, edges: Sequence, paths: Sequence, directions: str) -> np.ndarray:
        """How many times a tree crosses each arc.

        Parameters
        ----------
        edges : sequence of (parent, child)
        paths : sequence of tuple of int
            Node path of each edge from parent to child.
        directions : str
            ``"down"`` (broadcast: parent to child), ``"up"`` (reduce) or
            ``"both"`` (allreduce).
        """
        use = np.zeros(len(self.arcs))
        for path in paths:
            for x, y in zip(path, path[1:]):
                if directions in ("down", "both"):
                    use[self.index[x, y]] += 1
                if directions in ("up", "both"):
                    use[self.index[y, x]] += 1
        return use

    def path_of(self, arcs: Sequence[int]) -> tuple:
        """Node path of a route given as arc indices."""
        return (self.arcs[arcs[0]][0],) + tuple(self.arcs[a][1] for a in arcs)

    def cheapest_tree(self, arc_price: np.ndarray, directions: str, root: int | None = None):
        """A minimum-cost spanning tree of the ranks under arc prices.

        For ``directions="both"`` (allreduce) a tree edge costs its route in
        both directions and the tree is a minimum spanning tree; otherwise it
        is a minimum arborescence rooted at ``root`` (Edmonds), with each edge
        costing its route in the direction data flows.

        Returns
        -------
        (cost, edges, paths) or None
            ``edges`` are ``(parent, child)`` pairs oriented away from
            ``root`` (or rank 0 for ``"both"``), ``paths`` the node path of
            each; None if the ranks are not connected.
        """
        return self.cheapest_trees(arc_price, directions, [root])[0]

    def cheapest_trees(self, arc_price: np.ndarray, directions: str, roots: Sequence) -> list:
        """:meth:`cheapest_tree` for each of ``roots``, routing once for all of them.

        Returns
        -------
        list
            One ``(cost, edges, paths)`` or None per root, in the order of ``roots``.
        """
        import networkx as nx

        arc_price = np.maximum(np.asarray(arc_price, dtype=float), 0.0)
        if directions == "both":
            routes = self.routes(arc_price + arc_price[self.reverse])
            g = nx.Graph()
            g.add_nodes_from(range(self.n))
            for (u, v), (cost, arcs) in routes.items():
                if u < v:
                    g.add_edge(u, v, weight=cost, hops=len(arcs))
            if self.n > 1 and not nx.is_connected(g):
                return [None for _ in roots]
            tree = nx.minimum_spanning_tree(g, weight="weight")
        else:
            routes = self.routes(arc_price if directions == "down" else arc_price[self.reverse])
        out = []
        for root in roots:
            if directions == "both":
                edges = list(nx.bfs_edges(tree, 0 if root is None else root))
            else:
                arcs = [(u, v, cost) for (u, v), (cost, _) in routes.items() if v != root]
                chosen = _min_arborescence(self.n, root, arcs)
                if chosen is None:
                    out.append(None)
                    continue
                arb = nx.DiGraph()
                arb.add_node(root)
                arb.add_edges_from(arcs[i][:2] for i in chosen)
                edges = list(nx.bfs_edges(arb, root))
            paths = []
            total = 0.0
            for p, c in edges:
                cost, arcs = routes[p, c] if (p, c) in routes else routes[c, p]
                path = self.path_of(arcs)
                paths.append(path if path[0] == p else path[::-1])
                total += cost
            out.append((total, edges, paths))
        return out


def _min_arborescence(n: int, root: int, arcs: list):
    """Chu-Liu/Edmonds minimum spanning arborescence.

    Parameters
    ----------
    n : int
        Nodes ``0..n-1``.
    root : int
    arcs : list of (u, v, weight)

    Returns
    -------
    list of int or None
        Indices into ``arcs`` of the ``n - 1`` chosen arcs, or None if some
        node cannot be reached from ``root``.
    """
    best_in = {}
    for i, (u, v, w) in enumerate(arcs):
        if v != root and u != v and (v not in best_in or w < arcs[best_in[v]][2]):
            best_in[v] = i
    if len(best_in) != n - 1:
        return None
    # find a cycle among the cheapest incoming arcs
    cycle = None
    state = {}
    for start in range(n):
        path, v = [], start
        while v != root and v not in state:
            state[v] = start
            path.append(v)
            v = arcs[best_in[v]][0]
        if v != root and state[v] == start:
            cycle = path[path.index(v):]
            break
    if cycle is None:
        return list(best_in.values())
    # contract the cycle into one node and recurse
    in_cycle = set(cycle)
    label, new_id = {}, 0
    for v in range(n):
        if v not in in_cycle:
            label[v] = new_id
            new_id += 1
    contracted = new_id
    for v in in_cycle:
        label[v] = contracted
    new_arcs, origin = [], []
    for i, (u, v, w) in enumerate(arcs):
        lu, lv = label[u], label[v]
        if lu == lv:
            continue
        new_arcs.append((lu, lv, w - arcs[best_in[v]][2] if v in in_cycle else w))
        origin.append(i)
    chosen = _min_arborescence(new_id + 1, label[root], new_arcs)
    if chosen is None:
        return None
    picked = [origin[j] for j in chosen]
    entering = next(i for i in picked if arcs[i][1] in in_cycle)
    return picked + [best_in[v] for v in cycle if v != arcs[entering][1]]
