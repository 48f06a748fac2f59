"""The host transport's rendezvous between processes, without the executor: the CUDA IPC
handle exchange (ranks in several processes of one host publish their IPC records,
cc/sync/ipc_record.h, through cc/sync/host_rendezvous.h's HostRankArgs::blob, and every
rank receives every record exactly) and the limits of a host slot (ranks, steps, staging),
each a clear error. Making and opening real handles needs a GPU:
tests/executor/test_cuda_ipc.py.

Each worker process uses ``jax_blink._blink_testing`` (its own arena and attachment, as
``_blink_ext`` has in production) and runs its ranks on threads; processes meet only
through the (pid, fd) pairs this test hands them, and every one is reaped."""

import json
import os
import subprocess
import sys
import time

import pytest

from jax_blink import _ffi

_WORKER = r"""
import json, sys, threading
from jax_blink import _ffi
t = _ffi.load_testing()
print(json.dumps(list(t.host_arena())), flush=True)
job = json.loads(sys.stdin.readline())
t.host_attach(job["slot"], [tuple(p) for p in job["processes"]])
print("attached", flush=True)
sys.stdin.readline()  # every process has opened every arena: none may exit before
out = {}
def run(rank):
    try:
        blobs = t.host_exchange(7, 0, rank, job["nranks"], bytes.fromhex(job["blobs"][str(rank)]),
                                job["timeout_ms"], job.get("steps", 0), job["acc"].get(str(rank), 0))
        out[rank] = {"blobs": [b.hex() for b in blobs]}
    except RuntimeError as e:
        out[rank] = {"error": str(e)}
threads = [threading.Thread(target=run, args=(r,)) for r in job["ranks"]]
for th in threads: th.start()
for th in threads: th.join()
print(json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def testing():
    return _ffi.load_testing()


def record(testing, rank, pid=4242):
    """A record with fake handles that differ by rank."""
    return testing.ipc_record_encode(pid + rank, bytes([rank]) * 16, bytes([rank + 1]) * 64,
                                     [(bytes([rank + 7]) * 64, 256, 1000 + rank, 1 << 20),
                                      (bytes([rank + 9]) * 64, 0, 64, 64)])


def exchange(layout, blobs, timeout_ms=5000, wait_s=30, nranks=None, steps=0, acc=None):
    """Runs ``layout`` (the ranks of each process) over the host rendezvous of ``nranks``
    ranks (default: all of ``layout``'s), each rank publishing ``blobs[rank]`` (with
    ``steps`` schedule steps and ``acc[rank]`` accumulator bytes); returns
    {rank: {"blobs": [hex]} or {"error": str}} and the seconds it took."""
    nranks = nranks or sum(len(ranks) for ranks in layout)
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in layout]
    try:
        arenas = [json.loads(p.stdout.readline()) for p in procs]
        start = time.monotonic()
        for slot, (p, ranks) in enumerate(zip(procs, layout)):
            p.stdin.write(json.dumps({"slot": slot, "processes": arenas, "ranks": ranks,
                                      "nranks": nranks, "timeout_ms": timeout_ms, "steps": steps,
                                      "acc": {str(r): b for r, b in (acc or {}).items()},
                                      "blobs": {str(r): blobs[r].hex() for r in ranks}}) + "\n")
            p.stdin.flush()
        for p in procs:  # nobody may exit (closing its arena) before all have opened them
            if p.stdout.readline().strip() != "attached":
                raise AssertionError(p.communicate(timeout=wait_s)[1])
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = {}
        for p in procs:
            out, err = p.communicate(timeout=wait_s)
            assert p.returncode == 0, err
            results.update({int(k): v for k, v in json.loads(out.splitlines()[-1]).items()})
        return results, time.monotonic() - start
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def received_all(results, blobs):
    """Whether every rank received every rank's blob, byte for byte."""
    want = [b.hex() for b in blobs]
    return all(results[r].get("blobs") == want for r in range(len(blobs)))


@pytest.mark.parametrize("layout", [[[0], [1]], [[0, 1], [2, 3], [4, 5]], [[2], [0, 3], [1]]],
                         ids=["2x1", "3x2", "mixed"])
