"""The link topology of a set of devices, and the capacity graph plans pack into.

A :class:`Topology` holds ``n`` ranks (nodes ``0..n-1``), optional switch
nodes (``n..n+s-1``: NVSwitch, PCIe switch, CPU root complex, host memory;
they forward data but cannot reduce it) and full-duplex :class:`Link` s, each
with a bandwidth in GB/s per direction and a kind (``nvlink``, ``pcie``,
``net`` or ``shm``). Parallel links of one kind between the same two nodes add
up. Topologies are built from links, presets, JSON, or the output of
``nvidia-smi topo -m``, and can be restricted to a subset of their ranks.

:class:`LinkGraph` is the directed capacity graph a plan is packed into: one
arc per link direction, with routes between ranks through switches and the
cheapest spanning trees under arc prices (the pricing step of the planner and
the dual bound of :mod:`jax_blink.bounds` share it).

Pure Python: never imports jax.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import json
import re
from typing import Iterable, Sequence

import numpy as np

from ._jsonio import read_document

__all__ = ["Topology", "Link", "LinkGraph", "TopologyError", "LINK_KINDS", "FAST_KINDS"]

#: Link kinds, fastest class first.
LINK_KINDS = ("nvlink", "pcie", "net", "shm")
#: Kinds a plan uses on their own whenever they connect all ranks.
FAST_KINDS = ("nvlink",)
FORMAT_VERSION = 1


class TopologyError(ValueError):
    """A topology (or its description) is invalid; the message says what and how to fix it."""


@dataclasses.dataclass(frozen=True)
class Link:
    """A full-duplex link between two nodes.

    Attributes
    ----------
    u, v : int
        Node ids: ranks ``0..n-1`` or switches ``n..``.
    bandwidth_gbps : float
        Bandwidth in GB/s in each direction.
    kind : str
        One of :data:`LINK_KINDS`.
    """

    u: int
    v: int
    bandwidth_gbps: float
    kind: str = "nvlink"


def _as_link(item) -> Link:
    if isinstance(item, Link):
        return item
    try:
        fields = tuple(item)
    except TypeError:
        raise TopologyError(f"a link must be a Link or a tuple (u, v, gbps[, kind]), got {item!r}") from None
    if len(fields) not in (3, 4):
        raise TopologyError(f"a link must be (u, v, gbps) or (u, v, gbps, kind), got {item!r}")
    return Link(*fields)


class Topology:
    """Ranks, switches and full-duplex links with per-direction bandwidths.

    Use the constructors (:meth:`from_links`, :meth:`preset`,
    :meth:`from_json`, :meth:`from_nvidia_smi`) rather than ``__init__``.

    Attributes
    ----------
    n : int
        Number of ranks (nodes ``0..n-1``).
    name : str
        Human-readable name (not part of :meth:`fingerprint`).
    switches : tuple of str
        Names of the switch nodes ``n, n+1, ...``.
    links : tuple of Link
        Canonical links: ``u < v``, one per (pair, kind) with parallel links
        summed, sorted.

    Examples
    --------
    >>> t = Topology.from_links(3, [(0, 1, 25), (1, 2, 25), (0, 1, 25)])
    >>> t.links[0]
    Link(u=0, v=1, bandwidth_gbps=50.0, kind='nvlink')
    >>> t.subset([2, 1]).links
    (Link(u=0, v=1, bandwidth_gbps=25.0, kind='nvlink'),)
    """

    def __init__(self, n: int, links: Iterable, switches: Sequence[str] = (), name: str = ""):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise TopologyError(f"the number of ranks must be a positive integer, got {n!r}")
        self.n = int(n)
        self.switches = tuple(str(s) for s in switches)
        self.name = str(name) or f"custom-{self.n}"
        total = self.n + len(self.switches)
        merged = {}
        for item in links:
            link = _as_link(item)
            for end in (link.u, link.v):
                if isinstance(end, bool) or not isinstance(end, (int, np.integer)) or not 0 <= end < total:
                    raise TopologyError(
                        f"link {link.u}-{link.v}: node {end!r} is out of range; nodes are ranks "
                        f"0..{self.n - 1}" + (f" and switches {self.n}..{total - 1}" if self.switches else ""))
            if link.u == link.v:
                raise TopologyError(f"link {link.u}-{link.v} connects a node to itself")
            try:
                gbps = float(link.bandwidth_gbps)
            except (TypeError, ValueError):
                raise TopologyError(f"link {link.u}-{link.v}: bandwidth {link.bandwidth_gbps!r} is not a number") from None
            if not np.isfinite(gbps) or gbps <= 0:
                raise TopologyError(
                    f"link {link.u}-{link.v}: bandwidth must be a positive number of GB/s, got {link.bandwidth_gbps!r}")
            if link.kind not in LINK_KINDS:
                raise TopologyError(f"link {link.u}-{link.v}: unknown kind {link.kind!r}; expected one of {LINK_KINDS}")
            key = (min(link.u, link.v), max(link.u, link.v), link.kind)
            merged[key] = merged.get(key, 0.0) + gbps
        self.links = tuple(Link(int(u), int(v), bw, kind) for (u, v, kind), bw in sorted(merged.items()))

    # ------------------------------------------------------------ constructors
    @classmethod
    def from_links(cls, n: int, links: Iterable, switches: Sequence[str] = (), name: str = "") -> "Topology":
        """Build a topology from links.

        Parameters
        ----------
        n : int
            Number of ranks.
        links : iterable of Link or tuple
            ``(u, v, gbps)`` or ``(u, v, gbps, kind)``; ``kind`` defaults to
            ``"nvlink"``. Parallel links of one kind add up.
        switches : sequence of str
            Names of switch nodes, which get ids ``n, n+1, ...``. A switch's
            per-port bandwidth is the bandwidth of the link to it.
        name : str
            Display name.
        """
        return cls(n, links, switches, name)

    @classmethod
    def preset(cls, name: str) -> "Topology":
        """A named machine; see :func:`jax_blink.presets.preset_names`."""
        from . import presets

        return presets.preset(name)

    @classmethod
    def from_json(cls, path_or_text) -> "Topology":
        """Load from JSON text, a dict, or a path to a JSON file (see :meth:`to_json`)."""
        data = read_document(path_or_text, fmt="jax_blink.topology", version=FORMAT_VERSION,
                             error=TopologyError, what="topology")
        for key in ("nranks", "links"):
            if key not in data:
                raise TopologyError(f"malformed topology JSON: missing key {key!r}")
        if not isinstance(data["links"], list):
            raise TopologyError("malformed topology JSON: 'links' must be a list of [u, v, gbps, kind]")
        return cls(data["nranks"], data["links"], data.get("switches", []), data.get("name", ""))

    @classmethod
    def from_nvidia_smi(cls, text: str, *, nvlink_gbps: float = 25.0, pcie_gbps: float = 16.0,
                        sys_gbps: float = 38.4, name: str = "nvidia-smi") -> "Topology":
        """Parse the GPU matrix printed by ``nvidia-smi topo -m``.

        ``NV#`` cells become ``#`` NVLinks of ``nvlink_gbps`` each. The PCIe
        cells become a tree of switch nodes: GPUs that are ``PIX`` of one
        another share a PCIe switch, ``PXB`` groups share a switch above those,
        ``PHB`` groups a host bridge, ``NODE`` groups a NUMA node; NUMA nodes
        meet at a ``SYS`` interconnect of ``sys_gbps``. Every PCIe hop has
        ``pcie_gbps``. Rows and columns that are not ``GPU<k>`` (NICs,
        affinity columns) are ignored.

        Raises
        ------
        TopologyError
            If the text holds no GPU matrix or a cell is not understood.
        """
        # nvidia-smi underlines the header with ANSI escapes when it thinks it
        # writes to a terminal (seen on an H100 machine): drop them.
        text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", str(text))
        lines = [ln.rstrip() for ln in text.splitlines()]
        header_at = next((i for i, ln in enumerate(lines) if re.match(r"^\s+GPU0\b", ln)), None)
        if header_at is None:
            raise TopologyError("no GPU matrix in the nvidia-smi text: expected a header line starting with 'GPU0'")
        header = re.split(r"\s{2,}|\t+", lines[header_at].strip())
        gpu_cols = [i for i, h in enumerate(header) if re.fullmatch(r"GPU\d+", h)]
        gpus = [int(header[i][3:]) for i in gpu_cols]
        if gpus != list(range(len(gpus))):
            raise TopologyError(f"GPU columns {[header[i] for i in gpu_cols]} are not GPU0..GPU{len(gpus) - 1} in order")
        n = len(gpus)
        cells = {}
        for ln in lines[header_at + 1:]:
            m = re.match(r"^(GPU\d+)\s+(.*)$", ln)
            if not m:
                continue
            row = int(m.group(1)[3:])
            fields = re.split(r"\s+", m.group(2).strip())
            if len(fields) < n:
                raise TopologyError(f"row {m.group(1)} has {len(fields)} cells, expected at least {n}")
            if row >= n:
                raise TopologyError(f"row {m.group(1)} has no matching column in the header")
            cells[row] = fields[:n]
        missing = sorted(set(range(n)) - set(cells))
        if missing:
            raise TopologyError(f"nvidia-smi matrix lacks rows for GPU(s) {missing}")
        levels = ("PIX", "PXB", "PHB", "NODE", "SYS")
        for i in range(n):
            for j in range(n):
                cell = cells[i][j]
                if i == j and cell != "X":
                    raise TopologyError(f"cell GPU{i}/GPU{j} is {cell!r}, expected 'X' on the diagonal")
                if i != j and cell not in levels and not re.fullmatch(r"NV\d+", cell):
                    raise TopologyError(
                        f"cell GPU{i}/GPU{j} is {cell!r}; expected X, NV#, PIX, PXB, PHB, NODE or SYS")
        nvlinks, level_of = [], {}
        for i in range(n):
            for j in range(n):
                cell, mirror = cells[i][j], cells[j][i]
                if i == j:
                    continue
                nv = re.fullmatch(r"NV(\d+)", cell)
                if cell != mirror:
                    raise TopologyError(f"the matrix is not symmetric: GPU{i}/GPU{j} is {cell!r} "
                                        f"but GPU{j}/GPU{i} is {mirror!r}")
                if nv:
                    if i < j:
                        nvlinks.append((i, j, int(nv.group(1)) * nvlink_gbps, "nvlink"))
                else:
                    level_of[i, j] = levels.index(cell)
        switches = []
        pcie = _pcie_tree(n, level_of, levels, pcie_gbps, sys_gbps, switches)
        return cls(n, nvlinks + pcie, switches, name)

    # --------------------------------------------------------------- exports
    def to_dict(self) -> dict:
        """The JSON object of :meth:`to_json`."""
        return {"format": "jax_blink.topology", "version": FORMAT_VERSION, "name": self.name,
                "nranks": self.n, "switches": list(self.switches),
                "links": [[l.u, l.v, l.bandwidth_gbps, l.kind] for l in self.links]}

    def to_json(self, indent=None) -> str:
        """JSON text that :meth:`from_json` reads back."""
        return json.dumps(self.to_dict(), indent=indent)

    def fingerprint(self) -> str:
        """Stable hex digest of the canonical JSON (ranks, switches, links; not the name)."""
        data = self.to_dict()
        del data["name"]
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    # ------------------------------------------------------------ operations
    @property
    def num_nodes(self) -> int:
        """Ranks plus switches."""
        return self.n + len(self.switches)

    def subset(self, ranks: Sequence[int], name: str = "") -> "Topology":
        """The topology induced by ``ranks``, re-indexed ``0..k-1`` in the given order.

        Links between kept ranks and switches stay; dropped ranks and their
        links go (a device outside the allocation forwards nothing). Switches
        left as dead ends (at most one link) are dropped too.

        Raises
        ------
        TopologyError
            If a rank is out of range or repeated, or ``ranks`` is empty.
        """
        ranks = list(ranks)
        if not ranks:
            raise TopologyError("a subset needs at least one rank")
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or not 0 <= r < self.n:
                raise TopologyError(f"rank {r!r} in the subset is out of range: {self.name} has ranks 0..{self.n - 1}")
        dup = sorted({r for r in ranks if ranks.count(r) > 1})
        if dup:
            raise TopologyError(f"rank(s) {dup} appear more than once in the subset {ranks}")
        keep_switch = set(range(self.n, self.num_nodes))
        kept = set(ranks)
        while True:  # prune dead-end switches
            links = [l for l in self.links
                     if all(x in kept or x in keep_switch for x in (l.u, l.v))]
            degree = {s: 0 for s in keep_switch}
            for l in links:
                for x in (l.u, l.v):
                    if x in degree:
                        degree[x] += 1
            dead = {s for s, d in degree.items() if d <= 1}
            if not dead:
                break
            keep_switch -= dead
        new_id = {r: i for i, r in enumerate(ranks)}
        for j, s in enumerate(sorted(keep_switch)):
            new_id[s] = len(ranks) + j
        return Topology(len(ranks), [(new_id[l.u], new_id[l.v], l.bandwidth_gbps, l.kind) for l in links],
                        [self.switches[s - self.n] for s in sorted(keep_switch)],
                        name or f"{self.name}[{','.join(map(str, ranks))}]")

    def kinds(self) -> tuple:
        """The link kinds present, fastest class first."""
        present = {l.kind for l in self.links}
        return tuple(k for k in LINK_KINDS if k in present)

    def planning_kinds(self) -> tuple:
        """The link kinds a plan uses: the fast kinds if they connect all
        ranks, else every kind (slow links then bridge the fast islands)."""
        fast = tuple(k for k in FAST_KINDS if k in self.kinds())
        if fast and not self.unreachable(fast):
            return fast
        return self.kinds()

    def unreachable(self, kinds: Sequence[str] | None = None, source: int = 0) -> list:
        """Ranks that rank ``source`` cannot reach over links of ``kinds`` (all if None)."""
        adjacency = {v: [] for v in range(self.num_nodes)}
        for l in self.links:
            if kinds is None or l.kind in kinds:
                adjacency[l.u].append(l.v)
                adjacency[l.v].append(l.u)
        seen, stack = {source}, [source]
        while stack:
            for w in adjacency[stack.pop()]:
                if w not in seen:
                    seen.add(w)
                    stack.append(w)
        return [r for r in range(self.n) if r not in seen]

    def link_graph(self, kinds: Sequence[str] | None = None) -> "LinkGraph":
        """The directed capacity graph over links of ``kinds`` (default: :meth:`planning_kinds`)."""
        return LinkGraph(self, self.planning_kinds() if kinds is None else tuple(kinds))

    def __eq__(self, other):
        return isinstance(other, Topology) and self.to_dict() == other.to_dict()

    def __hash__(self):
        return hash(self.fingerprint())

    def __repr__(self):
        return (f"Topology(name={self.name!r}, n={self.n}, switches={len(self.switches)}, "
                f"links={len(self.links)})")


def _pcie_tree(n, level_of, levels, pcie_gbps, sys_gbps, switches):
    """Switch nodes and PCIe links for the nested groups of an nvidia-smi matrix.

    Appends switch names to ``switches`` and returns the links. A switch is
    made for each group at each level that joins two or more groups of the
    level below; a level whose groups are all unchanged adds nothing. Pairs
    joined by NVLink show no PCIe level in the matrix; the top level joins
    whatever groups remain.
    """
    links = []
    # current top node of each GPU's group, by group representative
    groups = {frozenset([g]): g for g in range(n)}
    for lvl, level_name in enumerate(levels):
        parent = list(range(n))

        def find(x):
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for (i, j), l in level_of.items():
            if l <= lvl:
                parent[find(i)] = find(j)
        if lvl == len(levels) - 1:  # the system joins everything (NVLink pairs hide their PCIe level)
            for g in range(1, n):
                parent[find(g)] = find(0)
        merged = {}
        for g in range(n):
            merged.setdefault(find(g), set()).add(g)
        new_groups = {}
        for members in merged.values():
            members = frozenset(members)
            children = [grp for grp in groups if grp <= members]
            if len(children) == 1:
                new_groups[members] = groups[children[0]]
                continue
            switch_id = n + len(switches)
            switches.append(f"{level_name.lower()}{len(switches)}")
            gbps = sys_gbps if level_name == "SYS" else pcie_gbps
            for child in children:
                links.append((groups[child], switch_id, gbps, "pcie"))
            new_groups[members] = switch_id
        groups = new_groups
    return links


class LinkGraph:
    """Directed capacity graph of a topology, restricted to some link kinds.

    Each full-duplex link becomes two arcs of its bandwidth (parallel links of
    the kinds used are summed). Ranks reach each other directly or through
    switch nodes; a *route* is a path whose interior nodes are all switches.

    Attributes
    ----------
    n : int
        Ranks.
    num_nodes : int
        Ranks plus switches.
    kinds : tuple of str
        Link kinds included.
    arcs : list of (int, int)
        Arc ``a`` goes ``arcs[a][0] -> arcs[a][1]``.
    capacity_gbps : numpy.ndarray
        Capacity of each arc.
    reverse : numpy.ndarray
        ``reverse[a]`` is the arc in the opposite direction.
    arc_kind : list of str
        Fastest kind contributing to each arc.
    """

    def __init__(self, topology: Topology, kinds: Sequence[str]):
        self.n = topology.n
        self.num_nodes = topology.num_nodes
        self.kinds = tuple(kinds)
        pair = {}
        for l in topology.links:
            if l.kind in self.kinds:
                cap, kind = pair.get((l.u, l.v), (0.0, l.kind))
                pair[(l.u, l.v)] = (cap + l.bandwidth_gbps, kind)
        self.arcs, caps, self.arc_kind = [], [], []
        for (u, v), (cap, kind) in sorted(pair.items()):
            self.arcs += [(u, v), (v, u)]
            caps += [cap, cap]
            self.arc_kind += [kind, kind]
        self.capacity_gbps = np.asarray(caps, dtype=float)
        self.index = {arc: a for a, arc in enumerate(self.arcs)}
        self.reverse = np.asarray([a ^ 1 for a in range(len(self.arcs))], dtype=int)
        self.out_arcs = [[] for _ in range(self.num_nodes)]
        for a, (u, _) in enumerate(self.arcs):
            self.out_arcs[u].append(a)

    @property
    def has_switches(self) -> bool:
        """Whether any arc touches a switch node."""
        return any(u >= self.n or v >= self.n for u, v in self.arcs)

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
                return None
            tree = nx.minimum_spanning_tree(g, weight="weight")
            start = 0 if root is None else root
            edges = list(nx.bfs_edges(tree, start))
        else:
            routes = self.routes(arc_price if directions == "down" else arc_price[self.reverse])
            arcs = [(u, v, cost) for (u, v), (cost, _) in routes.items() if v != root]
            chosen = _min_arborescence(self.n, root, arcs)
            if chosen is None:
                return None
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
        return total, edges, paths


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
