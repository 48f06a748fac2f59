"""Link state: Topology.without/degraded, nvidia-smi nvlink -s/-R parsing, detection, fingerprints."""

import json
from pathlib import Path

import pytest

from jax_blink.topo import Topology, TopologyError
from jax_blink.topo.detect import apply_nvlink_state, parse_gpu_table
from jax_blink.topo.nvidia_smi import nvlink_pair_state, parse_nvlink_remote, parse_nvlink_status

FIXTURES = Path(__file__).parent / "fixtures"


def _read(name):
    return (FIXTURES / name).read_text()


def _detected(status_name, remote_name):
    topology = Topology.from_nvidia_smi(_read("topo_m_dgx1v.txt"), name="detected")
    table = parse_gpu_table(_read("gpu_table_dgx1v.csv"))
    return topology, apply_nvlink_state(topology, _read(status_name), _read(remote_name), table)


def _nvlink(topology):
    return {(l.u, l.v): l.bandwidth_gbps for l in topology.links if l.kind == "nvlink"}


# ------------------------------------------------------------ without / degraded
def test_without_removes_every_link_of_the_pair():
    t = Topology.preset("dgx1-v100")
    assert _nvlink(t)[(0, 1)] == 50.0  # two NVLinks
    d = t.without([(1, 0), (2, 3)])
    assert (0, 1) not in _nvlink(d) and (2, 3) not in _nvlink(d)
    assert {k: v for k, v in _nvlink(t).items() if k not in {(0, 1), (2, 3)}} == _nvlink(d)
    assert len(d.links) == len(t.links) - 2


def test_degraded_scales_both_directions():
    t = Topology.from_links(3, [(0, 1, 20.0, "pcie", 10.0), (1, 2, 25.0)])
    d = t.degraded({(1, 0): 0.5})
    link = next(l for l in d.links if (l.u, l.v) == (0, 1))
    assert (link.forward_gbps, link.backward_gbps) == (10.0, 5.0)
    assert _nvlink(d)[(1, 2)] == 25.0


@pytest.mark.parametrize("call, match", [
    (lambda t: t.without([(0, 99)]), "out of range"),
    (lambda t: t.without([(0, 5)]), "no link between 0 and 5"),
    (lambda t: t.without("01"), "node pairs"),
    (lambda t: t.without([(0,)]), "not a node pair"),
    (lambda t: t.degraded({(0, 1): 0.0}), r"not in \(0, 1\]"),
    (lambda t: t.degraded({(0, 1): 1.5}), r"not in \(0, 1\]"),
    (lambda t: t.degraded({(0, 1): True}), r"not in \(0, 1\]"),
    (lambda t: t.degraded({(0, 1): 0.5, (1, 0): 0.5}), "named twice"),
    (lambda t: t.degraded([(0, 1)]), "mapping"),
])
def test_bad_link_state_input_is_named(call, match):
    with pytest.raises(TopologyError, match=match):
        call(Topology.preset("dgx1-v100"))


def test_damaged_json_round_trips_and_changes_the_fingerprint():
    t = Topology.preset("dgx1-v100")
    down, slow = t.without([(0, 1)]), t.degraded({(0, 1): 0.5})
    fingerprints = {t.fingerprint(), down.fingerprint(), slow.fingerprint(),
                    t.degraded({(0, 1): 0.25}).fingerprint()}
    assert len(fingerprints) == 4
    for damaged in (down, slow):
        back = Topology.from_json(damaged.to_json())
        assert back == damaged and back.fingerprint() == damaged.fingerprint()
        assert json.loads(damaged.to_json())["links"] == json.loads(back.to_json())["links"]


def test_plan_cache_key_follows_link_state():
    from jax_blink.planning.cache import cache_key
    t = Topology.preset("dgx1-v100")
    options = ("allreduce", 0, None, 1e-6, "all")
    keys = [json.dumps(cache_key(x, options), sort_keys=True)
            for x in (t, t.without([(0, 1)]), t.degraded({(0, 1): 0.5}))]
    assert keys[0] != keys[1] and keys[0] != keys[2] and keys[1] != keys[2]