def test_every_rank_receives_every_record(testing, layout):
    nranks = sum(len(r) for r in layout)
    blobs = [record(testing, r) for r in range(nranks)]
    results, _ = exchange(layout, blobs)
    assert received_all(results, blobs), results
    for r in range(nranks):  # and each decodes to what its rank encoded
        got = testing.ipc_record_decode(bytes.fromhex(results[0]["blobs"][r]), r)
        assert got["pid"] == 4242 + r and got["uuid"] == bytes([r]) * 16
        assert got["event"] == bytes([r + 1]) * 64
        assert got["buffers"] == [(bytes([r + 7]) * 64, 256, 1000 + r, 1 << 20),
                                  (bytes([r + 9]) * 64, 0, 64, 64)]
    # the check rejects a wrong exchange: a record dropped, or two swapped
    dropped = {r: {"blobs": v["blobs"][:1] + [bytes(len(blobs[1])).hex()] + v["blobs"][2:]}
               for r, v in results.items()}
    assert not received_all(dropped, blobs)
    swapped = {r: {"blobs": [v["blobs"][1], v["blobs"][0]] + v["blobs"][2:]} for r, v in results.items()}
    assert not received_all(swapped, blobs)


def test_a_record_too_large_fails_every_rank_at_once(testing):
    big = b"x" * (testing.HOST_BLOB_BYTES + 1)
    results, seconds = exchange([[0], [1]], [record(testing, 0), big], timeout_ms=20000)
    assert "INVALID_ARGUMENT" in results[1]["error"] and "at most 512 fit" in results[1]["error"]
    assert "rank 1" in results[0]["error"]  # the peer learns it from the rendezvous,
    assert seconds < 10  # not from its 20 s timeout


def test_a_missing_rank_is_named_at_the_timeout(testing):
    blobs = [record(testing, r) for r in range(3)]
    # rank 2 is in no process: both processes' ranks time out naming it
    results, seconds = exchange([[0], [1]], blobs, timeout_ms=1500, nranks=3)
    for r in (0, 1):
        assert "DEADLINE_EXCEEDED" in results[r]["error"], results
        assert "rank(s) [2] never arrived" in results[r]["error"], results
    assert seconds < 15


@pytest.mark.parametrize("corrupt,message", [
    (lambda b: b[:-1], r"has 463 bytes, not 464"),
    (lambda b: b"\0" + b[1:], r"is not a version-1 jax_blink IPC record"),
    (lambda b: b[:16 + 8 + 16 + 4 + 64] + (5).to_bytes(4, "little") + b[16 + 8 + 16 + 4 + 64 + 4:],
     r"names 5 buffers"),
])
def test_a_damaged_record_is_refused(testing, corrupt, message):
    good = record(testing, 3)
    assert testing.ipc_record_decode(good, 3)["pid"] == 4245
    with pytest.raises(ValueError, match=message) as e:
        testing.ipc_record_decode(corrupt(good), 3)
    assert "the record of rank 3" in str(e.value)


def test_a_buffer_outside_its_allocation_is_refused(testing):
    beyond = testing.ipc_record_encode(9, bytes(16), None, [(bytes(64), 4096, 1, 4096)])
    with pytest.raises(ValueError, match=r"rank 5: buffer 0 \(1 bytes at offset 4096\) does not lie "
                                         r"in its allocation of 4096 bytes"):
        testing.ipc_record_decode(beyond, 5)
    assert testing.ipc_record_decode(testing.ipc_record_encode(9, bytes(16), None, [(bytes(64), 4095, 1, 4096)]),
                                     5)["event"] is None


def test_more_ranks_or_steps_than_a_host_slot_holds_are_refused(testing):
    many = exchange([[0]], [b""], nranks=65)[0]
    assert "INVALID_ARGUMENT" in many[0]["error"] and "at most 64 ranks" in many[0]["error"]
    steps = exchange([[0], [1]], [b"", b""], steps=(1 << 18) + 1)[0]
    for r in (0, 1):
        assert "262144 steps" in steps[r]["error"] and "fewer chunks" in steps[r]["error"]


def test_an_accumulator_beyond_the_staging_arena_fails_every_rank_at_once(testing):
    results, seconds = exchange([[0], [1]], [b"", b""], acc={1: 65 << 30}, timeout_ms=20000)
    assert "do not fit in the rest of this process's 64 GiB staging arena" in results[1]["error"]
    assert "rank 1" in results[0]["error"] and seconds < 10  # not at the 20 s timeout
