"""psum's GPU decisions kept on disk (issue 25, item 3): a later process decides from the
entry without planning, tuning or simulating, and gets the same decision; an entry for
other sources or a corrupt one is ignored with a warning and the decision made afresh."""

import json

import pytest

from jax_blink import Topology
from jax_blink.choice import decide as _decide
from jax_blink.choice import predict_gpu as _predict_gpu
from jax_blink.choice import requests as _schedules
from jax_blink.planning import cache as plan_cache

#: a partial DGX-1 V100 where the tuned plan beats NCCL's model at 64 MB, and one where
#: NCCL wins (a whole HGX H100)
CASES = [(Topology.preset("dgx1-v100").subset([0, 1, 2, 5]), 2**24, True),
         (Topology.preset("hgx-h100"), 2**18, False)]


def _forget():
    """What a new process would not have: every in-process cache of the decision."""
    _predict_gpu.allreduce.cache_clear()
    _predict_gpu.other.cache_clear()
    _schedules.tuned.cache_clear()
    _schedules.tuned_schedule.cache_clear()
    _schedules.schedule_for.cache_clear()
    plan_cache.clear_memory_cache()


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("JAX_BLINK_CACHE_DIR", str(tmp_path))
    _forget()
    yield tmp_path
    _forget()


def _decision(topology, count):
    d = _decide.decide(count, "float32", topology.n, topology=topology, platform="gpu")
    return d.text, None if d.schedule is None else d.schedule.words.tobytes()


def _no_recomputing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("recomputed although the decision is on disk")

    monkeypatch.setattr(_predict_gpu, "simulate", refuse)
    monkeypatch.setattr(_predict_gpu.nccl_model, "predict", refuse)
    monkeypatch.setattr(_predict_gpu.nccl_model, "predict_collective", refuse)
    monkeypatch.setattr(_predict_gpu, "_predict_allreduce", refuse)
    monkeypatch.setattr("jax_blink.sim.tuning.simulate", refuse)
    # nor planned or lowered: the tuned schedule is on disk too
    monkeypatch.setattr(_schedules, "plan", refuse)
    monkeypatch.setattr(_predict_gpu, "plan", refuse)
    monkeypatch.setattr("jax_blink.planning.result.lower_trees", refuse)


@pytest.mark.parametrize("topology,count,blink", CASES, ids=lambda c: getattr(c, "name", str(c)))
def test_a_later_process_decides_from_disk(topology, count, blink, cache_dir, monkeypatch):
    first = _decision(topology, count)
    assert ("rsag plan" in first[0] or "tree plan" in first[0]) == blink, first[0]
    assert list(cache_dir.glob("decide-*.json"))
    _forget()
    _no_recomputing(monkeypatch)
    assert _decision(topology, count) == first


def test_an_entry_for_other_sources_or_a_corrupt_one_is_recomputed(cache_dir, monkeypatch, caplog):
    topology, count, _ = CASES[1]
    first = _decision(topology, count)
    [entry] = cache_dir.glob("decide-*.json")
    data = json.loads(entry.read_text())
    for bad in ({**data, "key": {**data["key"], "sources": "an older jax_blink"}},
                {**data, "value": [["lax", "fast"], "how", []]},
                "{not json"):
        entry.write_text(bad if isinstance(bad, str) else json.dumps(bad))
        _forget()
        caplog.clear()
        assert _decision(topology, count) == first
        assert "ignoring" in caplog.text
    # the recomputed decision was stored again, whole
    assert json.loads(entry.read_text())["value"] == data["value"]


@pytest.mark.parametrize("name", ["requests.py", "predict_gpu.py", "nccl.py", "cost.py", "simulator.py",
                                  "settings.py"])
