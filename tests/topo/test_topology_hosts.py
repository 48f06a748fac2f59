"""Several hosts: Topology.multi_host, host_ranks, network, and routes that stay inside a host."""

import pytest

from jax_blink.topo import Topology, TopologyError


def test_multi_host_copies_the_host_and_adds_nics_and_a_switch():
    host = Topology.preset("dgx1-v100")
    t = Topology.multi_host(host, 3, nic_gbps=12.5)
    assert t.n == 24 and t.name == "3xdgx1-v100"
    assert len(t.switches) == 3 * len(host.switches) + 3 + 1 and t.switches[-1] == "network"
    assert t.switches[:2] == ("host0/pcie-switch0", "host0/pcie-switch1")
    assert t.host_ranks() == tuple(tuple(range(8 * h, 8 * h + 8)) for h in range(3))
    for h in range(3):  # every host is the preset again, links and all
        inside = Topology(t.n, [l for l in t.links if l.kind != "net"], t.switches)
        sub = inside.subset(range(8 * h, 8 * h + 8))
        assert sub.links == host.links
    net = [l for l in t.links if l.kind == "net"]
    assert len(net) == 3 * (8 + 1)  # every GPU to its NIC, every NIC to the switch
    assert {l.bandwidth_gbps for l in net} == {12.5}


def test_nics_split_the_gpus_into_contiguous_runs():
    t = Topology.multi_host("shm:4", 2, nic_gbps=25, nics=2)
    nic_of = {}
    for l in t.links:
        if l.kind == "net" and l.u < t.n:
            nic_of[l.u] = t.switches[l.v - t.n]
    assert nic_of == {0: "host0/nic0", 1: "host0/nic0", 2: "host0/nic1", 3: "host0/nic1",
                      4: "host1/nic0", 5: "host1/nic0", 6: "host1/nic1", 7: "host1/nic1"}


def test_network_contracts_each_host():
    t = Topology.multi_host("dgx1-v100", 4, nic_gbps=12.5, nics=2)
    net = t.network()
    assert net.n == 4 and net.switches[-1] == "network" and len(net.switches) == 4 * 2 + 1
    to_switch = [l for l in net.links if l.v == net.num_nodes - 1]
    assert len(to_switch) == 8 and all(l.bandwidth_gbps == 12.5 for l in to_switch)
    host_to_nic = [l for l in net.links if l.u < 4]
    assert len(host_to_nic) == 8 and all(l.bandwidth_gbps == 4 * 12.5 for l in host_to_nic)  # 4 GPUs per NIC
    with pytest.raises(TopologyError, match="one host"):
        Topology.preset("dgx1-v100").network()


def test_a_preset_is_one_host_and_json_keeps_the_hosts():
    assert Topology.preset("dgx1-p100").host_ranks() == (tuple(range(8)),)
    t = Topology.multi_host("dgx-a100", 2, nic_gbps=25)
    again = Topology.from_json(t.to_json())
    assert again == t and again.host_ranks() == ((0, 1, 2, 3, 4, 5, 6, 7), tuple(range(8, 16)))


def test_default_routes_use_the_network_only_between_hosts():
    t = Topology.multi_host("dgx1-v100", 2, nic_gbps=12.5)
    g = t.link_graph()
    names = lambda path: [t.switches[x - t.n] if x >= t.n else x for x in path]
    # GPUs 0 and 5 share no NVLink: PCIe and QPI, not the 2-hop detour through the host's NIC
    assert names(g.path(0, 5)) == [0, "host0/pcie-switch0", "host0/cpu0", "host0/cpu1", "host0/pcie-switch2", 5]
    assert names(g.path(3, 13)) == [3, "host0/nic0", "network", "host1/nic0", 13]
    assert g.path(0, 1) == (0, 1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(hosts=0, nic_gbps=12.5), "number of hosts"),
    (dict(hosts=2.0, nic_gbps=12.5), "number of hosts"),
    (dict(hosts=2, nic_gbps=0), "NIC bandwidth"),
    (dict(hosts=2, nic_gbps="100Gb"), "NIC bandwidth"),
    (dict(hosts=2, nic_gbps=12.5, nics=0), "NICs per host"),
    (dict(hosts=2, nic_gbps=12.5, nics=5), "more than the host's 4 ranks"),
    (dict(hosts=20000, nic_gbps=12.5), "more than the 65536"),
])
def test_multi_host_refuses_bad_values(kwargs, match):
    with pytest.raises(TopologyError, match=match):
        Topology.multi_host("shm:4", **kwargs)


def test_multi_host_refuses_a_host_that_has_a_network():
    with pytest.raises(TopologyError, match="already has network links"):
        Topology.multi_host(Topology.multi_host("shm:2", 2, nic_gbps=1), 2, nic_gbps=1)
    with pytest.raises(TopologyError, match="unknown topology preset"):
        Topology.multi_host("dgx9", 2, nic_gbps=1)
