"""The one link graph: arcs, capacities and every route data or plans take."""

import numpy as np
import pytest

from jax_blink.topo import LinkGraph, Topology, TopologyError


def test_arcs_are_both_directions_of_each_link_with_parallel_links_summed():
    topo = Topology.from_links(3, [(0, 1, 10.0), (1, 0, 5.0), (1, 2, 1.0, "pcie"), (1, 2, 2.0)])
    g = topo.link_graph(topo.kinds())
    assert g.arcs == [(0, 1), (1, 0), (1, 2), (2, 1)]
    assert g.capacity_gbps.tolist() == [15.0, 15.0, 3.0, 3.0]
    assert g.arc_kind == ["nvlink", "nvlink", "nvlink", "nvlink"]  # 1-2: the first of its sorted links
    assert [g.arcs[g.reverse[a]] for a in range(4)] == [(1, 0), (0, 1), (2, 1), (1, 2)]
    assert topo.link_graph(("pcie",)).capacity_gbps.tolist() == [1.0, 1.0]


def test_the_planning_graph_keeps_only_the_planning_kinds():
    topo = Topology.preset("dgx1-v100")
    assert topo.link_graph().kinds == ("nvlink", "pcie")  # every link, by default
    fast = topo.link_graph(topo.planning_kinds("fast"))
    assert fast.kinds == ("nvlink",)  # NVLink joins all eight GPUs
    assert not fast.has_switches and topo.link_graph().has_switches
    assert topo.subset([0, 1, 6]).planning_kinds("fast") == ("nvlink", "pcie")  # NVLink does not reach 6


def test_routes_prefer_direct_links_and_never_cross_ranks():
    topo = Topology.preset("dgx1-v100")
    graph = topo.link_graph(topo.kinds())
    assert len(graph.route(0, 1)) == 1 and graph.route_bandwidth_gbps(0, 1) == 50.0
    path = [graph.arcs[a] for a in graph.route(0, 5)]  # no NVLink 0-5: PCIe and QPI
    assert all(v >= topo.n for _, v in path[:-1])
    assert graph.route_bandwidth_gbps(0, 5) == 16.0
    assert graph.path(0, 5) == (0, 8, 12, 13, 10, 5)


def test_default_routes_take_the_widest_of_the_fewest_hops():
    # 0 and 1 reach each other through switch 2 (narrow) or switch 3 (wide), never through rank 4
    topo = Topology.from_links(5, [(0, 5, 1.0), (5, 1, 1.0), (0, 6, 8.0), (6, 1, 8.0), (0, 4, 99.0), (4, 1, 99.0)],
                               ["narrow", "wide"])
    g = topo.link_graph(topo.kinds())
    assert g.path(0, 1) == (0, 6, 1) and g.route_bandwidth_gbps(0, 1) == 8.0
    assert g.route(0, 1) is g.route(0, 1)  # computed once


def test_ranks_joined_by_nothing_have_no_route():
    g = Topology.from_links(4, [(0, 1, 1.0), (2, 3, 1.0)]).link_graph()
    with pytest.raises(TopologyError, match="0 and 3 are joined by no link"):
        g.route(0, 3)
    with pytest.raises(TopologyError, match="uses 1-2, which has no nvlink link"):
        g.arcs_of_path((0, 1, 2))


def test_priced_routes_are_the_cheapest_and_break_ties_by_hops():
    topo = Topology.from_links(3, [(0, 1, 1.0), (1, 2, 1.0), (0, 3, 1.0), (3, 2, 1.0), (0, 2, 1.0)], ["sw"])
    g = LinkGraph(topo, topo.kinds())
    price = np.ones(len(g.arcs))
    cost, arcs = g.routes(price)[0, 2]
    assert (cost, g.path_of(arcs)) == (1.0, (0, 2))
    price[g.index[0, 2]] = 5.0  # the direct arc is dearer than the switch path; rank 1 never forwards
    cost, arcs = g.routes(price)[0, 2]
    assert (cost, g.path_of(arcs)) == (2.0, (0, 3, 2))
