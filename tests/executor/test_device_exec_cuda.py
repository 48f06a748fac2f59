"""The device executor on a GPU (``_blink_cuda_testing.run_device``: N ranks of one GPU,
one kernel launch per rank per call), bitwise against the CPU executor and numpy.

Skipped without a GPU (CI has none); the same interpreter runs in CI in its host
build (tests/executor/test_device_exec.py) and under ThreadSanitizer
(.ci/sanitizers). ``bash benchmarks/gpu_check.sh`` runs these where a GPU is.
"""

import numpy as np
import pytest

from jax_blink import _ffi
from jax_blink.schedule import lower_ring
from reference import NP_DTYPES, check_outputs, make_inputs, v2_schedules

pytestmark = pytest.mark.gpu
harness = _ffi.load_testing()

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint32"]


def inputs_for(s, seed=0):
    return make_inputs(s.dtype, s.nranks, s.in_count, seed, specials=s.op != "sum")


def run_cpu(s, inputs):
    outputs = [np.zeros(s.out_count, NP_DTYPES[s.dtype]) for _ in range(s.nranks)]
    assert harness.run_ranks(s.encode(), inputs, outputs, 20000) == [None] * s.nranks
    return outputs


def check_device(cuda, s, inputs, repeat=1):
    res = cuda.run_device(s.encode(), inputs, repeat=repeat)
    assert res["errors"] == [[None] * s.nranks] * repeat, res["errors"]
    out = res["outputs"]
    check_outputs(s, inputs, out)
    for r, (a, b) in enumerate(zip(run_cpu(s, inputs), out)):
        if s.collective != "reduce" or r == s.root:
            assert a.tobytes() == b.tobytes(), f"rank {r}: bits differ from the CPU executor's"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_every_collective_equals_the_cpu_executor_bitwise(cuda, dtype, op):
    for name, s in v2_schedules(4, 4 * 1000 + 4 * 37, dtype, op, chunks=3).items():
        check_device(cuda, s, inputs_for(s, len(name)))


@pytest.mark.parametrize("n", [2, 3, 8])
def test_rings_and_eight_ranks_over_repeated_calls(cuda, n):
    s = lower_ring(list(range(n)), collective="allreduce", count=n * 100_003, dtype="float32",
                   chunks=4).validate()
    check_device(cuda, s, inputs_for(s, n), repeat=5)


def test_the_first_call_of_every_fresh_executor_is_right(cuda):
    """Each run_device builds a new executor, in memory the previous one just freed (its
    flags' stale generations), and nothing but the executor orders its setup before its
    first kernel (cc/device/device_setup.h)."""
    for k in range(60):
        s = v2_schedules(4, 4 * 1000, "float32", "sum")[("trees:allreduce", "ring:allreduce")[k % 2]]
        inputs = inputs_for(s, k)
        res = cuda.run_device(s.encode(), inputs)
        assert res["errors"] == [[None] * 4], (k, res["errors"])
        check_outputs(s, inputs, res["outputs"])


def test_a_rank_that_never_starts_times_out_naming_it_then_the_next_call_succeeds(cuda):
    s = v2_schedules(4, 4 * 1000, "float32", "sum")["trees:allreduce"]
    inputs = inputs_for(s)
    res = cuda.run_device(s.encode(), inputs, repeat=2, timeout_ms=300, skip_ranks=[2])
    first, second = res["errors"]
    for r in (0, 1, 3):
        assert first[r].startswith("DEADLINE_EXCEEDED: ") and "rank(s) 2 never started" in first[r]
    assert second == [None] * 4
    check_outputs(s, inputs, res["outputs"])


def test_time_device_times_every_call(cuda):
    s = v2_schedules(8, 8 * 32768, "float32", "sum")["trees:allreduce"]
    t = cuda.time_device(s.encode(), iters=5)
    assert t["seconds"] > 0 and len(t["all_seconds"]) == 5


@pytest.fixture(scope="module")
def jax_gpus(cuda):
    import jax

    try:
        return jax.devices("gpu")
    except RuntimeError as e:
        pytest.skip(f"jax sees no GPU ({e})")


def test_the_xla_handler_runs_the_device_executor_when_configured(jax_gpus, capfd):
    """_blink_cuda.configure(executor="device") (JAX_BLINK_CUDA_EXECUTOR=device): executables
    instantiated afterwards run the device executor; the debug line says so."""
    import jax
    from jax.sharding import PartitionSpec as P

    import jax_blink
    from jax_blink import _blink_cuda
    from reference import check_sum, one_device_collective

    _ffi.ensure_registered("cuda")
    saved = _blink_cuda.configuration()
    try:
        _blink_cuda.configure(debug=True, executor="device")
        out, _ = one_device_collective(np.arange(1001, dtype=np.float32), jax_gpus[0])
        np.testing.assert_array_equal(np.asarray(out), np.arange(1001, dtype=np.float32))
        if len(jax_gpus) >= 2:
            n = len(jax_gpus)
            mesh = jax.sharding.Mesh(np.asarray(jax_gpus), ("x",))
            x = np.concatenate(make_inputs("float32", n, 100_003, seed=3))
            f = jax.jit(jax.shard_map(lambda v: jax_blink.psum(v, "x"), mesh=mesh,
                                      in_specs=P("x"), out_specs=P()))
            check_sum("float32", np.split(x, n), np.asarray(f(x)))
    finally:
        _blink_cuda.configure(**saved)
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("jax_blink cuda: op=")]
    assert lines and all(" executor=device " in ln and ln.endswith(" ok") for ln in lines), lines
