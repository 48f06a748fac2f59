"""Plan cache: a disk entry is used only if it answers the request and holds up.

Every other entry (tampered, corrupt, truncated, foreign, of another version
or for other options, or a FIFO in its place) is planned afresh and
rewritten; an entry or directory that cannot be written only costs planning
time, with a warning.
"""

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from jax_blink.planning import Plan, PlanError, cache, clear_memory_cache, plan
from jax_blink.topo import Topology
from numpy_executor import numpy_execute

SHM8 = Topology.preset("shm:8")


def key_of(topology, collective="allreduce", root=None, max_trees=None, tolerance=0.0, links="all"):
    return cache.cache_key(topology, (collective, root, max_trees, tolerance, links))


def entry_of(topology, **options):
    """The path and JSON object of the entry that plan(topology, **options) wrote."""
    path = cache.entry_path(key_of(topology, **options))
    return path, json.loads(path.read_text())


def plan_afresh_process(topology, **options):
    """plan() as a new process would run it: with an empty process cache."""
    clear_memory_cache()
    return plan(topology, **options)


def assert_sums(p):
    """The plan lowered and run on numpy computes the allreduce."""
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(1000) for _ in range(p.topology.n)]
    out = numpy_execute(p.lower(4000, "float32"), inputs)
    for x in out:
        np.testing.assert_allclose(x, sum(inputs), rtol=1e-12)


# ------------------------------------------------------------ honest entries
@pytest.mark.parametrize("topology, options", [
    (Topology.preset("dgx1-v100"), {}),
    (Topology.preset("dgx1-v100"), dict(collective="broadcast", root=3)),
    (Topology.preset("dgx1-p100").subset([0, 1, 5]), dict(collective="reduce", root=2)),
    (Topology.preset("dgx1-v100").subset([0, 5]), {}),  # PCIe switches only
    (SHM8, {}),
    (Topology.preset("dgx2"), {}),
    (Topology.preset("dgx1-v100"), dict(max_trees=2)),
    (Topology.preset("dgx1-v100"), dict(tolerance=0.2)),
], ids=["dgx1v", "dgx1v-bcast", "p100-reduce", "pcie-pair", "shm8", "dgx2", "max-trees", "tolerance"])
def test_honest_entries_are_read_back_not_replanned(topology, options, caplog):
    first = plan(topology, **options)
    with caplog.at_level(logging.WARNING, logger="jax_blink"):
        again = plan_afresh_process(Topology.from_json(topology.to_json()), **options)
    assert not caplog.records
    assert again == first and again.plan_seconds == first.plan_seconds  # read, not planned


# ---------------------------------------------------- tampered or foreign entries
def _broadcast_plan_json(path, entry, t):  # the reproducer
    path.write_text(plan(t, "broadcast", root=0, cache=False).to_json())


def _broadcast_plan_in_entry(path, entry, t):
    entry["plan"] = plan(t, "broadcast", root=0, cache=False).to_dict()
    path.write_text(json.dumps(entry))


def _one_tree_plan_in_entry(path, entry, t):
    entry["plan"] = plan(t, max_trees=1, cache=False).to_dict()
    path.write_text(json.dumps(entry))


def _entry_for_max_trees_1(path, entry, t):
    plan(t, max_trees=1)
    other, _ = entry_of(t, max_trees=1)
    path.write_text(other.read_text())


def _entry_for_other_tolerance(path, entry, t):
    entry["key"]["tolerance"] = 0.5
    path.write_text(json.dumps(entry))


def _trees_dropped_rate_and_bound_edited(path, entry, t):
    p = entry["plan"]
    p["family"], p["trees"] = "tree", p["trees"][:1]
    p["rate_gbps"] = p["bound_gbps"] = p["trees"][0]["weight"]
    path.write_text(json.dumps(entry))


