"""Every element count from 1 up has a decision on every preset, platform and
JAX_BLINK_ALGO value, and runs as lax.psum on 8 CPU devices (issue 30, item 1:
a scalar psum on a GPU topology used to fail at trace time)."""

import numpy as np
import pytest

import jax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_blink
from jax_blink import Topology
from jax_blink.choice import decide as _decide
from jax_blink.choice import requests as _schedules
from jax_blink.settings import ALGOS
from jax_blink.topo.presets import preset_names

PRESETS = [name.replace(":N", ":8") for name in preset_names()]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("platform", ["cpu", "gpu"])
@pytest.mark.parametrize("preset", PRESETS)
def test_every_count_from_one_has_a_decision(monkeypatch, preset, platform, algo):
    monkeypatch.setenv("JAX_BLINK_ALGO", algo)
    n = Topology.preset(preset).n
    for count in range(1, 65):
        for op in ("sum", "max") if count in (1, 7, 64) else ("sum",):  # the op changes no structure
            d = _decide.decide(count, "float32", n, topology=preset, platform=platform, op=op)
            if algo != "auto":  # forced: that schedule; auto: the model's choice, either
                assert d.uses_blink == (algo != "lax"), d.text
            if d.uses_blink:  # the schedule the custom call gets is valid for this count
                schedule = _schedules.schedule_for(d.request, count, "float32")[1]
                assert (schedule.count, schedule.nranks) == (count, n)


def rows(fn, x):
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:8]), ("x",))
    f = jax.jit(jax.shard_map(lambda v: fn(v[0])[None], mesh=mesh, in_specs=P("x"),
                              out_specs=P("x"), check_vma=False))
    return np.asarray(f(jax.device_put(x, NamedSharding(mesh, P("x")))))


@pytest.mark.parametrize("algo", ALGOS)
def test_small_values_on_8_cpu_devices_equal_lax(monkeypatch, algo):
    monkeypatch.setenv("JAX_BLINK_ALGO", algo)
    rng = np.random.default_rng(3)
    for count in (1, 3, 7, 8, 13):
        x = rng.integers(-100, 100, (8, count)).astype(np.int32)
        for name in ("psum", "pmax"):
            ours = rows(lambda v: getattr(jax_blink, name)(v, "x"), x)
            np.testing.assert_array_equal(ours, rows(lambda v: getattr(lax, name)(v, "x"), x))
            assert f"JAX_BLINK_ALGO={algo}" in jax_blink.explain().splitlines()[-1] or algo == "auto"


def test_a_scalar_pmean_traces_on_a_gpu_topology(monkeypatch):
    # the training loop's scalar loss: decided as for a GPU box, run on the CPU executor
    x = np.arange(8, dtype=np.float32).reshape(8, 1)
    out = rows(lambda v: jax_blink.pmean(v, "x", topology="dgx1-v100"), x)
    np.testing.assert_array_equal(out, np.full((8, 1), 3.5, np.float32))
    d = _decide.decide(1, "float32", 8, topology="dgx1-v100", platform="gpu")
    assert "lax.psum (predicted fastest" in d.text  # NCCL's LL: faster than any per-call executor
