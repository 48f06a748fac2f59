"""CUDA IPC on a GPU: two processes on one GPU export a device buffer that starts inside
its allocation (as XLA's do) and an interprocess event, hand each other the records
through the host transport's rendezvous, open each other's buffer and event
(cc/cuda/cuda_ipc.h) and read the peer's bytes, checked exactly.

Needs an NVIDIA GPU and the CUDA modules; without them it skips with the reason. The
exchange itself is tested without a GPU by tests/executor/test_host_exchange.py. What one
GPU cannot show: opening a handle made on another GPU (peer access between two devices)."""

import numpy as np
import pytest

from ipc_workers import CUDA_WORKER_PREAMBLE, run_workers


pytestmark = pytest.mark.gpu

_WORKER = r"""
import json, sys
from jax_blink import _ffi
t, cuda = _ffi.load_testing(), _ffi.load_cuda_testing()
rank, nbytes = int(sys.argv[1]), int(sys.argv[2])
print(json.dumps(list(t.host_arena())), flush=True)
job = json.loads(sys.stdin.readline())
t.host_attach(rank, [tuple(p) for p in job["processes"]])
mine = cuda.ipc_export_test_buffer(0, nbytes, rank)
records = t.host_exchange(11, 0, rank, 2, mine, 20000)
out = {"peer": cuda.ipc_read_peer(0, records[1 - rank], 1 - rank).hex()}
try:
    cuda.ipc_read_peer(0, mine, rank)
except RuntimeError as e:
    out["own"] = str(e)
t.host_exchange(12, 0, rank, 2, b"", 20000)  # the peer has read: close and free
cuda.ipc_close()
print(json.dumps(out), flush=True)
"""


def pattern(nbytes, seed):
    return ((np.arange(nbytes, dtype=np.int64) * 31 + seed) % 256).astype(np.uint8).tobytes()


@pytest.mark.parametrize("nbytes", [1, 4099, 8 << 20])
def test_two_processes_on_one_gpu_read_each_others_buffer(cuda, nbytes):
    outs = run_workers(_WORKER, 2, nbytes, timeout=120)
    for rank, out in enumerate(outs):
        got = bytes.fromhex(out["peer"])
        assert got == pattern(nbytes, 1 - rank)
        assert got != pattern(nbytes, rank) or nbytes == 0  # the check tells the two buffers apart
        assert "is in this process" in out["own"]  # a process never opens its own handle


# ------------------------------------------------ the stream executor across processes
_RUN_WORKER = CUDA_WORKER_PREAMBLE + r"""
errors = {}
for i, case in enumerate(job["cases"]):
    sched = np.fromfile(f"{job_dir}/{case}_sched{rank}.bin", dtype=np.int64)
    x = np.fromfile(f"{job_dir}/{case}_in{rank}.bin", dtype=job["np_dtype"])
    try:
        out = cuda.ipc_run_rank(sched, rank, x, site=i + 1, calls=job["calls"], timeout_ms=20000)
        out.tofile(f"{job_dir}/{case}_out{rank}.bin")
    except RuntimeError as e:
        errors[case] = str(e)
print(json.dumps(errors), flush=True)
"""


def run_across_processes(tmp_path, nprocs, cases, np_dtype, calls=2):
    """Runs each case ({name: [schedule of each rank]}, inputs written beforehand) with one
    rank per process; returns each process's {case: error message}."""
    for name, schedules in cases.items():
        for r, s in enumerate(schedules):
            np.asarray(s.encode(), dtype=np.int64).tofile(tmp_path / f"{name}_sched{r}.bin")
    return run_workers(_RUN_WORKER, nprocs, tmp_path, cases=list(cases), np_dtype=np_dtype,
                       calls=calls)


@pytest.mark.parametrize("nprocs, dtype, op", [(2, "float32", "sum"), (3, "bfloat16", "sum"),
                                               (3, "float16", "max"), (4, "int32", "sum")])
def test_the_stream_executor_runs_ranks_of_several_processes_over_cuda_ipc(cuda, tmp_path, nprocs,
                                                                          dtype, op):
    """One rank per process on one GPU: every collective (trees and rings) against numpy, the
    peers' inputs, accumulators and events opened through CUDA IPC, two calls in a row."""
    from reference import check_outputs, make_inputs, v2_schedules

    schedules = v2_schedules(nprocs, nprocs * 1001, dtype, op, chunks=3)
    cases, inputs = {}, {}
    for name, s in schedules.items():
        case = name.replace(":", "_")
        cases[case] = [s] * nprocs
        inputs[case] = make_inputs(dtype, s.nranks, s.in_count, seed=len(name), specials=op != "sum")
        for r, x in enumerate(inputs[case]):
            x.tofile(tmp_path / f"{case}_in{r}.bin")
    np_dtype = inputs[case][0].dtype
    raw = "uint16" if dtype == "bfloat16" else np_dtype.name
    errors = run_across_processes(tmp_path, nprocs, cases, raw)
    assert errors == [{}] * nprocs
    for case, (s, *_) in cases.items():
        outs = [np.fromfile(tmp_path / f"{case}_out{r}.bin", dtype=raw).view(np_dtype)
                for r in range(nprocs)]
        check_outputs(s, inputs[case], outs)


def test_processes_that_run_different_schedules_fail_with_a_clear_error(cuda, tmp_path):
    from reference import make_inputs, v2_schedules

    a = v2_schedules(2, 2002, "float32", "sum", chunks=2)["trees:allreduce"]
    b = v2_schedules(2, 2002, "float32", "sum", chunks=3)["trees:allreduce"]
    for r, x in enumerate(make_inputs("float32", 2, a.in_count)):
        x.tofile(tmp_path / f"mismatch_in{r}.bin")
    errors = run_across_processes(tmp_path, 2, {"mismatch": [a, b]}, "float32", calls=1)
    for e in errors:
        assert "mismatch" in e and "schedule" in e["mismatch"], e
