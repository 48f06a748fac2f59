"""The CUDA executor on one GPU: N simulated ranks (2..8), each with its own
streams, through ``jax_blink._blink_cuda_testing.run_schedule``, against numpy.

These tests need an NVIDIA GPU and the ``_blink_cuda`` and
``_blink_cuda_testing`` modules (built when a CUDA compiler is found;
docs/building.md); the last ones also need jax with CUDA support. Without
them they skip with the reason (CI has no GPU; the event ordering is verified
there by tests/executor/test_stream_emulator.py).

Tolerances as in tests/executor/test_executor_cpu.py: integers exact (wrapping);
float16/bfloat16 inputs are drawn so that every partial sum is exact in
float32, so the result is the exact sum rounded once (bit-exact check);
float32/float64 within the recursive-summation bound.
"""

import os
from types import SimpleNamespace

import numpy as np
import pytest

import jax_blink
from jax_blink import _ffi
from jax_blink import schedule as jbs
from reference import NP_DTYPES, assert_bit_identical, check_sum, lowered, make_inputs

pytestmark = pytest.mark.gpu


def planned(preset, count, dtype, chunks=None):
    """A planner schedule for a preset machine (the product path)."""
    plan = jax_blink.plan(jax_blink.Topology.preset(preset))
    itemsize = np.dtype(NP_DTYPES[dtype]).itemsize
    return np.asarray(plan.lower(count * itemsize, dtype, chunks=chunks).encode())


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "staged"])
@pytest.mark.parametrize("dtype", list(NP_DTYPES))
@pytest.mark.parametrize("nranks", [2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("count,chunks", [(1, 1), (1000, 3), (100_003, 8)])
def test_lowered_allreduce_equals_numpy(cuda, direct, dtype, nranks, count, chunks):
    sched = lowered(nranks, count, dtype, chunks)
    inputs = make_inputs(dtype, nranks, count)
    out = cuda.run_schedule(sched, inputs, direct=direct)
    check_sum(dtype, inputs, out[0])
    assert_bit_identical(out)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int32"])
@pytest.mark.parametrize("preset", ["dgx1-v100", "dgx-a100", "hgx-h100", "shm:4", "shm:8"])
def test_planned_preset_allreduce_equals_numpy(cuda, dtype, preset):
    sched = planned(preset, 65_537, dtype, chunks=4)
    info = _ffi.load_extension().validate_schedule(sched)
    n = info["nranks"]
    inputs = make_inputs(dtype, n, 65_537, seed=3)
    out = cuda.run_schedule(sched, inputs)
    check_sum(dtype, inputs, out[0])
    assert_bit_identical(out)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_matches_cpu_executor_bit_for_bit(cuda, dtype):
    """Same schedule, same summation order: GPU and CPU outputs are equal."""
    harness = _ffi.load_testing()
    sched = lowered(8, 50_001, dtype, chunks=8)
    inputs = [x.astype(NP_DTYPES[dtype]) for x in
              np.random.default_rng(1).standard_normal((8, 50_001)) * 10]
    cpu = [np.zeros_like(x) for x in inputs]
    assert harness.run_ranks(sched, inputs, cpu, 20000) == [None] * 8
    gpu = cuda.run_schedule(sched, inputs)
    for a, b in zip(cpu, gpu):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "staged"])
def test_repeated_enqueues_without_host_sync(cuda, direct):
    """repeat=k enqueues the collective k times back to back (events only):
    inputs are unchanged, so every call must give the same result."""
    sched = lowered(8, 200_001, "float32", chunks=16)
    inputs = make_inputs("float32", 8, 200_001, seed=5)
    once = cuda.run_schedule(sched, inputs, direct=direct)
    many = cuda.run_schedule(sched, inputs, direct=direct, repeat=20)
    for a, b in zip(once, many):
        assert a.tobytes() == b.tobytes()


def test_float16_accumulates_in_float32_and_rounds_once(cuda):
    star = SimpleNamespace(root=7, edges=[(7, i) for i in range(7)], weight=1.0)
    sched = np.asarray(jbs.lower_trees([star], nranks=8, collective="allreduce", count=1,
                                       dtype="float16", chunks=1).validate().encode())
    inputs = [np.array([2048.0], np.float16)] + [np.array([1.0], np.float16)] * 7
    out = cuda.run_schedule(sched, inputs)
    assert [float(o[0]) for o in out] == [2056.0] * 8


@pytest.mark.parametrize("offset", [0, 1, 3, 5])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int32"])
def test_odd_lengths_and_misaligned_chunks(cuda, offset, dtype):
    """Chunk boundaries at odd element offsets exercise the scalar head/tail
    and the fall-back when operands are misaligned relative to each other."""
    count = 4099 + offset
    sched = lowered(4, count, dtype, chunks=7)
    inputs = make_inputs(dtype, 4, count, seed=offset)
    for direct in (True, False):
        out = cuda.run_schedule(sched, inputs, direct=direct)
        check_sum(dtype, inputs, out[0])
        assert_bit_identical(out)


def test_single_rank_copies_input(cuda):
    sched = np.asarray(jbs.lower_trees([SimpleNamespace(root=0, edges=[], weight=1.0)],
                                       nranks=1, collective="allreduce", count=10,
                                       dtype="float32", chunks=2).validate().encode())
    x = [np.arange(10, dtype=np.float32)]
    np.testing.assert_array_equal(cuda.run_schedule(sched, x)[0], x[0])


