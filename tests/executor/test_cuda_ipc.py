"""CUDA IPC on a GPU: two processes on one GPU export a device buffer that starts inside
its allocation (as XLA's do) and an interprocess event, hand each other the records
through the host transport's rendezvous, open each other's buffer and event
(cc/cuda/cuda_ipc.h) and read the peer's bytes, checked exactly.

Needs an NVIDIA GPU and the CUDA modules; without them it skips with the reason. The
exchange itself is tested without a GPU by tests/executor/test_host_exchange.py. What one
GPU cannot show: opening a handle made on another GPU (peer access between two devices)."""

import json
import subprocess
import sys

import numpy as np
import pytest


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
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(r), str(nbytes)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        arenas = [json.loads(p.stdout.readline()) for p in procs]
        for p in procs:
            p.stdin.write(json.dumps({"processes": arenas}) + "\n")
            p.stdin.flush()
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            outs.append(json.loads(out.splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    for rank, out in enumerate(outs):
        got = bytes.fromhex(out["peer"])
        assert got == pattern(nbytes, 1 - rank)
        assert got != pattern(nbytes, rank) or nbytes == 0  # the check tells the two buffers apart
        assert "is in this process" in out["own"]  # a process never opens its own handle
