"""The single-GPU harness's own ordering, on CPU (issue 42).

``_blink_cuda_testing.run_schedule`` runs N simulated ranks of a schedule on
one GPU through ``cc/testing/sim_ranks.h``; ``_blink_testing.emulate_run_schedule``
runs the very same harness code over the host stream emulator, whose race
checker sees the harness's uploads and reads as well as the executor's work.

The harness once uploaded inputs with a blocking ``cudaMemcpy`` on the legacy
default stream; the executor's streams are non-blocking, so nothing ordered a
peer's read after the upload, and with several test processes sharing a GPU
ranks summed partly-uploaded inputs (a peer's contribution missing in 88-96 of
1,000 elements). ``legacy_upload=True`` recreates that order: the checker must
flag it, and the sums it gives must fail the same checks the fixed harness
passes.
"""

import pytest

from jax_blink import _ffi
from reference import assert_bit_identical, check_outputs, check_sum, lowered, make_inputs, v2_schedules

harness = _ffi.load_testing()


def run(sched, inputs, **kw):
    return harness.emulate_run_schedule(sched, inputs, **kw)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "staged"])
@pytest.mark.parametrize("nranks,count,chunks", [(2, 1000, 3), (3, 1000, 3), (5, 4099, 7),
                                                 (8, 10_001, 4)])
def test_harness_uploads_on_each_caller_stream_race_free(direct, nranks, count, chunks):
    sched = lowered(nranks, count, "float32", chunks)
    inputs = make_inputs("float32", nranks, count, seed=nranks)
    for seed in range(4):
        res = run(sched, inputs, direct=direct, seed=seed, repeat=2)
        assert res["races"] == [], "\n".join(res["races"][:3])
        check_sum("float32", inputs, res["outputs"][0])
        assert_bit_identical(res["outputs"])


@pytest.mark.parametrize("op", ["sum", "max"])
def test_harness_runs_every_v2_collective_race_free(op):
    for name, s in v2_schedules(4, 4 * 501, "uint32", op, chunks=3).items():
        inputs = make_inputs("uint32", s.nranks, s.in_count, seed=len(name), specials=op != "sum")
        res = run(s.encode(), inputs, seed=len(name))
        assert res["races"] == [], (name, res["races"][:3])
        check_outputs(s, inputs, res["outputs"])


def test_race_checker_flags_the_old_legacy_stream_upload():
    sched = lowered(2, 1000, "float32", 3)
    inputs = make_inputs("float32", 2, 1000)
    res = run(sched, inputs, legacy_upload=True)
    assert res["race_count"] > 0
    assert any("'harness writes in[" in r and "'legacy default stream'" in r for r in res["races"])


def test_old_upload_order_gives_sums_the_checks_reject():
    """Some execution orders the old upload allowed sum an input before it
    arrived: the same per-element checks the tests use reject those outputs."""
    sched = lowered(2, 1000, "float32", 3)
    inputs = make_inputs("float32", 2, 1000)
    rejected = 0
    for seed in range(16):
        out = run(sched, inputs, seed=seed, legacy_upload=True)["outputs"]
        try:
            check_sum("float32", inputs, out[0])
        except AssertionError:
            rejected += 1
    assert rejected > 0
