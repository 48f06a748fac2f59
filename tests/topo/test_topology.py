"""Topology model: constructors, presets, JSON, nvidia-smi parsing, subsets, errors."""

import json
import math
import os

import numpy as np
import pytest

from jax_blink.topo import Link, Topology, TopologyError, detect, presets

DGX1V_SMI = """\
        GPU0    GPU1    GPU2    GPU3    GPU4    GPU5    GPU6    GPU7    mlx5_0  CPU Affinity    NUMA Affinity
GPU0     X      NV2     NV1     NV1     NV2     SYS     SYS     SYS     PIX     0-19,40-59      0
GPU1    NV2      X      NV1     NV2     SYS     NV1     SYS     SYS     PIX     0-19,40-59      0
GPU2    NV1     NV1      X      NV2     SYS     SYS     NV2     SYS     PHB     0-19,40-59      0
GPU3    NV1     NV2     NV2      X      SYS     SYS     SYS     NV1     PHB     0-19,40-59      0
GPU4    NV2     SYS     SYS     SYS      X      NV2     NV1     NV1     SYS     20-39,60-79     1
GPU5    SYS     NV1     SYS     SYS     NV2      X      NV1     NV2     SYS     20-39,60-79     1
GPU6    SYS     SYS     NV2     SYS     NV1     NV1      X      NV2     SYS     20-39,60-79     1
GPU7    SYS     SYS     SYS     NV1     NV1     NV2     NV2      X      SYS     20-39,60-79     1
mlx5_0  PIX     PIX     PHB     PHB     SYS     SYS     SYS     SYS      X

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NV#  = Connection traversing a bonded set of # NVLinks
"""

PCIE_SMI = """\
        GPU0    GPU1    GPU2    GPU3    CPU Affinity
GPU0     X      PIX     PXB     SYS     0-7
GPU1    PIX      X      PXB     SYS     0-7
GPU2    PXB     PXB      X      SYS     0-7
GPU3    SYS     SYS     SYS      X      8-15
"""


def nvlink_pairs(t):
    return {(l.u, l.v): l.bandwidth_gbps for l in t.links if l.kind == "nvlink"}


def test_parallel_links_add_up_and_links_are_canonical():
    t = Topology.from_links(3, [(1, 0, 25), (0, 1, 25.0, "nvlink"), Link(2, 1, 10, "pcie")])
    assert t.links == (Link(0, 1, 50.0, "nvlink"), Link(1, 2, 10.0, "pcie"))


def test_subset_reindexes_in_given_order_and_keeps_switch_routes():
    t = Topology.preset("dgx1-v100")
    s = t.subset([5, 0])
    assert s.n == 2 and s.name == "dgx1-v100[5,0]"
    assert nvlink_pairs(s) == {}  # GPU0 and GPU5 share no NVLink
    assert s.planning_kinds() == ("pcie",)
    assert not s.unreachable()  # but PCIe switches and the CPUs join them
    assert nvlink_pairs(t.subset([4, 0, 1])) == {(0, 1): 50.0, (1, 2): 50.0}


@pytest.mark.parametrize("ranks, message", [
    ([0, 8], "rank 8 in the subset is out of range"),
    ([-1], "rank -1 in the subset is out of range"),
    ([1, 2, 1], r"rank\(s\) \[1\] appear more than once"),
    ([], "at least one rank"),
])
def test_bad_subset_is_named(ranks, message):
    with pytest.raises(TopologyError, match=message):
        Topology.preset("dgx1-p100").subset(ranks)


@pytest.mark.parametrize("bandwidth", [0, -5, math.nan, math.inf, "fast"])
def test_non_positive_or_non_numeric_bandwidth_is_rejected(bandwidth):
    with pytest.raises(TopologyError, match="link 0-1: bandwidth"):
        Topology.from_links(2, [(0, 1, bandwidth)])


@pytest.mark.parametrize("links, message", [
    ([(0, 2, 10)], "node 2 is out of range"),
    ([(0, 0, 10)], "connects a node to itself"),
    ([(0, 1, 10, "infiniband")], "unknown kind 'infiniband'"),
    ([(0, 1)], r"must be \(u, v, gbps\)"),
])
def test_bad_links_are_named(links, message):
    with pytest.raises(TopologyError, match=message):
        Topology.from_links(2, links)


def test_unknown_preset_lists_valid_names():
    with pytest.raises(TopologyError, match="unknown topology preset 'dgx3'.*dgx1-v100.*shm:N"):
        Topology.preset("dgx3")


@pytest.mark.parametrize("name", ["shm:0", "shm:x", "shm:"])
def test_bad_shm_count(name):
    with pytest.raises(TopologyError, match="positive integer"):
        Topology.preset(name)


