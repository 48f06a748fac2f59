"""One decision per allreduce call (issue 13, item 4): JAX_BLINK_ALGO forces
an algorithm our executor runs (or lax), auto takes the fastest predicted one,
and JAX_BLINK_PLAN runs a plan or schedule file, refused where it does not fit.
Results are compared with lax on 8 CPU devices.
"""

import re

import numpy as np
import pytest

import jax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_blink
from jax_blink import Topology, plan
from jax_blink.ops import decide as _decide

N = 8


def rows(fn, x):
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:N]), ("x",))
    f = jax.jit(jax.shard_map(lambda v: fn(v[0])[None], mesh=mesh, in_specs=P("x"),
                              out_specs=P("x"), check_vma=False))
    return np.asarray(f(jax.device_put(x, NamedSharding(mesh, P("x")))))


def predictions(text):
    return {k: float(v) for k, v in re.findall(r"([a-z-]+) ([0-9.e+]+) us", text.split(": ", 1)[1])}


@pytest.fixture(autouse=True)
def fresh_caches():
    _decide.schedule_for.cache_clear()
    yield
    _decide.schedule_for.cache_clear()


@pytest.mark.parametrize("algo", ["blink", "ring", "tree", "chain", "lax"])
def test_every_forced_algorithm_gives_lax_results(monkeypatch, algo):
    monkeypatch.setenv("JAX_BLINK_ALGO", algo)
    x = np.random.default_rng(0).integers(-100, 100, (N, 1000)).astype(np.int32)
    for name in ("psum", "pmax"):
        ours = rows(lambda v: getattr(jax_blink, name)(v, "x"), x)
        ref = rows(lambda v: getattr(lax, name)(v, "x"), x)
        np.testing.assert_array_equal(ours, ref)
        text = jax_blink.explain().splitlines()[-1]
        assert ("JAX_BLINK_ALGO=lax" in text) if algo == "lax" else (f"JAX_BLINK_ALGO={algo}" in text)


def test_a_bad_algorithm_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("JAX_BLINK_ALGO", "nccl")
    with pytest.raises(ValueError, match="JAX_BLINK_ALGO='nccl': use one of auto, blink"):
        jax_blink.explain(jax.ShapeDtypeStruct((100,), np.float32), N)


def test_auto_on_cpu_takes_the_faster_by_the_cpu_model():
    for count in (1, 10**4, 10**7):
        text = jax_blink.explain(jax.ShapeDtypeStruct((count,), np.float32), N)
        predicted = predictions(text)
        assert set(predicted) == {"blink", "lax"} and "CPU model" in text
        best = min(predicted, key=predicted.get)
        assert ("lax.psum" in text.split("(")[0]) == (best == "lax"), text


def test_auto_on_a_gpu_topology_takes_the_fastest_simulated_schedule():
    """Every alternative's predicted time is listed; the choice is the
    smallest, never slower than NCCL's own choice (the faster of ring and
    tree), and the chosen schedule is the one simulated."""
    topology = Topology.preset("dgx1-v100").subset([0, 1, 2, 5, 6])
    for count in (256, 1 << 18):
        d = _decide.decide(count, "float32", 5, topology=topology, platform="gpu")
        predicted = predictions(d.text)
        assert set(predicted) == {"blink-tuned", "ring", "tree", "chain", "lax"}, d.text
        assert predicted["lax"] == min(predicted["ring"], predicted["tree"])
        best = min(predicted, key=predicted.get)
        assert d.request.algo == best and predicted[best] <= predicted["lax"]
        from jax_blink.sim import simulate
        schedule = _decide.schedule_for(d.request, count, "float32")[1]
        assert simulate(schedule, topology).time_s * 1e6 == pytest.approx(predicted[best], rel=1e-3)


def test_plan_file_is_used_and_refused_where_it_does_not_fit(monkeypatch, tmp_path):
    x = np.arange(N * 64, dtype=np.float32).reshape(N, 64)
    good = tmp_path / "shm8.json"
    good.write_text(plan(Topology.preset("shm:8"), "allreduce", max_trees=1, cache=False).to_json())
    monkeypatch.setenv("JAX_BLINK_PLAN", str(good))
    np.testing.assert_array_equal(rows(lambda v: jax_blink.psum(v, "x"), x),
                                  np.broadcast_to(x.sum(0), x.shape))
    assert f"JAX_BLINK_PLAN {good}" in jax_blink.explain().splitlines()[-1]
    schedule = tmp_path / "schedule.json"
    schedule.write_text(_decide.schedule_for(_decide.PlanRequest(Topology.preset("shm:8")), 64,
                                             "float32")[1].to_json())
    monkeypatch.setenv("JAX_BLINK_PLAN", str(schedule))
    np.testing.assert_array_equal(rows(lambda v: jax_blink.psum(v, "x"), x),
                                  np.broadcast_to(x.sum(0), x.shape))
    cases = {
        "foreign.json": (plan(Topology.preset("dgx1-v100"), "allreduce", links="fast").to_json(),
                         "was planned for dgx1-v100"),
        "broadcast.json": (plan(Topology.preset("shm:8"), "broadcast", root=0).to_json(),
                           "holds a broadcast over 8 ranks"),
        "junk.json": ("[1, 2]", "not a jax_blink plan or schedule"),
        "missing.json": (None, "no such file"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        monkeypatch.setenv("JAX_BLINK_PLAN", str(path))
        _decide.schedule_for.cache_clear()
        with pytest.raises(ValueError, match=message):
            rows(lambda v: jax_blink.psum(v, "x"), x)
    # a schedule of another size
    monkeypatch.setenv("JAX_BLINK_PLAN", str(schedule))
    with pytest.raises(ValueError, match="is a schedule of 64 float32; this call reduces 32"):
        rows(lambda v: jax_blink.psum(v, "x"), x[:, :32])


def test_a_split_plan_for_links_faster_one_way_runs_through_psum_as_lax(monkeypatch):
    """Links 10 GB/s one way and 2 GB/s back: the planner reduces up some trees and broadcasts
    down others (family "split"); the schedule, with a tree index per phase, gives lax's results
    on the CPU executor, and on a GPU topology the decision predicts it fastest at 1 MB."""
    links = [(i, (i + 1) % N, 10.0, "nvlink", 2.0) for i in range(N)] + [(0, 4, 5.0, "nvlink", 5.0)]
    topology = Topology.from_links(N, links, name="one-way-ring")
    p = plan(topology)
    assert p.family == "split" and any(t.up_edges for t in p.trees)
    monkeypatch.setenv("JAX_BLINK_ALGO", "blink")
    x = np.random.default_rng(1).integers(-100, 100, (N, 1000)).astype(np.int32)
    for name in ("psum", "pmax"):
        ours = rows(lambda v: getattr(jax_blink, name)(v, "x", topology=topology), x)
        np.testing.assert_array_equal(ours, rows(lambda v: getattr(lax, name)(v, "x"), x))
        assert "split plan on one-way-ring" in jax_blink.explain().splitlines()[-1]
    monkeypatch.setenv("JAX_BLINK_ALGO", "auto")
    d = _decide.decide(1 << 18, "float32", N, topology=topology, platform="gpu")
    predicted = predictions(d.text)
    assert d.request.algo == "blink-tuned" and predicted["blink-tuned"] < predicted["lax"], d.text
