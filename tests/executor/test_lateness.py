"""jax_blink.stats(): how late each rank joins its collectives (issue 46, item 4).

Lateness is injected by the test scaffolding only: the run_ranks harness's ``delays_ms``
(a rank's thread sleeps before each call), or a host callback that sleeps on one device
before its psum. The recorded means are checked against the injected delay.
"""

import time

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_blink
from jax_blink import _ffi
from reference import check_sum, lowered, make_inputs

harness = _ffi.load_testing()


def run(delays, calls=6, n=4):
    sched = lowered(n, 1000, "float32", 2)
    inputs = make_inputs("float32", n, 1000)
    outputs = [np.zeros_like(x) for x in inputs]
    assert harness.run_ranks(sched, inputs, outputs, 20000, repeat=calls, delays_ms=delays) == [None] * n
    check_sum("float32", inputs, outputs[0])


def test_a_late_rank_is_seen_late_by_about_its_delay():
    jax_blink.stats(reset=True)
    run([0, 0, 25, 0])
    got = jax_blink.stats()[4]
    assert got["calls"] == 6
    late = got["mean_late_ms"]
    assert 20 <= late[2] <= 200, late
    assert all(late[r] < 10 for r in (0, 1, 3)), late
    assert got["max_late_ms"][2] >= late[2]
    assert jax_blink.slow_ranks(4, threshold_ms=10) == [2]


def test_punctual_ranks_name_no_slow_rank():
    jax_blink.stats(reset=True)
    run([0, 0, 0, 0])
    assert jax_blink.slow_ranks(4, threshold_ms=10) == []
    assert jax_blink.stats(reset=True)[4]["calls"] == 6
    assert 4 not in jax_blink.stats()  # forgotten


def test_the_window_keeps_the_recent_calls():
    jax_blink.stats(reset=True)
    run([0, 30, 0], calls=2, n=3)
    run([0, 0, 0], calls=256, n=3)  # the late calls fall out of the 256-call window
    got = jax_blink.stats()[3]
    assert got["calls"] == 256 and got["mean_late_ms"][1] < 10, got


def test_harness_refuses_bad_delays():
    sched = lowered(2, 10, "float32", 1)
    inputs = make_inputs("float32", 2, 10)
    outputs = [np.zeros_like(x) for x in inputs]
    with pytest.raises(ValueError, match="delays_ms"):
        harness.run_ranks(sched, inputs, outputs, 1000, delays_ms=[0, 0, 0])
    with pytest.raises(ValueError, match="delays_ms"):
        harness.run_ranks(sched, inputs, outputs, 1000, delays_ms=[-1, 0])


def test_harness_times_each_call_and_slow_ranks_reduced_last_sum_right():
    """The plan with rank 2 slow (its trees kept, rank 2 reduced after every other child) sums
    as numpy with rank 2 late; times_ns records each call's start after the delay."""
    from jax_blink import Topology
    from jax_blink.planning import plan

    n, count, calls = 4, 20000, 3
    sched = plan(Topology.preset("shm:4"), slow_ranks=[2]).lower(count * 4, "float32", chunks=3).encode()
    inputs = make_inputs("float32", n, count)
    outputs = [np.zeros_like(x) for x in inputs]
    times = np.zeros((n, calls, 2), np.int64)
    assert harness.run_ranks(sched, inputs, outputs, 20000, repeat=calls, delays_ms=[0, 0, 15, 0],
                             times_ns=times) == [None] * n
    for out in outputs:
        check_sum("float32", inputs, out)
    assert (times[:, :, 1] >= times[:, :, 0]).all() and (times > 0).all()
    # every call ends after the late rank began it, which is well after the others began
    assert (times[:, :, 1].max(axis=0) >= times[2, :, 0]).all()
    assert ((times[2, :, 0] - times[[0, 1, 3], :, 0].min(axis=0)) > 10e6).all(), times
    with pytest.raises(ValueError, match="times_ns"):
        harness.run_ranks(sched, inputs, outputs, 1000, repeat=2, times_ns=times)
    with pytest.raises(ValueError, match="times_ns"):
        harness.run_ranks(sched, inputs, outputs, 1000, repeat=calls, times_ns=times.astype(np.int32))


