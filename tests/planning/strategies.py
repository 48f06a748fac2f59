"""Hypothesis strategies shared by the planning tests."""

from hypothesis import strategies as st

from jax_blink.topo import Topology


@st.composite
def connected_topologies(draw):
    n = draw(st.integers(2, 5))
    bandwidth = st.sampled_from([5.0, 10.0, 12.5, 20.0, 25.0, 50.0])
    links = [(draw(st.integers(0, v - 1)), v, draw(bandwidth)) for v in range(1, n)]  # spanning tree
    extra = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), bandwidth), max_size=6))
    links += [(u, v, b) for u, v, b in extra if u != v]
    order = draw(st.permutations(range(n)))  # relabel so the tree is not always rooted at 0
    return Topology.from_links(n, [(order[u], order[v], b) for u, v, b in links])
