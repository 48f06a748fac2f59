"""A weighted spanning tree of a plan, and the one tree-depth function.

A :class:`Tree` is a rooted spanning tree of the ranks with a bandwidth share
and the route (node path through switches) of each edge. :func:`tree_depth`
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
    """

    weight: float
    root: int
    edges: tuple
    paths: tuple

    @property
    def depth(self) -> int:
        """Longest root-to-leaf path, in edges."""
        return tree_depth(self.root, self.edges)

    def to_dict(self) -> dict:
        """The tree as a JSON object (part of a plan's JSON)."""
        return {"weight": self.weight, "root": self.root, "edges": [list(e) for e in self.edges],
                "paths": [list(p) for p in self.paths]}

    @classmethod
    def from_dict(cls, d: dict) -> "Tree":
        """Read back :meth:`to_dict`; ``paths`` default to the edges (direct links)."""
        edges = tuple((int(p), int(c)) for p, c in d["edges"])
        paths = tuple(tuple(int(x) for x in p) for p in d.get("paths", edges))
        return cls(float(d["weight"]), int(d["root"]), edges, paths)