def test_the_key_changes_with_the_decision_rules_and_the_model(name, monkeypatch):
    from pathlib import Path

    def digests():
        plan_cache.source_digest.cache_clear()
        _schedules.rules_digest.cache_clear()
        return plan_cache.source_digest(), _schedules.rules_digest()

    before = digests()
    assert digests() == before  # stable
    read = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: read(self) + (b"#" if self.name == name else b""))
    try:
        after = digests()
        assert after != before
        assert (after[1] != before[1]) == (name in ("requests.py", "predict_gpu.py"))
    finally:
        monkeypatch.undo()
        digests()


def test_unreadable_sources_keep_entries_to_their_process(monkeypatch):
    from pathlib import Path

    def unreadable(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", unreadable)
    try:
        plan_cache.source_digest.cache_clear()
        _schedules.rules_digest.cache_clear()
        first = (plan_cache.source_digest(), _schedules.rules_digest())
        plan_cache.source_digest.cache_clear()
        _schedules.rules_digest.cache_clear()
        again = (plan_cache.source_digest(), _schedules.rules_digest())
        assert all(d.startswith("process-") for d in first)
        assert first[0] != again[0] and first[1] != again[1]  # never matches another process's
    finally:
        monkeypatch.undo()
        plan_cache.source_digest.cache_clear()
        _schedules.rules_digest.cache_clear()


def _tuned(collective="allreduce", op="sum", root=None):
    topology = CASES[0][0]
    d = _decide.decide(1 << 25, "bfloat16", topology.n, topology=topology, platform="gpu",
                       collective=collective, op=op, root=root)
    return d.text, d.schedule.words.tobytes()


@pytest.mark.parametrize("collective,op,root", [("allreduce", "max", None), ("reduce_scatter", "sum", None),
                                                 ("allgather", "sum", None), ("broadcast", "sum", 2)])
def test_tuned_schedules_of_every_collective_come_from_disk(collective, op, root, monkeypatch):
    first = _tuned(collective, op, root)
    assert "tuned" in first[0] or "by simulation" in first[0]
    _forget()
    _no_recomputing(monkeypatch)
    assert _tuned(collective, op, root) == first


def test_a_tuned_schedule_whose_header_is_not_the_requests_is_lowered_again(cache_dir, caplog):
    import base64

    import numpy as np

    first = _tuned()
    [entry] = cache_dir.glob("lowered-*.json")
    data = json.loads(entry.read_text())
    words = np.frombuffer(base64.b64decode(data["value"]["words"]), dtype="<i8").copy()
    for index, value in ((3, words[3] + 1), (7, 1), (2, 3)):  # another count, op (max), rank count
        bad = words.copy()
        bad[index] = value
        entry.write_text(json.dumps({**data, "value": {**data["value"], "words": base64.b64encode(
            bad.tobytes()).decode()}}))
        _forget()
        caplog.clear()
        assert _tuned() == first
        assert "ignoring a tuned schedule" in caplog.text
    for value in ({**data["value"], "words": "not base64!"}, {"text": "x"}, "words",
                  {**data["value"], "seconds": -1.0}, {**data["value"], "seconds": "soon"}):
        entry.write_text(json.dumps({**data, "value": value}))
        _forget()
        caplog.clear()
        assert _tuned() == first
        assert "ignoring a tuned schedule" in caplog.text
    assert json.loads(entry.read_text())["value"] == data["value"]  # stored again, whole


def test_a_corrupt_prediction_of_another_collective_is_recomputed(cache_dir, caplog):
    first = _tuned("reduce_scatter")
    entries = [e for e in cache_dir.glob("decide-*.json")
               if json.loads(e.read_text())["format"] == "jax_blink.gpu_prediction_other"]
    assert len(entries) == 1
    data = json.loads(entries[0].read_text())
    for value in (["fast", "how", 1.0], [1.0], "x", [None, "", None]):
        entries[0].write_text(json.dumps({**data, "value": value}))
        _forget()
        caplog.clear()
        assert _tuned("reduce_scatter") == first
        assert "ignoring an entry" in caplog.text
    assert json.loads(entries[0].read_text())["value"] == data["value"]