@pytest.fixture(scope="module")
def jax_gpus(cuda):
    import jax

    try:
        gpus = jax.devices("gpu")
    except RuntimeError as e:
        pytest.skip(f"jax_blink's CUDA module sees a GPU but jax does not: JAX_PLATFORMS="
                    f"{os.environ.get('JAX_PLATFORMS')!r} must include cuda (tests/conftest.py "
                    f"adds it where jax has a CUDA plugin), or install jax with CUDA support ({e})")
    return gpus


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
def test_custom_call_runs_under_xla_gpu(jax_gpus, dtype):
    """The lowering and the CUDA FFI handler under real XLA:GPU, on one GPU
    (a one-rank schedule: rank, group and buffers pass through the handler,
    which enqueues the copy on XLA's stream; bfloat16 also takes its float32
    accumulator from XLA's scratch allocator)."""
    from reference import one_device_collective

    x = (np.arange(100_003) % 1000).astype(NP_DTYPES[dtype])
    for _ in range(3):  # the cached rank/group path after the first call
        out, text = one_device_collective(x, jax_gpus[0])
        assert "jax_blink_collective" in text
        assert out.tobytes() == x.tobytes()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
def test_psum_equals_lax_psum_on_several_gpus(jax_gpus, monkeypatch, dtype):
    """jax_blink.psum against lax.psum over every local GPU."""
    import jax
    from jax import lax
    from jax.sharding import PartitionSpec as P

    if len(jax_gpus) < 2:
        pytest.skip(f"needs 2 or more GPUs, found {len(jax_gpus)}")
    n = len(jax_gpus)
    mesh = jax.sharding.Mesh(np.asarray(jax_gpus), ("x",))
    x = np.concatenate(make_inputs(dtype, n, 300_007, seed=9))

    def run(fn):
        f = jax.jit(jax.shard_map(lambda v: fn(v, "x"), mesh=mesh, in_specs=P("x"),
                                  out_specs=P()))
        return np.asarray(f(x))

    ours = run(jax_blink.psum)
    assert "jax_blink_collective" in jax.jit(jax.shard_map(
        lambda v: jax_blink.psum(v, "x"), mesh=mesh, in_specs=P("x"),
        out_specs=P())).lower(x).as_text()
    check_sum(dtype, np.split(x, n), ours)
    if dtype == "int32":
        np.testing.assert_array_equal(ours, run(lax.psum))


def test_detected_allocation_covers_the_visible_gpus(cuda):
    """The real machine: each visible CUDA device, found by its PCI bus id
    among the GPUs nvidia-smi lists (tests/topo/test_topology.py covers partial
    allocations of a recorded DGX-1)."""
    from jax_blink import _blink_cuda
    from jax_blink.topo import detect

    n = _blink_cuda.device_count()
    bus_ids = [_blink_cuda.pci_bus_id(i) for i in range(n)]
    table = detect.gpu_table()
    if table is None:
        pytest.skip("nvidia-smi is not available")
    indices = detect.smi_indices(list(range(n)), table, bus_ids=bus_ids)
    assert sorted(indices) == sorted(set(indices)) and len(indices) == n
    topo = detect.detect_allocation(list(range(n)), bus_ids=bus_ids)
    assert topo.n == n


def test_configure_debug_logs_each_cuda_call(jax_gpus, capfd):
    """_blink_cuda.configure(debug=True): one line per executed collective on
    the CUDA path."""
    from jax_blink import _blink_cuda
    from reference import one_device_collective

    # The first registration hands the environment's settings (JAX_BLINK_DEBUG unset:
    # off) to the module: register before configuring, or a worker that lowers here
    # for the first time turns debug off again (it did under pytest-xdist).
    _ffi.ensure_registered("cuda")
    saved = _blink_cuda.configuration()
    try:
        _blink_cuda.configure(debug=True)
        one_device_collective(np.ones(1000, np.float32), jax_gpus[0])
    finally:
        _blink_cuda.configure(**saved)
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("jax_blink cuda: op=")]
    assert lines, err[-2000:]
    assert " rank=0 " in lines[0] and " bytes=4000 " in lines[0] and lines[0].endswith(" ok")


# ------------------------------------------------------- format version 2
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "staged"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint32"])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_v2_collectives_equal_numpy_and_the_cpu_executor(cuda, direct, dtype, op):
    """Every collective (trees and rings, repeated triples) with every reduce op: the outputs
    against numpy (max/min bitwise, NaN and signed zeros included) and the CPU executor, bitwise."""
    from reference import check_outputs, v2_schedules

    harness = _ffi.load_testing()
    for name, s in v2_schedules(5, 5 * 2001, dtype, op, chunks=3).items():
        inputs = make_inputs(dtype, s.nranks, s.in_count, seed=len(name), specials=op != "sum")
        gpu = cuda.run_schedule(s.encode(), inputs, direct=direct)
        check_outputs(s, inputs, gpu)
        cpu = [np.zeros(s.out_count, NP_DTYPES[dtype]) for _ in range(s.nranks)]
        assert harness.run_ranks(s.encode(), inputs, cpu, 20000) == [None] * s.nranks
        for r in range(s.nranks):
            if s.collective != "reduce" or r == s.root:
                assert cpu[r].tobytes() == gpu[r].tobytes(), (name, r)


def test_v2_ring_reduce_scatter_repeats_without_host_sync(cuda):
    s = jbs.lower_ring([3, 1, 0, 2], collective="reduce_scatter", count=4 * 50_000, dtype="bfloat16",
                       chunks=4, op="min")
    inputs = make_inputs("bfloat16", 4, s.in_count, seed=9, specials=True)
    once = cuda.run_schedule(s.encode(), inputs)
    many = cuda.run_schedule(s.encode(), inputs, repeat=10)
    for a, b in zip(once, many):
        assert a.shape == (s.out_count,) and a.tobytes() == b.tobytes()
