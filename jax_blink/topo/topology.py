"""The link topology of a set of devices: ranks, switch nodes and full-duplex links.

A :class:`Topology` holds ``n`` ranks (nodes ``0..n-1``), optional switch
nodes (``n..n+s-1``: NVSwitch, PCIe switch, CPU root complex, host memory;
they forward data but cannot reduce it) and full-duplex :class:`Link` s, each
with a bandwidth in GB/s per direction and a kind (``nvlink``, ``pcie``,
``net`` or ``shm``). Parallel links of one kind between the same two nodes add
up. Topologies are built from links, presets, JSON, or the output of
``nvidia-smi topo -m``, can be restricted to a subset of their ranks, can
lose links (:meth:`Topology.without`) or run some slower
(:meth:`Topology.degraded`), and
give the :class:`~jax_blink.topo.graph.LinkGraph` that plans are packed into
and data is routed on.

Pure Python: never imports jax.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import hashlib
import json
import math
import numbers
import os
from typing import Iterable, Sequence

import numpy as np

from .._jsonio import read_document
from . import hosts as _hosts
from . import presets
from .errors import TopologyError
from .graph import LinkGraph
from .limits import MAX_BANDWIDTH_GBPS, MAX_NODES, MIN_BANDWIDTH_GBPS
from .nvidia_smi import parse_topo_matrix

__all__ = ["Topology", "Link", "LINK_KINDS", "FAST_KINDS", "LINK_CHOICES", "load_topology"]

#: Link kinds, fastest class first.
LINK_KINDS = ("nvlink", "pcie", "net", "shm")
#: Kinds a ``links="fast"`` plan uses on their own whenever they connect all ranks.
FAST_KINDS = ("nvlink",)
#: What :meth:`Topology.planning_kinds` (and ``plan(links=...)``) accepts:
#: ``"all"`` plans over every link (Blink's hybrid transfers: NVLink, PCIe
#: switches, QPI, NICs); ``"fast"`` over the fast kinds alone wherever they
#: join all ranks (slow links only bridge fast islands), for comparison.
LINK_CHOICES = ("all", "fast")
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Link:
    """A full-duplex link between two nodes.

    Attributes
    ----------
    u, v : int
        Node ids: ranks ``0..n-1`` or switches ``n..``.
    bandwidth_gbps : float
        Bandwidth in GB/s from ``u`` to ``v`` (and from ``v`` to ``u`` too
        unless ``reverse_gbps`` is given).
    kind : str
        One of :data:`LINK_KINDS`.
    reverse_gbps : float or None
        Bandwidth in GB/s from ``v`` to ``u`` where it differs (measured
        asymmetric PCIe, a NIC with different send and receive rates); None
        means the same as ``bandwidth_gbps``.
    """

    u: int
    v: int
    bandwidth_gbps: float
    kind: str = "nvlink"
    reverse_gbps: float | None = None

    @property
    def forward_gbps(self) -> float:
        """Bandwidth from ``u`` to ``v``."""
        return self.bandwidth_gbps

    @property
    def backward_gbps(self) -> float:
        """Bandwidth from ``v`` to ``u``."""
        return self.bandwidth_gbps if self.reverse_gbps is None else self.reverse_gbps


def _is_integer(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Integral)


def _as_link(item) -> Link:
    if isinstance(item, Link):
        return item
    if not isinstance(item, (list, tuple, np.ndarray)):
        raise TopologyError(f"a link must be a Link or a list/tuple (u, v, gbps[, kind[, reverse_gbps]]), "
                            f"got {item!r:.80}")
    if len(item) not in (3, 4, 5):
        raise TopologyError(f"a link must be (u, v, gbps), (u, v, gbps, kind) or (u, v, gbps, kind, reverse_gbps), "
                            f"got {item!r:.80}")
    return Link(*item)


def _bandwidth(link: Link, gbps=None, direction: str = "") -> float:
    """A bandwidth of the link (``link.bandwidth_gbps`` by default) as a float, checked against the limits."""
    gbps = link.bandwidth_gbps if gbps is None else gbps
    where = f"link {link.u!r:.20}-{link.v!r:.20}: {direction}bandwidth {gbps!r:.40}"
    if isinstance(gbps, bool) or not isinstance(gbps, numbers.Real):
        raise TopologyError(f"{where} is not a number; give GB/s per direction as an int or a float")
    try:
        gbps = float(gbps)
    except OverflowError:
        gbps = math.inf
    if not MIN_BANDWIDTH_GBPS <= gbps <= MAX_BANDWIDTH_GBPS:  # NaN fails too
        raise TopologyError(f"{where} is out of range: a bandwidth must be a positive number of GB/s "
                            f"between {MIN_BANDWIDTH_GBPS:g} and {MAX_BANDWIDTH_GBPS:g}")
    return gbps


class Topology:
    """Ranks, switches and full-duplex links with per-direction bandwidths.

    Use the constructors (:meth:`from_links`, :meth:`preset`,
    :meth:`from_json`, :meth:`from_nvidia_smi`) rather than ``__init__``.
    Every value is checked (a :class:`TopologyError` names it and what is
    allowed): at most :data:`~jax_blink.topo.limits.MAX_NODES` ranks and
    switches together; switch names and the name are strings; a link's ends
    are integer node ids, its kind one of :data:`LINK_KINDS`, and its
    bandwidth an int or float between
    :data:`~jax_blink.topo.limits.MIN_BANDWIDTH_GBPS` and
    :data:`~jax_blink.topo.limits.MAX_BANDWIDTH_GBPS` GB/s (parallel links
    summed).

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
        summed per direction, sorted; ``reverse_gbps`` is set only where the
        two directions differ.
    reduce_gbps : float or None
        How fast one rank reduces, in GB/s of incoming data (a reduction
        reads two operands and writes one: about a third of the device's
        memory bandwidth), for the simulator; None where unknown (the
        simulator's default). The presets set it per GPU. Not part of
        :meth:`fingerprint`: planning does not use it.

    Examples
    --------
    >>> t = Topology.from_links(3, [(0, 1, 25), (1, 2, 25), (0, 1, 25)])
    >>> t.links[0]
    Link(u=0, v=1, bandwidth_gbps=50.0, kind='nvlink', reverse_gbps=None)
    >>> t.subset([2, 1]).links
    (Link(u=0, v=1, bandwidth_gbps=25.0, kind='nvlink', reverse_gbps=None),)
    >>> Topology.from_links(2, [(1, 0, 12.0, "pcie", 16.0)]).links  # 1 -> 0 at 12, 0 -> 1 at 16
    (Link(u=0, v=1, bandwidth_gbps=16.0, kind='pcie', reverse_gbps=12.0),)
    """

    def __init__(self, n: int, links: Iterable, switches: Sequence[str] = (), name: str = "",
                 reduce_gbps: float | None = None):
        if not _is_integer(n) or not 1 <= n <= MAX_NODES:
            raise TopologyError(f"the number of ranks must be a positive integer of at most {MAX_NODES}, "
                                f"got {n!r:.40}")
        self.n = int(n)
        if not isinstance(switches, (list, tuple)):
            raise TopologyError(f"switches must be a list of switch names (strings), got {switches!r:.80}")
        for s in switches:
            if not isinstance(s, str):
                raise TopologyError(f"switch name {s!r:.40} is not a string; switches must be a list of names")
        if self.n + len(switches) > MAX_NODES:
            raise TopologyError(f"{self.n} ranks and {len(switches)} switches are more than the {MAX_NODES} "
                                f"nodes a topology may have")
        self.switches = tuple(switches)
        if name is not None and not isinstance(name, str):
            raise TopologyError(f"the topology name must be a string, got {name!r:.40}")
        self.name = name or f"custom-{self.n}"
        if reduce_gbps is not None:
            if isinstance(reduce_gbps, bool) or not isinstance(reduce_gbps, numbers.Real) \
                    or not MIN_BANDWIDTH_GBPS <= reduce_gbps <= MAX_BANDWIDTH_GBPS:
                raise TopologyError(f"reduce_gbps {reduce_gbps!r:.40} is not a number of GB/s between "
                                    f"{MIN_BANDWIDTH_GBPS:g} and {MAX_BANDWIDTH_GBPS:g} (or None: unknown)")
            reduce_gbps = float(reduce_gbps)
        self.reduce_gbps = reduce_gbps
        if isinstance(links, (str, bytes, dict)) or not isinstance(links, collections.abc.Iterable):
            raise TopologyError(f"links must be an iterable of links (Link or (u, v, gbps[, kind])), "
                                f"got {links!r:.80}")
        total = self.n + len(self.switches)
        merged = {}
        for item in links:
            link = _as_link(item)
            for end in (link.u, link.v):
                if not _is_integer(end) or not 0 <= end < total:
                    raise TopologyError(
                        f"link {link.u!r:.20}-{link.v!r:.20}: node {end!r:.20} is out of range; nodes are integers, "
                        f"ranks 0..{self.n - 1}" + (f" and switches {self.n}..{total - 1}" if self.switches else ""))
            if link.u == link.v:
                raise TopologyError(f"link {link.u}-{link.v} connects a node to itself")
            gbps = _bandwidth(link)
            back = gbps if link.reverse_gbps is None else _bandwidth(link, link.reverse_gbps, "reverse ")
            if not isinstance(link.kind, str) or link.kind not in LINK_KINDS:
                raise TopologyError(f"link {link.u}-{link.v}: unknown kind {link.kind!r:.40}; "
                                    f"expected one of {LINK_KINDS}")
            key = (int(min(link.u, link.v)), int(max(link.u, link.v)), link.kind)
            if link.u > link.v:  # stored as low -> high, high -> low
                gbps, back = back, gbps
            fwd, rev = merged.get(key, (0.0, 0.0))
            merged[key] = (fwd + gbps, rev + back)
            if max(merged[key]) > MAX_BANDWIDTH_GBPS:
                raise TopologyError(f"{key[2]} links {key[0]}-{key[1]} add up to {max(merged[key]):g} GB/s in one "
                                    f"direction, more than the {MAX_BANDWIDTH_GBPS:g} GB/s a pair of nodes may have "
                                    f"per kind")
        self.links = tuple(Link(u, v, fwd, kind, None if rev == fwd else rev)
                           for (u, v, kind), (fwd, rev) in sorted(merged.items()))

    # ------------------------------------------------------------ constructors
    @classmethod
    def from_links(cls, n: int, links: Iterable, switches: Sequence[str] = (), name: str = "",
                   reduce_gbps: float | None = None) -> "Topology":
        """Build a topology from links.

        Parameters
        ----------
        n : int
            Number of ranks.
        links : iterable of Link or tuple
            ``(u, v, gbps)``, ``(u, v, gbps, kind)`` or
            ``(u, v, gbps, kind, reverse_gbps)``: ``gbps`` from ``u`` to
            ``v``, ``reverse_gbps`` from ``v`` to ``u`` (default: the same);
            ``kind`` defaults to ``"nvlink"``. Parallel links of one kind add
            up, per direction.
        switches : sequence of str
            Names of switch nodes, which get ids ``n, n+1, ...``. A switch's
            per-port bandwidth is the bandwidth of the link to it.
        name : str
            Display name.
        reduce_gbps : float, optional
            How fast one rank reduces (see :class:`Topology`).

        Raises
        ------
        TopologyError
            Naming the first value that is not allowed (see :class:`Topology`).
        """
        return cls(n, links, switches, name, reduce_gbps)

    @classmethod
    def preset(cls, name: str) -> "Topology":
        """A named machine; see :func:`jax_blink.topo.presets.preset_names` (any letter case).

        Raises
        ------
        TopologyError
            If ``name`` is unknown; the message lists the valid names.
        """
        return cls(*presets.preset_spec(name))

    @classmethod
    def multi_host(cls, host, hosts: int, nic_gbps: float, nics: int = 1, name: str = "") -> "Topology":
        """``hosts`` copies of one host joined by NICs to a non-blocking network switch.

        Host ``h`` holds ranks ``h * k .. h * k + k - 1`` (``k`` = the host's
        ranks); see :mod:`jax_blink.topo.hosts` for the model.

        Parameters
        ----------
        host : Topology or str
            One host: a Topology, a preset name or a topology JSON path.
        hosts : int
        nic_gbps : float
            Bandwidth of each NIC in GB/s per direction (100 Gb/s is 12.5).
        nics : int
            NICs per host; the host's GPUs are split among them in contiguous runs.
        name : str
            Display name (default ``"<hosts>x<host name>"``).

        Raises
        ------
        TopologyError
            Naming the value that is not allowed.

        Examples
        --------
        >>> t = Topology.multi_host("dgx1-v100", 4, nic_gbps=12.5)
        >>> t.name, t.n, len(t.host_ranks())
        ('4xdgx1-v100', 32, 4)
        """
        host = host if isinstance(host, Topology) else load_topology(host)
        return cls(*_hosts.multi_host_spec(host, hosts, nic_gbps, nics, name))

    @classmethod
    def from_json(cls, path_or_text) -> "Topology":
        """Load from JSON text, a dict, or a path to a JSON file (see :meth:`to_json`).

        Raises
        ------
        TopologyError
            If the file cannot be read (it must be a regular UTF-8 file), the
            text is not a topology JSON object, or a value in it is not allowed
            (see :class:`Topology`).
        """
        data = read_document(path_or_text, fmt="jax_blink.topology", version=FORMAT_VERSION,
                             error=TopologyError, what="topology")
        for key in ("nranks", "links"):
            if key not in data:
                raise TopologyError(f"malformed topology JSON: missing key {key!r}")
        if not isinstance(data["links"], list):
            raise TopologyError(f"malformed topology JSON: 'links' must be a list of [u, v, gbps, kind] "
                                f"(or [u, v, gbps, kind, reverse_gbps] where the directions differ), "
                                f"got {data['links']!r:.60}")
        return cls(data["nranks"], data["links"], data.get("switches", []), data.get("name", ""),
                   data.get("reduce_gbps"))

    @classmethod
    def from_nvidia_smi(cls, text: str, *, nvlink_gbps: float = 25.0, pcie_gbps=16.0,
                        sys_gbps=38.4, name: str = "nvidia-smi") -> "Topology":
        """Build the topology printed by ``nvidia-smi topo -m``.

        See :func:`jax_blink.topo.nvidia_smi.parse_topo_matrix` for how the
        matrix's cells become NVLinks and a tree of PCIe switch nodes.
        ``pcie_gbps`` and ``sys_gbps`` take one number (both directions) or
        a pair ``(up, down)``: ``up`` toward the CPUs (a GPU's writes to the
        host), ``down`` away from them, for measured asymmetric PCIe.

        Raises
        ------
        TopologyError
            If the text holds no GPU matrix or a cell is not understood.
        """
        n, links, switches = parse_topo_matrix(text, nvlink_gbps=nvlink_gbps, pcie_gbps=pcie_gbps,
                                               sys_gbps=sys_gbps)
        return cls(n, links, switches, name)

    # --------------------------------------------------------------- exports
    def to_dict(self) -> dict:
        """The JSON object of :meth:`to_json` (``"reduce_gbps"`` only where it is known)."""
        data = {"format": "jax_blink.topology", "version": FORMAT_VERSION, "name": self.name,
                "nranks": self.n, "switches": list(self.switches),
                "links": [[l.u, l.v, l.bandwidth_gbps, l.kind] + ([] if l.reverse_gbps is None else [l.reverse_gbps])
                          for l in self.links]}
        if self.reduce_gbps is not None:
            data["reduce_gbps"] = self.reduce_gbps
        return data

    def to_json(self, indent=None) -> str:
        """JSON text that :meth:`from_json` reads back."""
        return json.dumps(self.to_dict(), indent=indent)

    def fingerprint(self) -> str:
        """Stable hex digest of the canonical JSON (ranks, switches, links; not the name nor
        :attr:`reduce_gbps`, which planning does not use)."""
        data = self.to_dict()
        del data["name"]
        data.pop("reduce_gbps", None)
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
        if isinstance(ranks, (str, bytes)) or not isinstance(ranks, collections.abc.Iterable):
            raise TopologyError(f"a subset is a sequence of rank numbers, got {ranks!r:.60}")
        ranks = list(ranks)
        if not ranks:
            raise TopologyError("a subset needs at least one rank")
        for r in ranks:
            if not _is_integer(r) or not 0 <= r < self.n:
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
        return Topology(len(ranks), [(new_id[l.u], new_id[l.v], l.bandwidth_gbps, l.kind, l.reverse_gbps)
                                     for l in links],
                        [self.switches[s - self.n] for s in sorted(keep_switch)],
                        name or f"{self.name}[{','.join(map(str, ranks))}]", self.reduce_gbps)

    def _pair_keys(self, pairs, what: str) -> list:
        """``pairs`` as checked ``(low, high)`` node pairs that have at least one link."""
        if isinstance(pairs, (str, bytes)) or not isinstance(pairs, collections.abc.Iterable):
            raise TopologyError(f"{what} takes node pairs (u, v), got {pairs!r:.60}")
        present = {(l.u, l.v) for l in self.links}
        keys = []
        for pair in pairs:
            if isinstance(pair, (str, bytes)) or not isinstance(pair, collections.abc.Sequence) or len(pair) != 2:
                raise TopologyError(f"{what}: {pair!r:.40} is not a node pair (u, v)")
            for end in pair:
                if not _is_integer(end) or not 0 <= end < self.num_nodes:
                    raise TopologyError(
                        f"{what}: node {end!r:.20} of pair {tuple(pair)!r:.40} is out of range; {self.name} has "
                        f"ranks 0..{self.n - 1}" + (f" and switches {self.n}..{self.num_nodes - 1}"
                                                    if self.switches else ""))
            key = (int(min(pair)), int(max(pair)))
            if key not in present:
                raise TopologyError(f"{what}: {self.name} has no link between {key[0]} and {key[1]}; "
                                    f"name a pair that Topology.links lists")
            keys.append(key)
        return keys

    def without(self, pairs, name: str = "") -> "Topology":
        """This topology with every link between each pair ``(u, v)`` removed (a failed link).

        Links of every kind between ``u`` and ``v`` go, in both directions;
        the ranks stay (a rank left without links makes plans fail with an
        error naming it). The result is a plain topology: its JSON lists the
        remaining links, so :meth:`fingerprint` and the plan cache key change.

        Parameters
        ----------
        pairs : iterable of (int, int)
            Node pairs, in either order.
        name : str
            Display name (default ``"<name>-without(u-v,...)"``).

        Raises
        ------
        TopologyError
            If a node is out of range or a pair has no link.

        Examples
        --------
        >>> t = Topology.preset("dgx1-v100").without([(1, 0)])
        >>> [l for l in t.links if (l.u, l.v) == (0, 1)]
        []
        """
        gone = set(self._pair_keys(pairs, "without"))
        label = ",".join(f"{u}-{v}" for u, v in sorted(gone))
        return Topology(self.n, [l for l in self.links if (l.u, l.v) not in gone], list(self.switches),
                        name or f"{self.name}-without({label})", self.reduce_gbps)

    def degraded(self, factors, name: str = "") -> "Topology":
        """This topology with every link between each pair ``(u, v)`` scaled by a factor (a slow link).

        Parameters
        ----------
        factors : mapping of (int, int) to float
            ``{(u, v): factor}``, ``0 < factor <= 1``: both directions of
            every link between ``u`` and ``v`` run at ``factor`` of their
            bandwidth (an NVLink trained at a lower speed). Use
            :meth:`without` for a link that is down.
        name : str
            Display name (default ``"<name>-degraded(u-v*f,...)"``).

        Raises
        ------
        TopologyError
            If ``factors`` is not a mapping, a node is out of range, a pair
            has no link, a pair is named twice, or a factor is not in (0, 1].

        Examples
        --------
        >>> t = Topology.preset("dgx1-v100").degraded({(0, 1): 0.5})
        >>> [l.bandwidth_gbps for l in t.links if (l.u, l.v) == (0, 1)]
        [25.0]
        """
        if not isinstance(factors, collections.abc.Mapping):
            raise TopologyError(f"degraded takes a mapping {{(u, v): factor}}, got {factors!r:.60}")
        keys = self._pair_keys(list(factors), "degraded")
        scale = {}
        for key, factor in zip(keys, factors.values()):
            if isinstance(factor, bool) or not isinstance(factor, numbers.Real) or not 0 < factor <= 1:
                raise TopologyError(f"degraded: factor {factor!r:.40} for link {key[0]}-{key[1]} is not in (0, 1]; "
                                    f"give the fraction of its bandwidth the link keeps (use without() "
                                    f"for a link that is down)")
            if key in scale:
                raise TopologyError(f"degraded: link {key[0]}-{key[1]} is named twice")
            scale[key] = float(factor)
        label = ",".join(f"{u}-{v}*{f:g}" for (u, v), f in sorted(scale.items()))
        links = []
        for l in self.links:
            f = scale.get((l.u, l.v), 1.0)
            links.append((l.u, l.v, l.bandwidth_gbps * f, l.kind,
                          None if l.reverse_gbps is None else l.reverse_gbps * f))
        return Topology(self.n, links, list(self.switches), name or f"{self.name}-degraded({label})",
                        self.reduce_gbps)

    def host_ranks(self) -> tuple:
        """The ranks of each host: the groups joined by links other than ``"net"``.

        See :func:`jax_blink.topo.hosts.host_ranks`; one group when the
        topology has no network links.
        """
        return _hosts.host_ranks(self)

    def network(self) -> "Topology":
        """The network between the hosts, each host contracted to one rank.

        See :func:`jax_blink.topo.hosts.network_spec`.

        Raises
        ------
        TopologyError
            If the topology is one host (nothing joins a network).
        """
        spec = _hosts.network_spec(self)
        if spec[0] < 2:
            raise TopologyError(f"{self.name} is one host: it has no 'net' links between groups of ranks")
        return Topology(*spec)

    def kinds(self) -> tuple:
        """The link kinds present, fastest class first."""
        present = {l.kind for l in self.links}
        return tuple(k for k in LINK_KINDS if k in present)

    def planning_kinds(self, links: str = "all") -> tuple:
        """The link kinds a plan uses.

        Parameters
        ----------
        links : {"all", "fast"}
            ``"all"`` (the default): every kind present. ``"fast"``: the fast
            kinds (:data:`FAST_KINDS`) if they connect all ranks, else every
            kind (slow links then bridge the fast islands).

        Raises
        ------
        TopologyError
            If ``links`` is not one of :data:`LINK_CHOICES`.

        Examples
        --------
        >>> t = Topology.preset("dgx1-v100")
        >>> t.planning_kinds(), t.planning_kinds("fast")
        (('nvlink', 'pcie'), ('nvlink',))
        """
        if not isinstance(links, str) or links not in LINK_CHOICES:
            raise TopologyError(f"links={links!r:.40} is not one of {', '.join(map(repr, LINK_CHOICES))}: "
                                f"'all' plans over every link, 'fast' over NVLink alone where it joins the ranks")
        if links == "fast":
            fast = tuple(k for k in FAST_KINDS if k in self.kinds())
            if fast and not self.unreachable(fast):
                return fast
        return self.kinds()

    def unreachable(self, kinds: Sequence[str] | None = None, source: int = 0) -> list:
        """Ranks that rank ``source`` cannot reach over links of ``kinds`` (all if None)."""
        adjacency = {v: [] for v in range(self.num_nodes)}
        for l in self.links:  # every link carries data both ways
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

    def components(self, kinds: Sequence[str] | None = None) -> tuple:
        """The groups of ranks joined by links of ``kinds`` (all if None), each in
        ascending order, ordered by their lowest rank; one group when connected.

        Examples
        --------
        >>> Topology.from_links(4, [(0, 1, 10.0), (2, 3, 10.0)]).components()
        ((0, 1), (2, 3))
        """
        groups, left = [], set(range(self.n))
        while left:
            source = min(left)
            found = [source] + [r for r in left if r != source
                                and r not in self.unreachable(kinds, source)]
            groups.append(tuple(sorted(found)))
            left -= set(found)
        return tuple(groups)

    def link_graph(self, kinds: Sequence[str] | None = None) -> "LinkGraph":
        """The directed capacity graph over links of ``kinds`` (default: every kind)."""
        return LinkGraph(self, self.kinds() if kinds is None else tuple(kinds))

    def __eq__(self, other):
        return isinstance(other, Topology) and self.to_dict() == other.to_dict()

    def __hash__(self):
        return hash(self.fingerprint())

    def __repr__(self):
        return (f"Topology(name={self.name!r}, n={self.n}, switches={len(self.switches)}, "
                f"links={len(self.links)})")


def load_topology(spec: str) -> Topology:
    """The topology named by ``spec``: a preset name, or the path of a topology JSON file.

    ``spec`` is read as a file when it exists or ends in ``.json``.

    Raises
    ------
    TopologyError
        If the preset is unknown or the file cannot be read as a topology.

    Examples
    --------
    >>> load_topology("shm:2").links
    (Link(u=0, v=2, bandwidth_gbps=10.0, kind='shm', reverse_gbps=None), Link(u=1, v=2, bandwidth_gbps=10.0, kind='shm', reverse_gbps=None))
    """
    if not isinstance(spec, (str, os.PathLike)):
        raise TopologyError(f"a topology is named by a preset name or a JSON file path, got {spec!r:.60}")
    spec = os.fspath(spec)
    if os.path.exists(spec) or spec.lower().endswith(".json"):
        return Topology.from_json(spec)
    return Topology.preset(spec)