@pytest.mark.parametrize("name", [n.replace("N", "5") for n in presets.preset_names()])
def test_presets_round_trip_through_json(name, tmp_path):
    t = Topology.preset(name)
    assert Topology.from_json(t.to_json()) == t
    path = tmp_path / "t.json"
    path.write_text(t.to_json(indent=2))
    assert Topology.from_json(str(path)) == t
    assert not t.unreachable()


def test_dgx1_presets_match_design_reference():
    v, p = Topology.preset("dgx1-v100"), Topology.preset("dgx1-p100")
    assert len(nvlink_pairs(v)) == len(nvlink_pairs(p)) == 16
    assert sum(nvlink_pairs(v).values()) == 600.0  # 24 NVLink2 links x 25 GB/s
    assert set(nvlink_pairs(p).values()) == {20.0}
    assert Topology.preset("shm:3").switches == ("host memory",)


def test_fingerprint_is_stable_and_ignores_the_name():
    a = Topology.from_links(2, [(0, 1, 10)], name="a")
    b = Topology.from_links(2, [(1, 0, 10)], name="b")
    c = Topology.from_links(2, [(0, 1, 11)])
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    assert len(a.fingerprint()) == 64 and int(a.fingerprint(), 16) >= 0


@pytest.mark.parametrize("text, message", [
    ("{not json", "malformed topology JSON"),
    ('{"format": "other"}', "not a jax_blink topology"),
    ('{"format": "jax_blink.topology", "version": 1}', "missing key 'nranks'"),
    ('{"format": "jax_blink.topology", "version": 9, "nranks": 2, "links": []}', "version 9"),
    ('{"format": "jax_blink.topology", "version": 1, "nranks": 2, "links": 3}', "'links' must be a list"),
    ('{"format": "jax_blink.topology", "version": 1, "nranks": 0, "links": []}', "positive integer"),
    ("/no/such/file.json", "cannot read topology file"),
])
def test_malformed_json_is_named(text, message):
    with pytest.raises(TopologyError, match=message):
        Topology.from_json(text)


def test_nvidia_smi_dgx1_matrix_gives_the_dgx1_nvlinks():
    t = Topology.from_nvidia_smi(DGX1V_SMI)
    assert t.n == 8
    assert nvlink_pairs(t) == nvlink_pairs(Topology.preset("dgx1-v100"))
    assert t.planning_kinds("fast") == ("nvlink",) and t.planning_kinds() == ("nvlink", "pcie")
    assert not t.subset([0, 5]).unreachable()  # the PCIe/SYS tree joins them


def test_nvidia_smi_pcie_levels_become_switches():
    t = Topology.from_nvidia_smi(PCIE_SMI, pcie_gbps=12.0, sys_gbps=30.0)
    assert t.switches == ("pix0", "pxb1", "sys2")
    assert {(l.u, l.v, l.bandwidth_gbps) for l in t.links} == {
        (0, 4, 12.0), (1, 4, 12.0), (2, 5, 12.0), (4, 5, 12.0), (3, 6, 30.0), (5, 6, 30.0)}


@pytest.mark.parametrize("text, message", [
    ("nothing here", "no GPU matrix"),
    (PCIE_SMI.replace("PXB      X", "FOO      X"), "cell GPU2/GPU1 is 'FOO'; expected X, NV#"),
    (PCIE_SMI.replace("GPU3    SYS     SYS     SYS      X      8-15", "GPU3    SYS     PIX     SYS      X      8-15"),
     "not symmetric"),
    ("\n".join(PCIE_SMI.splitlines()[:-1]), r"lacks rows for GPU\(s\) \[3\]"),
    (PCIE_SMI.replace("GPU3    SYS     SYS     SYS      X      8-15", "GPU3    SYS"), "row GPU3 has 1 cells"),
])
def test_malformed_nvidia_smi_is_named(text, message):
    with pytest.raises(TopologyError, match=message):
        Topology.from_nvidia_smi(text)


# Recorded on a one-GPU H100 machine: the header is underlined with ANSI escapes.
H100_ONE_GPU_SMI = ("\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
                    "GPU0\t X \t0-15\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n")


def test_nvidia_smi_with_ansi_escapes_and_one_gpu():
    t = Topology.from_nvidia_smi(H100_ONE_GPU_SMI)
    assert t.n == 1 and t.links == ()


