"""psum's trace-time tuning ranks lowerings analytically and simulates only the best few
(sim.tuning.estimate_seconds, tune(simulate_top=...)): its choice is within 2% of the
exhaustive search's on every preset and on a sample of the allocations of a DGX-1 V100
(docs/design_notes.md: a sweep over all of them chose the counts)."""

import dataclasses
import itertools

import pytest

from jax_blink import Topology, plan
from jax_blink.choice.requests import tune_simulate_top
from jax_blink.planning.cost import CUDA_STREAM
from jax_blink.sim import simulate, tune
from jax_blink.sim.tuning import estimate_seconds, transfer_floor_s

SIZES = (1 << 20, 1 << 24, 1 << 28)
WITHIN = 1.02


def slowdown(topology, size):
    """The fast choice's predicted time over the exhaustive choice's."""
    p = plan(topology)
    exhaustive = tune(p, size, executor=CUDA_STREAM)
    fast = tune(p, size, executor=CUDA_STREAM, simulate_top=tune_simulate_top(size))
    return fast.seconds / exhaustive.seconds


# (the whole DGX-1s, the slowest to search exhaustively, at one size each: 16 MB, where the
# best 8 are simulated, and 256 MB, where the best 4 are; their allocations are sampled below)
@pytest.mark.parametrize("preset, sizes", [("dgx1-p100", (1 << 24,)), ("dgx1-v100", (1 << 28,)),
                                           ("dgx-a100", SIZES), ("hgx-h100", SIZES), ("pcie", SIZES)])
def test_presets(preset, sizes):
    for size in sizes:
        assert slowdown(Topology.preset(preset), size) <= WITHIN, size


@pytest.mark.parametrize("k", range(2, 7))
def test_partial_dgx1_v100_allocations(k):
    """Every fourteenth allocation of k of the 8 GPUs, in lexicographic order (k = 7 would be
    one allocation, searched exhaustively in 30 s; the whole machine is test_presets')."""
    full = Topology.preset("dgx1-v100")
    sample = list(itertools.combinations(range(8), k))[::14]
    worst = max((slowdown(full.subset(list(c)), size), c, size) for c in sample for size in SIZES)
    assert worst[0] <= WITHIN, worst


def test_one_tree_is_the_pipelining_formula():
    """A chain of 4 ranks (one tree, 3 hops each way): (2*3 + k - 1) (alpha + S / (k w)),
    which is what the simulator finds."""
    t = Topology.from_links(4, [(0, 1, 10.0), (1, 2, 10.0), (2, 3, 10.0)])
    p = plan(t)
    assert len(p.trees) == 1
    tree = p.trees[0]
    k, size = 4, 1 << 20
    alpha = 1e-6 + 0.7e-6  # the default SimModel: 1 us per step, NVLink 0.7 us
    expected = (tree.round_trip + k - 1) * (alpha + size / (k * 10.0 * 1e9))
    assert estimate_seconds(p, (k,), size) == pytest.approx(expected, rel=1e-9)
    simulated = simulate(p.lower(size, "float32", chunks=[k]), t).time_s
    assert estimate_seconds(p, (k,), size) == pytest.approx(simulated, rel=0.02)
    # with the CUDA executor: the busiest rank (an inner one, 2 edges) takes 2 * 2 * k steps
    assert estimate_seconds(p, (k,), size, CUDA_STREAM) == pytest.approx(
        max(expected, 4 * k * CUDA_STREAM.step_s) + CUDA_STREAM.call_s, rel=1e-9)


def test_shared_links_pace_the_trees():
    """The chain's tree split into two halves sharing every link: each alone would finish
    in about half the time; together they take the link's busy time, as simulated."""
    t = Topology.from_links(4, [(0, 1, 10.0), (1, 2, 10.0), (2, 3, 10.0)])
    p = plan(t)
    half = dataclasses.replace(p.trees[0], weight=p.trees[0].weight / 2)
    two = dataclasses.replace(p, trees=(half, half))
    size = 1 << 24
    alone = estimate_seconds(dataclasses.replace(p, trees=(half,)), (8,), size // 2)
    both = estimate_seconds(two, (8, 8), size)
    assert both >= size / 10e9  # every byte crosses the middle link, each way
    assert both > 1.5 * alone
    simulated = simulate(two.lower(size, "float32", chunks=[8, 8]), t).time_s
    # the estimate fills each pipeline at its tree's pace alone; the simulator shares the
    # link during the fill too, so the estimate is below it by at most the fill's share
    assert 0.8 * simulated <= both <= simulated


@pytest.mark.parametrize("preset,ranks", [("dgx1-v100", None), ("dgx1-p100", None), ("pcie", None),
                                          ("hgx-h100", None), ("dgx-a100", None),
                                          ("dgx1-v100", (0, 3, 5, 6)), ("dgx1-v100", (1, 2, 4, 5, 7))])
def test_the_transfer_floor_bounds_every_simulated_lowering(preset, ranks):
    """tune(simulate_top=...) skips a candidate whose transfer_floor_s (plus the executor's
    call) cannot beat what it already simulated: the floor must never exceed a simulation,
    for any subset of the plan's trees and any chunking; at 256 MB it is tight."""
    topology = Topology.preset(preset)
    if ranks is not None:
        topology = topology.subset(list(ranks))
    p = plan(topology)
    trees = sorted(p.trees, key=lambda t: -t.weight)
    tightest = 0.0
    for m in {1, len(trees) // 2 or 1, len(trees)}:
        sub = dataclasses.replace(p, trees=tuple(trees[:m]))
        for size in (1 << 20, 1 << 28):
            floor = transfer_floor_s(sub, size)
            for scale in (0.25, 1, 4):
                chunks = [max(1, round(k * scale)) for k in sub.chunks_for(size)]
                simulated = simulate(sub.lower(size, "float32", chunks=chunks), topology).time_s
                assert floor <= simulated * (1 + 1e-9), (m, size, chunks)
                if size == 1 << 28:
                    tightest = max(tightest, floor / simulated)
    assert tightest > 0.9  # a bound that prunes, not zero
