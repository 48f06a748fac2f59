"""The one cost model: a single latency table, the pipelining formula, tree depth."""

from jax_blink.planning import Tree, cost, plan
from jax_blink.planning.tree import tree_depth
from jax_blink.sim import SimModel
from jax_blink.topo import LINK_KINDS, Topology


def test_pipeline_chunks_minimises_the_model():
    def model(k, depth=6, size=3e7, gbps=20.0, alpha=3e-6):
        return (depth + k - 1) * (alpha + size / (k * gbps * 1e9))

    best = cost.pipeline_chunks(6, 3e7, 20.0, 3e-6, max_chunks=10**6)
    assert all(model(best) <= model(k) for k in range(1, 500))
    assert cost.pipeline_chunks(6, 3e9, 20.0, 3e-6) == cost.MAX_CHUNKS == 64  # clamped


def test_the_simulator_defaults_to_the_cost_model_latencies():
    for kind in LINK_KINDS:
        assert SimModel().latency_s(kind) == cost.latency_s(kind) == cost.LATENCY_US[kind] * 1e-6


def test_pipeline_chunks_is_one_for_one_hop_or_nothing_to_send():
    assert cost.pipeline_chunks(1, 1e9, 25.0, 1e-6) == 1
    assert cost.pipeline_chunks(4, 0, 25.0, 1e-6) == 1
    assert cost.pipeline_chunks(4, 1e6, 25.0, 0.0) == cost.MAX_CHUNKS


def test_chunks_for_is_the_pipelining_formula_per_tree():
    # a chain 0-1-2-3 of 10 GB/s links: one broadcast tree of depth 3
    topo = Topology.from_links(4, [(0, 1, 10.0), (1, 2, 10.0), (2, 3, 10.0)])
    p = plan(topo, "broadcast", root=0, cache=False)
    (tree,) = p.trees
    assert tree.depth == 3 and tree.weight == 10.0
    alpha = cost.latency_s("nvlink") + cost.CUDA_LAUNCH_SECONDS
    for size in (2**12, 2**20, 2**26):
        # (D + k - 1)(alpha + S / (k B)), minimised over the allowed chunk counts
        best = min(range(1, cost.MAX_CHUNKS_PER_TREE + 1), key=lambda k: (3 + k - 1) * (alpha + size / (k * 10e9)))
        assert p.chunks_for(size, cost.CUDA_LAUNCH_SECONDS) == [best]
    assert p.chunks_for(2**40) == [cost.MAX_CHUNKS_PER_TREE]


def test_tree_depth_counts_edges_on_the_longest_root_to_leaf_path():
    assert tree_depth(0, []) == 0
    assert tree_depth(2, [(2, 0), (2, 1)]) == 1
    assert tree_depth(0, [(0, 1), (1, 2), (2, 3), (0, 4)]) == 3
    assert Tree(1.0, 0, ((0, 1), (1, 2)), ((0, 1), (1, 2))).depth == 2
