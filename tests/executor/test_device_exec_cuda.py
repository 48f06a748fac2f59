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