def _trees_dropped_and_certificate_forged(path, entry, t):
    _trees_dropped_rate_and_bound_edited(path, entry, t)
    entry = json.loads(path.read_text())
    entry["certificate"] = [[1.0] * len(y) for y in entry["certificate"]]
    path.write_text(json.dumps(entry))


def _weights_scaled_over_capacity(path, entry, t):
    for tree in entry["plan"]["trees"]:
        tree["weight"] *= 2
    entry["plan"]["rate_gbps"] *= 2
    entry["plan"]["bound_gbps"] *= 2
    path.write_text(json.dumps(entry))


def _other_topology(path, entry, t):
    plan(Topology.preset("shm:4"))
    other, _ = entry_of(Topology.preset("shm:4"))
    path.write_text(other.read_text())


def _older_version(path, entry, t):
    entry["version"] = entry["key"]["cache_version"] = cache.CACHE_VERSION - 1
    path.write_text(json.dumps(entry))


def _newer_version(path, entry, t):
    entry["version"] = 99
    path.write_text(json.dumps(entry))


def _truncated(path, entry, t):
    text = path.read_text()
    path.write_text(text[: len(text) // 2])


def _corrupt_text(path, entry, t):
    path.write_text("{corrupt")


def _binary(path, entry, t):
    path.write_bytes(bytes(range(256)) * 4)


def _empty(path, entry, t):
    path.write_text("")


def _topology_json(path, entry, t):
    path.write_text(t.to_json())


def _json_array(path, entry, t):
    path.write_text("[1, 2]")


def _deeply_nested(path, entry, t):
    path.write_text("[" * 200000 + "]" * 200000)


def _plan_as_string(path, entry, t):
    entry["plan"] = "/etc/passwd"
    path.write_text(json.dumps(entry))


def _certificate_missing(path, entry, t):
    del entry["certificate"]
    path.write_text(json.dumps(entry))


def _certificate_not_numbers(path, entry, t):
    entry["certificate"] = [["x"] * len(y) for y in entry["certificate"]]
    path.write_text(json.dumps(entry))


def _fifo(path, entry, t):
    path.unlink()
    os.mkfifo(path)


def _symlink_to_device(path, entry, t):
    path.unlink()
    path.symlink_to("/dev/zero")


TAMPERING = [_broadcast_plan_json, _broadcast_plan_in_entry, _one_tree_plan_in_entry, _entry_for_max_trees_1,
             _entry_for_other_tolerance, _trees_dropped_rate_and_bound_edited,
             _trees_dropped_and_certificate_forged, _weights_scaled_over_capacity, _other_topology,
             _older_version, _newer_version, _truncated, _corrupt_text, _binary, _empty, _topology_json,
             _json_array, _deeply_nested, _plan_as_string, _certificate_missing, _certificate_not_numbers,
             _fifo, _symlink_to_device]


@pytest.mark.parametrize("tamper", TAMPERING, ids=[f.__name__.strip("_") for f in TAMPERING])
def test_a_bad_entry_is_replanned_and_rewritten(tamper, caplog):
    good = plan(SHM8)
    path, entry = entry_of(SHM8)
    tamper(path, entry, SHM8)
    result = {}
    with caplog.at_level(logging.WARNING, logger="jax_blink"):
        worker = threading.Thread(target=lambda: result.update(p=plan_afresh_process(SHM8)), daemon=True)
        worker.start()
        worker.join(timeout=60)  # a FIFO must never block plan()
    assert not worker.is_alive(), "plan() blocked on the cache entry"
    again = result["p"]
    assert again.collective == "allreduce" and again.rate_gbps == pytest.approx(good.bound_gbps, rel=1e-9)
    assert_sums(again)
    assert any("ignoring" in r.getMessage() for r in caplog.records)
    assert cache.check_entry(path.read_text(), key_of(SHM8)) == again  # rewritten, and now used
    assert not [f for f in path.parent.iterdir() if f.name.startswith(".plan-")]  # no temporary files left


def test_check_entry_names_what_is_wrong():
    plan(SHM8)
    _, entry = entry_of(SHM8)
    with pytest.raises(PlanError, match=r"other options \(max_trees differ\)"):
        cache.check_entry(entry, key_of(SHM8, max_trees=3))
    _trees_dropped_rate_and_bound_edited(cache.entry_path(key_of(SHM8)), entry, SHM8)
    with pytest.raises(PlanError, match="is not the .* GB/s its certificate proves"):
        cache.check_entry(cache.entry_path(key_of(SHM8)).read_text(), key_of(SHM8))


def test_bad_entries_of_a_broadcast_are_caught_too():
    t = Topology.preset("dgx1-v100")
    plan(t, "broadcast", root=2)
    path, entry = entry_of(t, collective="broadcast", root=2)
    entry["plan"]["trees"] = entry["plan"]["trees"][:1]
    entry["plan"]["rate_gbps"] = entry["plan"]["bound_gbps"] = entry["plan"]["trees"][0]["weight"]
    path.write_text(json.dumps(entry))
    again = plan_afresh_process(t, collective="broadcast", root=2)
    assert again.rate_gbps == pytest.approx(166.0, rel=1e-9)  # NVLink 150 + PCIe 16


# ------------------------------------------------------------- unwritable cache
def test_a_read_only_entry_is_replanned_but_not_rewritten(caplog):
    plan(SHM8)
    path, _ = entry_of(SHM8)
    path.write_text("{corrupt")
    path.chmod(0o444)
    with caplog.at_level(logging.WARNING, logger="jax_blink"):
        again = plan_afresh_process(SHM8)
    assert again.rate_gbps == pytest.approx(40 / 7, rel=1e-9)
    assert path.read_text() == "{corrupt"
    assert any("the entry is read-only" in r.getMessage() for r in caplog.records)


def test_a_read_only_cache_directory_only_costs_planning_time(caplog):
    directory = cache.cache_dir()
    directory.mkdir(parents=True)
    directory.chmod(0o555)
    try:
        with caplog.at_level(logging.WARNING, logger="jax_blink"):
            p = plan(SHM8)
        assert p.rate_gbps == pytest.approx(40 / 7, rel=1e-9)
        assert list(directory.iterdir()) == []
        assert any("the cache directory is read-only" in r.getMessage() for r in caplog.records)
    finally:
        directory.chmod(0o755)


def test_a_cache_directory_that_cannot_exist_only_costs_planning_time(tmp_path, monkeypatch, caplog):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("JAX_BLINK_CACHE_DIR", str(tmp_path / "file" / "cache"))
    with caplog.at_level(logging.WARNING, logger="jax_blink"):
        assert plan(SHM8).rate_gbps == pytest.approx(40 / 7, rel=1e-9)
    assert any("cannot save" in r.getMessage() for r in caplog.records)


def test_a_directory_in_place_of_the_entry_only_costs_planning_time(caplog):
    path = cache.entry_path(key_of(SHM8))
    path.mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="jax_blink"):
        assert plan(SHM8).rate_gbps == pytest.approx(40 / 7, rel=1e-9)
    assert path.is_dir()
    assert any("a directory is in its place" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------- concurrency
def test_concurrent_processes_never_see_a_partial_entry(tmp_path):
    """Four processes plan, store and re-read the same entries 25 times each at once."""
    code = textwrap.dedent("""
        import json, logging
        from jax_blink.planning import cache, clear_memory_cache, plan
        from jax_blink.topo import Topology
        refused = []
        logging.getLogger("jax_blink").addHandler(logging.Handler())
        logging.getLogger("jax_blink").handlers[-1].emit = lambda record: refused.append(record.getMessage())
        topology, options = Topology.preset("shm:4"), ("allreduce", None, None, 0.0, "all")
        first = plan(topology)
        path = cache.entry_path(cache.cache_key(topology, options))
        certificate = json.loads(path.read_text())["certificate"]
        for _ in range(25):
            clear_memory_cache()
            assert plan(topology).trees == first.trees, "different plan"
            cache.store(first, options, certificate)  # rewrite it while the others read it
        print(len(refused), refused[:1])
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root, "JAX_BLINK_CACHE_DIR": str(tmp_path / "shared")}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.split()[0] == "0", out  # no entry was ever refused (partial, corrupt)
    entries = sorted(e.name for e in (tmp_path / "shared").iterdir())
    # the entry and its planning lock, no temporary files left
    assert len(entries) == 2 and entries[0].endswith(".json") and entries[1] == entries[0][:-5] + ".lock"


_AGREE = textwrap.dedent("""
    import pathlib, sys, time
    from jax_blink.planning import fewest, plan, planner
    from jax_blink.topo import Topology
    from jax_blink.topo.presets import shm_processes
    if sys.argv[1] == "loaded":  # its MILP found nothing in time: the LP's support instead
        planner.fewest_trees = lambda packer, target, max_trees, fewer_than=None: fewest.lp_support(packer, max_trees)
    topology = Topology.from_links(*shm_processes([0] * 4 + [1] * 4))
    pathlib.Path(sys.argv[2] + "." + sys.argv[1]).touch()
    while not pathlib.Path(sys.argv[2]).exists():
        time.sleep(0.001)
    p = plan(topology, "reduce_scatter", cache=sys.argv[3] == "cache")
    print(sorted((t.root, t.edges, round(t.weight, 9)) for t in p.trees))
""")


@pytest.mark.parametrize("cache_on", [True, False])
def test_processes_sharing_the_cache_plan_a_request_once_and_agree(tmp_path, cache_on):
    """The tree-count MILP stops at a time limit, so a process under load may keep another
    packing, and the ranks of a call over several processes must run one schedule. Two
    processes planning one request at once, one of them "loaded" (its MILP replaced by the
    LP's support: 12 trees instead of 8), run one plan when they share the cache; planning
    apart (cache=False) they do not, which shows that the check can fail."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root, "JAX_BLINK_CACHE_DIR": str(tmp_path / "shared")}
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _AGREE, who, str(go), "cache" if cache_on else "none"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for who in ("loaded", "idle")]
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"go.{who}").exists() for who in ("loaded", "idle")):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a child did not start"
            time.sleep(0.01)
        go.touch()  # both plan at once
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    loaded, idle = (out for out, _ in outs)
    assert (loaded == idle) == cache_on, (loaded, idle)


def test_planning_waits_for_a_held_lock_only_so_long(monkeypatch, caplog):
    """Another process holding the lock past LOCK_WAIT_S: this one plans on its own, with a
    warning, and never hangs."""
    import fcntl

    monkeypatch.setattr(cache, "LOCK_WAIT_S", 0.3)
    path = cache.entry_path(key_of(SHM8)).with_suffix(".lock")
    path.parent.mkdir(parents=True)
    with open(path, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another open file description: it conflicts
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="jax_blink"):
            assert plan(SHM8).rate_gbps == pytest.approx(40 / 7, rel=1e-9)
        assert 0.3 <= time.monotonic() - start < 30
    assert any("was held for more than 0.3 s" in r.getMessage() for r in caplog.records)
    clear_memory_cache()
    assert plan(SHM8).rate_gbps == pytest.approx(40 / 7, rel=1e-9)  # the entry it stored


def test_a_fifo_in_place_of_the_lock_does_not_block(caplog):
    path = cache.entry_path(key_of(SHM8)).with_suffix(".lock")
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    with caplog.at_level(logging.WARNING, logger="jax_blink"):
        assert plan(SHM8).rate_gbps == pytest.approx(40 / 7, rel=1e-9)
    assert any("not a regular file; planning without the lock" in r.getMessage() for r in caplog.records)


def test_plan_json_from_a_fifo_does_not_block(tmp_path):
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    with pytest.raises(PlanError, match="not a regular file"):
        Plan.from_json(str(fifo))
