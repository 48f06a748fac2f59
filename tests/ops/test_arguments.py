"""Bad arguments get lax's error, or a TypeError/ValueError naming the argument, at trace
time (issue 30, item 3): never a raw AttributeError, a wrong answer or a rendezvous timeout."""

import time

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_blink

N = 8


def mesh():
    return jax.sharding.Mesh(np.asarray(jax.devices()[:N]), ("i",))


def shard(fn, x, check_vma=True):
    f = jax.jit(jax.shard_map(fn, mesh=mesh(), in_specs=P("i"), out_specs=P("i"), check_vma=check_vma))
    return np.asarray(f(jax.device_put(x, NamedSharding(mesh(), P("i")))))


def test_an_axis_named_twice_is_lax_error_at_once():
    x = np.ones((N, 4), np.float32)
    for run in (lambda fn: shard(fn, x, check_vma=False),
                lambda fn: jax.pmap(fn, axis_name="i")(x)):
        start = time.perf_counter()
        with pytest.raises(ValueError, match="repeated axis"):
            run(lambda v: jax_blink.psum(v, ("i", "i")))
        with pytest.raises(ValueError, match="repeated axis"):
            run(lambda v: lax.psum(v, ("i", "i")))
        assert time.perf_counter() - start < 5


@pytest.mark.parametrize("groups", [[[0.5, 1, 2, 3], [4, 5, 6, 7]], ["0123", "4567"],
                                    [[0, 1, 2, 3], [4, 5, 6, True]]])
def test_groups_that_are_not_integer_indices_are_refused_as_lax_does(groups):
    x = np.ones((N, 4), np.float32)
    with pytest.raises(ValueError, match="axis_index_groups must cover all indices exactly once"):
        shard(lambda v: lax.psum(v, "i", axis_index_groups=groups), x, check_vma=False)
    with pytest.raises(ValueError, match="axis_index_groups must cover all indices exactly once"):
        shard(lambda v: jax_blink.psum(v, "i", axis_index_groups=groups), x, check_vma=False)


def test_groups_below_min_bytes_still_sum_under_check_vma():
    """lax takes no axis_index_groups under check_vma=True (jax raises an empty
    NotImplementedError); jax_blink runs its own collective there even below min_bytes."""
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    x = np.arange(N * 4, dtype=np.float32).reshape(N, 4)
    want = np.concatenate([np.broadcast_to(x[:4].sum(0), (4, 4)), np.broadcast_to(x[4:].sum(0), (4, 4))])
    got = shard(lambda v: jax_blink.psum(v, "i", axis_index_groups=groups, min_bytes=10**9), x)
    np.testing.assert_array_equal(got, want)
    assert "min_bytes ignored: lax takes no axis_index_groups" in jax_blink.explain().splitlines()[-1]
    got = shard(lambda v: jax_blink.psum(v, "i", axis_index_groups=groups, min_bytes=10**9), x,
                check_vma=False)  # lax.psum with groups, as asked
    np.testing.assert_array_equal(got, want)
    assert "lax.psum (below min_bytes" in jax_blink.explain().splitlines()[-1]


def test_groups_where_only_lax_could_run_say_what_to_do(monkeypatch):
    monkeypatch.setenv("JAX_BLINK_ALGO", "lax")
    x = np.ones((N, 4), np.float32)
    with pytest.raises(NotImplementedError, match="use shard_map\\(..., check_vma=False\\) or jax.pmap"):
        shard(lambda v: jax_blink.psum(v, "i", axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]]), x)


def test_a_topology_of_another_type_is_a_type_error():
    with pytest.raises(TypeError, match="topology must be a Topology or a preset name, got 123"):
        shard(lambda v: jax_blink.psum(v, "i", topology=123), np.ones((N, 4), np.float32))


@pytest.mark.parametrize("x, size, error, message", [
    ("abc", 8, TypeError, "x must be one device's input, an array or a jax.ShapeDtypeStruct, got 'abc'"),
    (jax.ShapeDtypeStruct((4,), np.float32), "8", TypeError, "axis_size must be a whole number of devices"),
    (jax.ShapeDtypeStruct((4,), np.float32), 2.5, TypeError, "axis_size must be a whole number"),
    (jax.ShapeDtypeStruct((4,), np.float32), True, TypeError, "axis_size must be a whole number"),
    (jax.ShapeDtypeStruct((4,), np.float32), 0, ValueError, "axis_size must be at least 1 device, got 0"),
    (jax.ShapeDtypeStruct((4,), np.float32), -1, ValueError, "axis_size must be at least 1 device"),
])
def test_explain_names_its_bad_argument(x, size, error, message):
    with pytest.raises(error, match=message):
        jax_blink.explain(x, size)


def test_explain_takes_an_array_of_one_device():
    assert "plan on shm:8" in jax_blink.explain(jnp.ones((64,)), 8)