# -------------------------------------------------------------- nvidia-smi nvlink
def test_parse_nvlink_status_fixtures():
    healthy = parse_nvlink_status(_read("nvlink_s_dgx1v_healthy.txt"))
    assert sorted(healthy) == list(range(8))
    assert all(len(links) == 6 and set(links.values()) == {25.781} for links in healthy.values())
    inactive = parse_nvlink_status(_read("nvlink_s_dgx1v_one_inactive.txt"))
    assert [(g, l) for g, links in inactive.items() for l, s in links.items() if s is None] == [(0, 2), (2, 0)]
    reduced = parse_nvlink_status(_read("nvlink_s_dgx1v_reduced.txt"))
    assert sorted((g, l) for g, links in reduced.items() for l, s in links.items() if s == 12.891) == [(2, 4), (6, 0)]


def test_parse_nvlink_remote_skips_unfollowed_links():
    remote = parse_nvlink_remote(_read("nvlink_r_dgx1v_one_inactive.txt"))
    assert 2 not in remote[0] and remote[0][3] == "00000000:0B:00.0"


@pytest.mark.parametrize("text, match", [
    ("Link 0: 25 GB/s\n", "before any 'GPU <k>:'"),
    ("GPU 0: X\n\t Link 0: fast\n", "expected '<speed> GB/s' or '<inactive>'"),
    ("GPU 0: X\n\t Link 0: 25 GB/s\n\t Link 0: 25 GB/s\n", "link 0 twice"),
    ("GPU 0: X\n\t garbage\n", "neither"),
    ("", "no 'GPU <k>:' lines"),
])
def test_parse_nvlink_status_errors(text, match):
    with pytest.raises(TopologyError, match=match):
        parse_nvlink_status(text)


def test_detection_healthy_keeps_the_matrix_topology():
    topology, detected = _detected("nvlink_s_dgx1v_healthy.txt", "nvlink_r_dgx1v_healthy.txt")
    assert detected is topology


def test_detection_marks_an_inactive_link_down():
    topology, detected = _detected("nvlink_s_dgx1v_one_inactive.txt", "nvlink_r_dgx1v_one_inactive.txt")
    assert (0, 2) in _nvlink(topology) and (0, 2) not in _nvlink(detected)
    assert detected.links == topology.without([(0, 2)]).links
    assert "1 link(s) down" in detected.name


def test_detection_scales_a_slow_link():
    topology, detected = _detected("nvlink_s_dgx1v_reduced.txt", "nvlink_r_dgx1v_healthy.txt")
    # pair 2-6 has two links; one runs at half speed: 0.75 of its rated bandwidth
    assert _nvlink(topology)[(2, 6)] == 50.0
    assert _nvlink(detected)[(2, 6)] == pytest.approx(50.0 * (25.781 + 12.891) / (2 * 25.781))
    assert {k: v for k, v in _nvlink(detected).items() if k != (2, 6)} == \
        {k: v for k, v in _nvlink(topology).items() if k != (2, 6)}


def test_pair_state_all_inactive_is_down():
    status = {0: {0: None}, 1: {0: None}}
    assert nvlink_pair_state(status, {}, {}, {(0, 1): 1}) == ([(0, 1)], {})


def test_detect_reads_nvlink_state(monkeypatch):
    from jax_blink.topo import detect as detect_module
    outputs = {"topo": _read("topo_m_dgx1v.txt"), "-s": _read("nvlink_s_dgx1v_one_inactive.txt"),
               "-R": _read("nvlink_r_dgx1v_one_inactive.txt")}

    def run(args, timeout_s):
        if args[0] in ("topo", "nvlink"):
            return outputs[args[0] if args[0] == "topo" else args[1]]
        return _read("gpu_table_dgx1v.csv")
    monkeypatch.setattr(detect_module, "_nvidia_smi", run)
    detected = detect_module.detect()
    assert (0, 2) not in _nvlink(detected) and (0, 1) in _nvlink(detected)
    allocation = detect_module.detect_allocation([0, 1, 2], visible="0,2,3")
    assert (0, 1) not in _nvlink(allocation)  # GPUs 0 and 2 are ranks 0 and 1: their only NVLink is down
