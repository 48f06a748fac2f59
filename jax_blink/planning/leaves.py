"""Slow ranks as leaves: the allreduce tree packing restricted to trees whose slow ranks have no children.

A rank that arrives late at an allreduce delays everything above it in a
tree. As a leaf it delays only its own last hop. :func:`pack_leaves` packs
the ``"tree"`` family (reduce up, broadcast down the same undirected trees)
by column generation over trees in which every slow rank is a leaf and
never the root: the pricing step adds a large price to every arc that
touches a slow rank, so the cheapest spanning tree touches each slow rank
once (a leaf hung on a fast rank) wherever the fast ranks are joined
without them, and its reduced cost is then read at the true prices. The
caller compares the rate with the unrestricted optimum.

Pure Python: never imports jax.
"""

from __future__ import annotations

import numpy as np

from .fewest import exact_weights, fewest_trees, lp_support
from .packing import PRICE_TOL, Packer, orient
from .tree import tree_depth

__all__ = ["LeafPacker", "pack_leaves", "slow_are_leaves"]

#: Added to each arc touching a slow rank while pricing: more than any tree of true prices costs.
SLOW_PRICE = 1e4


def slow_are_leaves(root: int, edges, slow) -> bool:
    """Whether no rank of ``slow`` is ``root`` or a parent in ``edges`` (``(parent, child)`` pairs).

    Examples
    --------
    >>> slow_are_leaves(0, [(0, 1), (0, 2)], {2}), slow_are_leaves(0, [(0, 1), (1, 2)], {1})
    (True, False)
    """
    return root not in slow and not any(p in slow for p, _ in edges)


class LeafPacker(Packer):
    """The allreduce ``"tree"`` family's :class:`~jax_blink.planning.packing.Packer`
    over trees whose ``slow`` ranks are leaves (columns of other trees are refused)."""

    def __init__(self, graph, slow):
        super().__init__(graph, "allreduce", "tree", None)
        self.slow = frozenset(int(s) for s in slow)
        self.touch = np.asarray([u in self.slow or v in self.slow for u, v in graph.arcs], dtype=float)

    def add(self, root, edges, paths, direction=None) -> bool:
        """Add the tree rooted at its centre among the fast ranks, if its slow ranks are leaves there."""
        fast = [r for r in range(self.n) if r not in self.slow]
        root = min(fast, key=lambda r: (tree_depth(r, orient(edges, paths, r)[0]), r))
        edges, paths = orient(edges, paths, root)
        if not slow_are_leaves(root, edges, self.slow):
            return False
        return self._keep((None, frozenset(min(path, path[::-1]) for path in paths)), root, edges, paths)

    def seed(self):
        """The cheapest leaf tree at unit prices, then the breadth-first trees that qualify."""
        self.price(np.zeros(len(self.graph.arcs)), tol=-np.inf)
        super().seed()

    def price(self, arc_price, root_price=None, tol=PRICE_TOL) -> int:
        """Add the cheapest leaf tree if its reduced cost (at the true prices) is negative."""
        y = np.asarray(arc_price, dtype=float)
        found = self.graph.cheapest_tree(y + SLOW_PRICE * self.touch, self.directions, None)
        if found is None:
            return 0
        _, edges, paths = found
        use = self.graph.usage(edges, paths, self.directions)
        if float(y @ use) >= 1.0 - tol:
            return 0
        return int(self.add(0, tuple(edges), tuple(paths)))


def pack_leaves(graph, slow):
    """The best packing of trees whose ``slow`` ranks are leaves, or None where no such tree exists.

    Parameters
    ----------
    graph : LinkGraph
    slow : iterable of int
        Ranks to keep as leaves (fewer than all ranks).

    Returns
    -------
    (float, float, tuple of Tree) or None
        The restricted LP optimum, the rate of the fewest trees reaching it,
        and those trees.
    """
    packer = LeafPacker(graph, slow)
    packer.seed()
    if not packer.columns:
        return None
    lp_rate, _, _ = packer.generate()
    candidates = [exact_weights(packer, lp_support(packer))]
    chosen = fewest_trees(packer, lp_rate * (1 - 1e-9), None)
    if chosen:
        candidates.append(exact_weights(packer, chosen))
    reaching = [c for c in candidates if c[0] >= lp_rate * (1 - 1e-9)]
    rate, trees = min(reaching, key=lambda c: len(c[1])) if reaching else max(candidates, key=lambda c: c[0])
    return lp_rate, rate, trees