def test_detect_without_nvidia_smi_returns_none(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert detect.detect() is None


def test_to_json_is_plain_data():
    data = json.loads(Topology.preset("shm:2").to_json())
    assert data == {"format": "jax_blink.topology", "version": 1, "name": "shm:2", "nranks": 2,
                    "switches": ["host memory"], "links": [[0, 2, 10.0, "shm"], [1, 2, 10.0, "shm"]]}


# ---------------------------------------------- the allocation of a job
DGX1_GPU_TABLE = """\
0, 00000000:06:00.0, GPU-0b1c
1, 00000000:07:00.0, GPU-1d2e
2, 00000000:0A:00.0, GPU-2f30
3, 00000000:0B:00.0, GPU-3a41
4, 00000000:85:00.0, GPU-4b52
5, 00000000:86:00.0, GPU-5c63
6, 00000000:89:00.0, GPU-6d74
7, 00000000:8A:00.0, GPU-7e85
"""


@pytest.fixture
def fake_smi(monkeypatch):
    """nvidia-smi answering with the recorded DGX-1 outputs."""
    def run(args, timeout_s):
        if args[0] == "nvlink":
            return None  # no NVLink state (tests/topo/test_link_state.py reads it)
        return DGX1V_SMI if args[0] == "topo" else DGX1_GPU_TABLE
    monkeypatch.setattr(detect, "_nvidia_smi", run)


def test_gpu_table_parses_and_normalizes_bus_ids():
    rows = detect.parse_gpu_table(DGX1_GPU_TABLE)
    assert rows[2] == (2, "0000:0a:00.0", "GPU-2f30")
    assert detect.normalize_bus_id("0000:8A:00.0") == detect.normalize_bus_id("00000000:8a:00.0")
    with pytest.raises(TopologyError, match="not a PCI bus id"):
        detect.normalize_bus_id("GPU-1")
    with pytest.raises(TopologyError, match="unexpected nvidia-smi"):
        detect.parse_gpu_table("index, pci.bus_id, uuid\n")


@pytest.mark.parametrize("how", ["bus_ids", "visible_indices", "visible_uuids"])
def test_partial_allocation_is_the_subset_of_the_machine(fake_smi, how):
    """CUDA_VISIBLE_DEVICES=5,0,1 (or the same GPUs by bus id or UUID): rank i
    is CUDA device i, which is machine GPU 5, 0, 1; nvidia-smi still lists
    all 8 GPUs."""
    kw = {"bus_ids": dict(bus_ids=["0000:86:00.0", "0000:06:00.0", "0000:07:00.0"]),
          "visible_indices": dict(visible="5,0,1"),
          "visible_uuids": dict(visible="GPU-5c63,GPU-0b1c,GPU-1d2e")}[how]
    t = detect.detect_allocation([0, 1, 2], **kw)
    want = Topology.from_nvidia_smi(DGX1V_SMI).subset([5, 0, 1])
    assert t.n == 3 and t.name == "detected[5,0,1]"
    # GPU 5-1 is one NVLink, 0-1 two, 5-0 none (they meet through PCIe and QPI)
    assert nvlink_pairs(t) == nvlink_pairs(want) == {(0, 2): 25.0, (1, 2): 50.0}
    assert t.links == want.links


def test_bus_ids_win_over_visible_devices(fake_smi):
    t = detect.detect_allocation([0, 1], bus_ids=["0000:0b:00.0", "0000:8a:00.0"], visible="0,1")
    assert t.name == "detected[3,7]"


def test_unknown_devices_are_named(fake_smi):
    with pytest.raises(TopologyError, match="PCI 0000:99:00.0"):
        detect.detect_allocation([0], bus_ids=["0000:99:00.0"])
    with pytest.raises(TopologyError, match="no entry in CUDA_VISIBLE_DEVICES"):
        detect.detect_allocation([0, 1], visible="3")
    with pytest.raises(TopologyError, match="matches 0 GPUs"):
        detect.detect_allocation([0], visible="GPU-ffff")


def test_no_nvidia_smi_detects_nothing(monkeypatch):
    monkeypatch.setattr(detect, "_nvidia_smi", lambda args, timeout_s: None)
    assert detect.detect() is None
    assert detect.detect_allocation([0, 1]) is None


# ---------------------------------------------------------- values taken on faith
SHM2_JSON = {"format": "jax_blink.topology", "version": 1, "nranks": 2,
             "links": [[0, 2, 10, "shm"], [1, 2, 10, "shm"]], "switches": ["host memory"]}


@pytest.mark.parametrize("build, message", [
    (lambda: Topology.from_links(2, [(0, 1, "10")]), r"bandwidth '10' is not a number; give GB/s"),
    (lambda: Topology.from_links(2, [(0, 1, True)]), r"bandwidth True is not a number"),
    (lambda: Topology.from_links(2, [(0, 1, 1e-300)]), r"bandwidth 1e-300 is out of range: .* between 1e-06 and 1e\+06"),
    (lambda: Topology.from_links(2, [(0, 1, 10 ** 400)]), r"bandwidth 1000.* is out of range"),
    (lambda: Topology.from_links(2, [(0, 1, 6e5), (1, 0, 6e5)]), r"nvlink links 0-1 add up to 1.2e\+06 GB/s"),
    (lambda: Topology.from_json({**SHM2_JSON, "switches": "abc"}), r"switches must be a list .* got 'abc'"),
    (lambda: Topology.from_json({**SHM2_JSON, "switches": 5}), r"switches must be a list .* got 5"),
    (lambda: Topology.from_links(2, [], switches=[1]), r"switch name 1 is not a string"),
    (lambda: Topology.from_json({**SHM2_JSON, "name": ["x"]}), r"name must be a string, got \['x'\]"),
    (lambda: Topology.from_links(2, None), r"links must be an iterable of links .* got None"),
    (lambda: Topology.from_links(2, "01"), r"links must be an iterable of links .* got '01'"),
    (lambda: Topology.from_links(2, ["abc"]), r"a link must be a Link or a list/tuple .* got 'abc'"),
    (lambda: Topology.from_links(2, [{"u": 0, "v": 1}]), r"a link must be .* got \{'u': 0"),
    (lambda: Topology.from_links(2, [(0, 1, 10, 5)]), r"unknown kind 5; expected one of"),
    (lambda: Topology.from_links(2, [(0.0, 1, 10)]), r"node 0.0 is out of range; nodes are integers"),
    (lambda: Topology.from_links(10 ** 6, []), r"positive integer of at most 65536, got 1000000"),
    (lambda: Topology.from_json({**SHM2_JSON, "nranks": "2"}), r"positive integer of at most 65536, got '2'"),
    (lambda: Topology.from_json("[1, 2]"), r"not a jax_blink topology: expected a JSON object .* got an array"),
    (lambda: Topology.from_json('"shm:2"'), r"cannot read topology file"),
    (lambda: Topology.from_json("[" * 100000 + "]" * 100000), r"malformed topology JSON: nested too deeply"),
    (lambda: Topology.from_json(b"\xff\xfe{}"), r"malformed topology JSON: not UTF-8 text"),
    (lambda: Topology.from_json(None), r"cannot read a topology from NoneType None; expected a dict, JSON"),
    (lambda: Topology.from_json('{"format": "jax_blink.topology", "version": 1, "nranks": ' + "9" * 5000 + "}"),
     r"malformed topology JSON: Exceeds the limit"),
    (lambda: Topology.from_json({**SHM2_JSON, "version": True}), r"topology format version True"),
    (lambda: Topology.preset(None), r"preset name must be a string, got None; valid names: .*shm:N"),
    (lambda: Topology.preset("shm:100000000"), r"shm:N takes at most 65535 devices"),
    (lambda: Topology.preset("shm:\u00b2"), r"N in shm:N must be a positive integer"),
    (lambda: Topology.preset("shm:4").subset(None), r"a subset is a sequence of rank numbers, got None"),
])
def test_values_not_allowed_are_named(build, message):
    with pytest.raises(TopologyError, match=message):
        build()


def test_bandwidth_limits_are_inclusive():
    from jax_blink.topo.limits import MAX_BANDWIDTH_GBPS, MIN_BANDWIDTH_GBPS
    t = Topology.from_links(3, [(0, 1, MIN_BANDWIDTH_GBPS), (1, 2, MAX_BANDWIDTH_GBPS)])
    assert [l.bandwidth_gbps for l in t.links] == [MIN_BANDWIDTH_GBPS, MAX_BANDWIDTH_GBPS]
    assert Topology.from_links(2, [(0, 1, np.float32(2.5)), (0, 1, np.int64(1))]).links[0].bandwidth_gbps == 3.5


def test_preset_names_ignore_letter_case():
    assert Topology.preset("DGX1-V100") == Topology.preset("dgx1-v100")
    assert Topology.preset(" Shm:4 ").name == "shm:4"
    with pytest.raises(TopologyError, match="unknown topology preset 'DGX3'; valid names .*dgx1-v100"):
        Topology.preset("DGX3")


@pytest.mark.parametrize("make", ["fifo", "directory", "device", "binary"])
def test_a_path_that_is_no_topology_file_is_refused_without_blocking(make, tmp_path):
    path = tmp_path / "t.json"
    if make == "fifo":
        os.mkfifo(path)  # opening it for reading would block until a writer came
    elif make == "directory":
        path.mkdir()
    elif make == "device":
        path = "/dev/zero"  # reading it would never end
    else:
        path.write_bytes(bytes(range(256)))
    with pytest.raises(TopologyError, match="not a regular file|is not UTF-8 text"):
        Topology.from_json(str(path))