def test_a_device_late_to_its_psum_is_named():
    """Inside jit: one device's host callback sleeps before its psum (test scaffolding in
    the program, not in jax_blink); stats() names that device's rank."""
    n = jax.device_count()
    late_rank = n - 3
    mesh = jax.make_mesh((n,), ("i",))

    def maybe_sleep(v, rank):
        if int(rank) == late_rank:
            time.sleep(0.02)
        return v

    def body(v):
        rank = jax.lax.axis_index("i")
        v = jax.pure_callback(maybe_sleep, jax.ShapeDtypeStruct(v.shape, v.dtype), v, rank)
        return jax_blink.psum(v * 2, "i", min_bytes=0)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    x = jax.device_put(jnp.ones(n * 1000), NamedSharding(mesh, P("i")))
    jax.block_until_ready(f(x))  # compile
    jax_blink.stats(reset=True)
    for _ in range(5):
        out = jax.block_until_ready(f(x))
    np.testing.assert_array_equal(np.asarray(out), 2.0 * n)
    got = jax_blink.stats()[n]
    assert got["calls"] == 5
    assert jax_blink.slow_ranks(n, threshold_ms=10) == [late_rank], got["mean_late_ms"]


def test_psum_makes_slow_ranks_leaves_and_sums_as_lax():
    """psum(slow_ranks=...) plans trees with those ranks as leaves (a chain: its end rank is a
    leaf at the optimum), sums as lax does, and explain() says what the plan did; where no
    tree can have them as leaves, the plan says so and stays the plain one."""
    from jax import lax
    from jax_blink import Topology

    n = 4
    mesh = jax.make_mesh((n,), ("i",), devices=jax.devices()[:n])
    chain = Topology.from_links(n, [(0, 1, 10.0), (1, 2, 10.0), (2, 3, 10.0)])
    x = jax.device_put(np.arange(n * 1000, dtype=np.float32), NamedSharding(mesh, P("i")))
    want = np.asarray(jax.jit(jax.shard_map(lambda v: lax.psum(v, "i"), mesh=mesh, in_specs=P("i"),
                                            out_specs=P()))(x))
    for slow, said in (([3], "slow ranks 3 are leaves of every tree"),
                       ([1], "slow ranks 1: no spanning tree has them all as leaves")):
        f = jax.jit(jax.shard_map(lambda v: jax_blink.psum(v, "i", topology=chain, slow_ranks=slow,
                                                           min_bytes=0),
                                  mesh=mesh, in_specs=P("i"), out_specs=P()))
        np.testing.assert_array_equal(np.asarray(f(x)), want)
        assert said in jax_blink.explain().splitlines()[-1], jax_blink.explain()


def test_slow_ranks_refused_with_groups_and_bad_values():
    n = 4
    mesh = jax.make_mesh((n,), ("i",), devices=jax.devices()[:n])
    x = jax.device_put(np.ones(n * 10, np.float32), NamedSharding(mesh, P("i")))

    def call(**kw):
        return jax.jit(jax.shard_map(lambda v: jax_blink.psum(v, "i", min_bytes=0, **kw), mesh=mesh,
                                     in_specs=P("i"), out_specs=P(), check_vma=False))(x)

    with pytest.raises(ValueError, match="slow_ranks cannot be combined with axis_index_groups"):
        call(slow_ranks=[1], axis_index_groups=[[0, 1], [2, 3]])
    with pytest.raises(TypeError, match="sequence of rank numbers"):
        call(slow_ranks="1")
    with pytest.raises(ValueError, match="out of range"):
        call(slow_ranks=[7])


@pytest.mark.parametrize("args, match", [((1,), "nranks must be a whole number of at least 2"),
                                         ((4.0,), "nranks must be"), ((True,), "nranks must be"),
                                         ((4, -1), "threshold_ms must be a finite number"),
                                         ((4, float("nan")), "threshold_ms must be"),
                                         ((4, "1"), "threshold_ms must be")])
def test_slow_ranks_refuses_bad_arguments_by_name(args, match):
    with pytest.raises(ValueError, match=match):
        jax_blink.slow_ranks(*args, recorded={4: {"mean_late_ms": [0.0, 2.0, 0.0, 0.0]}})
    assert jax_blink.slow_ranks(4, 1.0, recorded={4: {"mean_late_ms": [0.0, 2.0, 0.0, 0.0]}}) == [1]
