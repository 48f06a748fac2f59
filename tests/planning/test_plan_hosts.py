"""plan_hosts: Blink's three-phase allreduce over several hosts."""

import pytest

from jax_blink.planning import PlanError, plan, plan_hosts
from jax_blink.topo import Topology


def test_three_phases_are_one_host_plans_and_the_nic():
    hp = plan_hosts(Topology.multi_host("dgx1-v100", 4, nic_gbps=12.5))
    host = Topology.preset("dgx1-v100")
    assert hp.hosts == tuple(tuple(range(8 * h, 8 * h + 8)) for h in range(4)) and hp.ranks_per_host == 8
    assert hp.reduce_scatter[0].rate_gbps == pytest.approx(plan(host, "reduce_scatter").rate_gbps)
    assert hp.allgather[0].rate_gbps == pytest.approx(plan(host, "allgather").rate_gbps)
    assert hp.reduce_scatter[0].topology.links == host.links  # the NIC is not an in-host switch
    assert all(p is hp.reduce_scatter[0] for p in hp.reduce_scatter)  # equal hosts share one plan
    assert hp.network_gbps == pytest.approx(12.5)
    size = 2**28
    expected = size / (hp.reduce_scatter[0].rate_gbps * 1e9) + 1.5 * size / 12.5e9 \
        + size / (hp.allgather[0].rate_gbps * 1e9)
    assert hp.bandwidth_time_s(size) == pytest.approx(expected)
    assert hp.rate_gbps == pytest.approx(size / expected / 1e9)
    text = hp.summary()
    assert "4 hosts x 8" in text and "1 distinct host plan" in text and "1.5/12.5" in text


def test_1024_gpus_plan_as_one_host():
    hp = plan_hosts(Topology.multi_host("dgx1-v100", 128, nic_gbps=12.5), cache=False)
    assert len(hp.hosts) == 128 and hp.topology.n == 1024
    assert len({id(p) for p in hp.reduce_scatter + hp.allgather}) == 2


def test_several_nics_add_up():
    assert plan_hosts(Topology.multi_host("shm:4", 2, nic_gbps=10, nics=4)).network_gbps == pytest.approx(40)


def test_different_hosts_of_equal_size_get_their_own_plans():
    full = Topology.preset("dgx1-v100")
    a, b = (Topology(4, [l for l in full.subset(r).links if l.kind == "nvlink"]) for r in ([0, 1, 2, 3], [0, 1, 4, 5]))
    both = Topology(8, [(l.u, l.v, l.bandwidth_gbps) for l in a.links]
                    + [(l.u + 4, l.v + 4, l.bandwidth_gbps) for l in b.links]
                    + [(0, 8, 12.5, "net"), (4, 8, 12.5, "net")], ["network"])
    hp = plan_hosts(both)
    assert hp.reduce_scatter[0] is not hp.reduce_scatter[1]
    assert hp.reduce_scatter[0].rate_gbps == pytest.approx(plan(a, "reduce_scatter").rate_gbps)
    assert hp.reduce_scatter[1].rate_gbps == pytest.approx(plan(b, "reduce_scatter").rate_gbps)
    assert hp.reduce_scatter[0].rate_gbps != pytest.approx(hp.reduce_scatter[1].rate_gbps)
    assert hp.network_gbps == pytest.approx(12.5)


@pytest.mark.parametrize("topology, match", [
    (Topology.preset("dgx1-v100"), "is one host"),
    (Topology(5, [(0, 1, 10), (2, 3, 10), (3, 4, 10), (0, 5, 1, "net"), (2, 5, 1, "net")], ["network"]),
     r"different rank counts \[2, 3\]"),
    (Topology.multi_host("shm:1", 3, nic_gbps=1), "one rank each"),
])
def test_plan_hosts_refuses_what_it_cannot_serve(topology, match):
    with pytest.raises(PlanError, match=match):
        plan_hosts(topology)
    with pytest.raises(PlanError, match="takes a Topology"):
        plan_hosts("dgx1-v100")
