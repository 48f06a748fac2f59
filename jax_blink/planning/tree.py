"""A weighted spanning tree of a plan, and the one tree-depth function.

A :class:`Tree` is a rooted spanning tree of the ranks with a bandwidth share
and the route (node path through switches) of each edge; an allreduce tree of
the ``"split"`` family also has its own reduce tree. :func:`tree_depth`
is the depth every part of jax_blink uses (the packing's tie-break, the
pipelining model, the baselines).

Pure Python: never imports jax.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

__all__ = ["Tree", "tree_depth"]


def tree_depth(root: int, edges) -> int:
    """Longest root-to-leaf path, in edges, of the tree ``edges`` (``(parent, child)`` pairs).

    Examples
    --------
    >>> tree_depth(0, [(0, 1), (1, 2), (0, 3)])
    2
    >>> tree_depth(5, [])
    0
    """
    children = defaultdict(list)
    for p, c in edges:
        children[p].append(c)
    depth, frontier = 0, [root]
    while True:
        frontier = [c for v in frontier for c in children[v]]
        if not frontier:
            return depth
        depth += 1


@dataclasses.dataclass(frozen=True)
class Tree:
    """One weighted spanning tree of a plan.

    Attributes
    ----------
    weight : float
        Bandwidth share in GB/s: the tree carries ``weight / sum(weights)``
        of the data.
    root : int
        Where the reduction ends and the broadcast starts (for reduce-scatter
        and all-gather: the rank whose slice the tree carries).
    edges : tuple of (int, int)
        ``(parent, child)`` rank pairs in broadcast direction (a reduce or
        reduce-scatter sends child to parent). A hop through switches is still one rank-to-rank edge.
    paths : tuple of tuple of int
        The node path of each edge from parent to child (``(parent, child)``
        for a direct link; switch nodes in between otherwise).
    up_edges, up_paths : tuple
        An allreduce of the ``"split"`` family reduces up a different tree
        into the same root (asymmetric links can carry more that way): its
        ``(parent, child)`` edges (the child sends to the parent) and their
        node paths from parent to child. Empty (the default): the reduction
        goes up ``edges`` itself.
    """

    weight: float
    root: int
    edges: tuple
    paths: tuple
    up_edges: tuple = ()
    up_paths: tuple = ()

    @property
    def depth(self) -> int:
        """Longest root-to-leaf path, in edges (of the broadcast tree)."""
        return tree_depth(self.root, self.edges)

    @property
    def reduce_edges(self) -> tuple:
        """The edges the reduction goes up: :attr:`up_edges`, or :attr:`edges` when the tree has none."""
        return self.up_edges or self.edges

    @property
    def reduce_paths(self) -> tuple:
        """The node paths of :attr:`reduce_edges`, parent first."""
        return self.up_paths if self.up_edges else self.paths

    @property
    def round_trip(self) -> int:
        """Hops from the deepest leaf up to the root and down again: the
        pipeline depth of an allreduce over this tree."""
        return tree_depth(self.root, self.reduce_edges) + self.depth

    def to_dict(self) -> dict:
        """The tree as a JSON object (part of a plan's JSON)."""
        d = {"weight": self.weight, "root": self.root, "edges": [list(e) for e in self.edges],
             "paths": [list(p) for p in self.paths]}
        if self.up_edges:
            d["up_edges"] = [list(e) for e in self.up_edges]
            d["up_paths"] = [list(p) for p in self.up_paths]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Tree":
        """Read back :meth:`to_dict`; ``paths`` (``up_paths``) default to the edges (direct links)."""
        edges = tuple((int(p), int(c)) for p, c in d["edges"])
        paths = tuple(tuple(int(x) for x in p) for p in d.get("paths", edges))
        up_edges = tuple((int(p), int(c)) for p, c in d.get("up_edges", ()))
        up_paths = tuple(tuple(int(x) for x in p) for p in d.get("up_paths", up_edges))
        return cls(float(d["weight"]), int(d["root"]), edges, paths, up_edges, up_paths)
