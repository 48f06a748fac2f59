"""The GPU executor's enqueueing (cc/stream/stream_exec.cc: StreamPlan and one
StreamRankExecutor per rank, each on its own thread, meeting through
JoinAndEnqueue as in the CUDA FFI handler) over the host stream emulator
(cc/testing/stream_emulator.cc), through ``_blink_testing.emulate_streams``: no GPU
needed.

The emulator queues every transport call on its stream, binds each event
wait to the event's latest record at call time (CUDA's rule), executes the
ops in a seeded random order those rules allow, computing on host memory
what the CUDA kernels compute, and reports every pair of unordered
conflicting accesses (vector-clock happens-before). Each rank has a caller
stream (XLA's) that writes its input before the collective and reuses the
input and output after it, so the entry and exit ordering is checked too.

Every positive test asserts no races, the numpy result (tests/reference.py)
and bit-identity with the CPU executor (``run_ranks``: the same summation
order by design). The negative tests drop one class of waits (``omit``) and
must see races.
"""

import functools
from types import SimpleNamespace

import numpy as np
import pytest

from jax_blink import _ffi
from jax_blink.planning import plan
from jax_blink.schedule import Schedule, Step, lower_trees
from jax_blink.sim.baselines import BASELINES, baseline
from jax_blink.topo import Topology
from reference import NP_DTYPES, assert_bit_identical, check_sum, lowered, make_inputs

ext = _ffi.load_extension()
harness = _ffi.load_testing()

OMIT_BITS = {
    "entry": harness.OMIT_ENTRY_WAITS,
    "deps": harness.OMIT_DEP_WAITS,
    "guards": harness.OMIT_GUARDS,
    "exit": harness.OMIT_EXIT_WAITS,
}


# ------------------------------------------------------------------ helpers
def info(sched):
    return ext.validate_schedule(sched)


def emulate(sched, inputs, **kw):
    res = harness.emulate_streams(sched, inputs, **kw)
    assert res["errors"] == [None] * len(inputs)
    assert res["races"] == [], "\n".join(res["races"][:5])
    st = res["stats"]
    assert st["races"] == 0
    # Everything queued ran; the executor released all it created (only
    # the callers' streams are left).
    assert st["executed"] == sum(st[k] for k in ("copy", "reduce", "to_acc", "finalize",
                                                  "record", "wait", "touch"))
    assert (st["live_streams"], st["live_events"], st["live_alloc_bytes"]) == (len(inputs), 0, 0)
    return res


def cpu_outputs(sched, inputs, alias=False):
    outs = [x.copy() for x in inputs] if alias else [np.zeros_like(x) for x in inputs]
    errors = harness.run_ranks(sched, outs if alias else inputs, outs, 20000)
    assert errors == [None] * len(inputs)
    return outs


def check(sched, inputs, **kw):
    """Emulates `sched`, asserts no races, the numpy reference and equality
    with the CPU executor; returns the emulator's result."""
    res = emulate(sched, inputs, **kw)
    out = res["outputs"]
    for a, b in zip(cpu_outputs(sched, inputs, alias=kw.get("alias", False)), out):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()
    meta = info(sched)
    dtype, collective, root = meta["dtype"], meta["collective"], meta["root"]
    if collective == "allreduce":
        check_sum(dtype, inputs, out[0])
        assert_bit_identical(out)
    elif collective == "broadcast":
        for o in out:
            assert o.tobytes() == inputs[root].tobytes()
    else:  # reduce: the root holds the sum (the others' outputs are unspecified)
        check_sum(dtype, inputs, out[root])
    return res


@functools.lru_cache(maxsize=None)
def topology(preset, ranks=None):
    t = Topology.preset(preset)
    return t if ranks is None else t.subset(list(ranks))


@functools.lru_cache(maxsize=None)
def planned(preset, ranks, collective):
    return plan(topology(preset, ranks), collective)


def encode(schedule):
    return np.asarray(schedule.validate().encode())


def peer_matrix(topo):
    """Peer access as on a real machine: between ranks joined by a link or
    sharing a switch (e.g. DGX-1 GPUs that are not NVLink neighbours and
    sit under different PCIe switches have none)."""
    n = topo.n
    nbrs = {}
    for link in topo.links:
        nbrs.setdefault(link.u, set()).add(link.v)
        nbrs.setdefault(link.v, set()).add(link.u)
    peer = np.eye(n, dtype=bool)
    for a in range(n):
        for b in range(n):
            if b in nbrs.get(a, ()) or any(s >= n and b in nbrs.get(s, ())
                                           for s in nbrs.get(a, ())):
                peer[a, b] = True
    return peer


DEVICES = {
    "one-gpu": lambda n: None,  # every rank on device 0, as the CUDA harness
    "per-rank": lambda n: list(range(n)),
}


# ------------------------------------------------------------------ results
@pytest.mark.parametrize("devices", list(DEVICES))
@pytest.mark.parametrize("dtype", list(NP_DTYPES))
@pytest.mark.parametrize("nranks", [2, 3, 4, 5, 6, 7, 8])
def test_lowered_allreduce(devices, dtype, nranks):
    sched = lowered(nranks, 1000, dtype, chunks=3)
    inputs = make_inputs(dtype, nranks, 1000, seed=nranks)
    check(sched, inputs, devices=DEVICES[devices](nranks), seed=nranks)


@pytest.mark.parametrize("dtype", ["float16", "int64"])
@pytest.mark.parametrize("count,chunks", [(1, 1), (7, 5), (4099, 7)])
def test_odd_sizes(dtype, count, chunks):
    sched = lowered(5, count, dtype, chunks=chunks)
    inputs = make_inputs(dtype, 5, count, seed=count)
    check(sched, inputs, devices=[0, 1, 2, 0, 1])


PLANNED = [("dgx1-v100", None), ("dgx1-v100", (0, 3, 5)), ("dgx1-v100", (1, 2, 4, 5, 7)),
           ("dgx-a100", None), ("hgx-h100", None), ("pcie", None), ("shm:4", None)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("collective", ["allreduce", "broadcast", "reduce"])
@pytest.mark.parametrize("preset,ranks", PLANNED,
                         ids=[f"{p}{'' if r is None else list(r)}" for p, r in PLANNED])
def test_planned_one_device_per_rank_with_peer_access_of_the_machine(
        dtype, collective, preset, ranks):
    """The product path: planner schedules, one device per rank, peer access
    only where the machine has it, so some links read directly and the
    others stage their reads through copies."""
    topo = topology(preset, ranks)
    n = topo.n
    itemsize = np.dtype(NP_DTYPES[dtype]).itemsize
    sched = encode(planned(preset, ranks, collective).lower(3001 * itemsize, dtype, chunks=2))
    inputs = make_inputs(dtype, n, 3001, seed=n)
    peer = peer_matrix(topo)
    res = check(sched, inputs, devices=list(range(n)), peer=peer)
    assert res["stats"]["staged_links"] == int((~peer).sum())


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", BASELINES)
@pytest.mark.parametrize("preset,ranks", [("dgx1-v100", None), ("dgx1-v100", (0, 3, 5, 6)),
                                          ("hgx-h100", (0, 1, 2))])
def test_baselines(dtype, name, preset, ranks):
    topo = topology(preset, ranks)
    itemsize = np.dtype(NP_DTYPES[dtype]).itemsize
    sched = encode(baseline(name, topo, 2000 * itemsize, dtype))
    inputs = make_inputs(dtype, topo.n, 2000, seed=3)
    check(sched, inputs)
    check(sched, inputs, devices=list(range(topo.n)), seed=1)


@pytest.mark.parametrize("dtype", list(NP_DTYPES))
@pytest.mark.parametrize("nranks", [2, 5, 8])
def test_staged_everywhere(dtype, nranks):
    """direct=False: every kernel reads staged copies, as between devices
    without peer access."""
    sched = lowered(nranks, 999, dtype, chunks=4)
    inputs = make_inputs(dtype, nranks, 999, seed=1)
    res = check(sched, inputs, devices=list(range(nranks)), direct=False)
    assert res["stats"]["staged_links"] == nranks * (nranks - 1)


def test_no_peer_access_at_all_stages_every_link():
    n = 6
    sched = lowered(n, 500, "bfloat16", chunks=3)
    inputs = make_inputs("bfloat16", n, 500)
    res = check(sched, inputs, devices=list(range(n)), peer=np.eye(n, dtype=bool))
    assert res["stats"]["staged_links"] == n * (n - 1)
    assert res["stats"]["copy"] > 0


@pytest.mark.parametrize("devices", list(DEVICES))
@pytest.mark.parametrize("dtype", list(NP_DTYPES))
def test_output_aliasing_input(devices, dtype):
    sched = lowered(8, 2001, dtype, chunks=4)
    inputs = make_inputs(dtype, 8, 2001, seed=2)
    check(sched, inputs, alias=True, devices=DEVICES[devices](8))


@pytest.mark.parametrize("alias", [False, True], ids=["separate", "alias"])
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "staged"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
def test_repeated_enqueues_reuse_the_executor(alias, direct, dtype):
    """repeat=3: three calls on the same executors, the caller reading the
    output and rewriting the input between them; races are checked across
    the calls (scratch, staging and events are reused)."""
    sched = lowered(7, 1500, dtype, chunks=5)
    inputs = make_inputs(dtype, 7, 1500, seed=4)
    once = check(sched, inputs, alias=alias, direct=direct, devices=list(range(7)))
    again = check(sched, inputs, alias=alias, direct=direct, devices=list(range(7)), repeat=3)
    for a, b in zip(once["outputs"], again["outputs"]):
        assert a.tobytes() == b.tobytes()
    assert again["stats"]["touch"] == 7 * 4


@pytest.mark.parametrize("seed", range(6))
def test_execution_order_does_not_change_the_result(seed):
    sched = encode(planned("dgx1-v100", (1, 2, 4, 5, 7), "allreduce").lower(4000 * 2, "float16",
                                                                             chunks=4))
    inputs = make_inputs("float16", 5, 4000, seed=9)
    check(sched, inputs, seed=seed, devices=[0, 1, 2, 3, 4], repeat=2)


def test_float16_accumulates_in_float32_and_rounds_once():
    # Rounding after every add would give 2048 (1 is half an ulp at 2048).
    star = SimpleNamespace(root=7, edges=[(7, i) for i in range(7)], weight=1.0)
    sched = encode(lower_trees([star], nranks=8, collective="allreduce", count=1,
                               dtype="float16", chunks=1))
    inputs = [np.array([1.0], np.float16)] * 7 + [np.array([2048.0], np.float16)]
    out = emulate(sched, inputs)["outputs"]
    assert [float(o[0]) for o in out] == [2056.0] * 8


def test_single_rank_copies_input():
    sched = encode(Schedule(1, 10, "allreduce", -1, "float32", 1, ((0, 5), (5, 5)), ((),)))
    x = [np.arange(10, dtype=np.float32)]
    for alias in (False, True):
        np.testing.assert_array_equal(emulate(sched, x, alias=alias)["outputs"][0], x[0])


# ------------------------------------------------- missing waits are races
def wasted_receive(dtype, count):
    """Rank 0 sends its partial sum to rank 2 (which completes it) and to
    rank 1, which only overwrites it later: nothing but rank 0's guard orders
    rank 1's read before rank 0 overwrites the chunk with the full sum.
    (In planner and baseline schedules every guard is also implied by a
    dependency chain, so dropping guards shows no race there.)"""
    S, RR, RC = "SEND", "RECV_REDUCE", "RECV_COPY"
    steps = (
        (Step(RR, 0, 1), Step(S, 0, 2, deps=(0,)), Step(S, 0, 1, deps=(0,)),
         Step(RC, 0, 2, deps=(0, 1, 2))),
        (Step(S, 0, 0), Step(RC, 0, 0, deps=(0,)), Step(RC, 0, 2, deps=(1,))),
        (Step(RR, 0, 0), Step(S, 0, 0, deps=(0,)), Step(S, 0, 1, deps=(0,))),
    )
    return encode(Schedule(3, count, "allreduce", -1, dtype, 1, ((0, count),), steps))


def test_wasted_receive_schedule_is_race_free_with_guards():
    inputs = make_inputs("float32", 3, 100)
    check(wasted_receive("float32", 100), inputs)
    check(wasted_receive("float16", 100), make_inputs("float16", 3, 100), devices=[0, 1, 2])


def on_caller_stream(race):
    """Whether one of the two ops of a race runs on a caller stream."""
    return "on stream" in race and "'caller[" in race


# Entry and exit waits order the link streams against the callers' streams
# (the input written, the snapshot of an aliased input taken, the output
# finalized, the buffers reused); dependency waits and guards order link
# streams among themselves.
BETWEEN_CALLER_AND_LINKS = {"entry": True, "exit": True, "deps": False, "guards": False}


@pytest.mark.parametrize("alias", [False, True], ids=["separate", "alias"])
@pytest.mark.parametrize("devices", list(DEVICES))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("what", list(OMIT_BITS))
def test_each_omitted_class_of_waits_is_a_race(what, dtype, devices, alias):
    if what == "guards":
        sched, n = wasted_receive(dtype, 300), 3
    else:
        sched, n = lowered(5, 300, dtype, chunks=3), 5
    inputs = make_inputs(dtype, n, 300)
    res = harness.emulate_streams(sched, inputs, omit=OMIT_BITS[what],
                                  devices=DEVICES[devices](n), alias=alias)
    races = res["races"]
    assert races and res["stats"]["races"] >= 1
    assert all(r.startswith("race: ") or r.endswith("more races") for r in races)
    if BETWEEN_CALLER_AND_LINKS[what]:
        assert any(on_caller_stream(r) for r in races), races[:3]
    else:
        assert not any(on_caller_stream(r) for r in races), races[:3]


def test_omitted_entry_waits_race_with_the_next_calls_input_too():
    sched = lowered(4, 256, "float32", chunks=2)
    res = harness.emulate_streams(sched, make_inputs("float32", 4, 256), repeat=2,
                                  omit=harness.OMIT_ENTRY_WAITS)
    assert any("'caller reads out, writes next in'" in r for r in res["races"])


def test_race_list_is_capped_and_counted():
    sched = lowered(8, 4000, "float32", chunks=8)
    res = harness.emulate_streams(sched, make_inputs("float32", 8, 4000),
                                  omit=harness.OMIT_DEP_WAITS | harness.OMIT_EXIT_WAITS)
    total = res["stats"]["races"]
    assert total > 50
    assert len(res["races"]) == 51 and res["races"][-1] == f"... and {total - 50} more races"


# ---------------------------------------------------------------- arguments
def test_bad_arguments_raise():
    sched = lowered(3, 10, "float32", chunks=2)
    x = make_inputs("float32", 3, 10)
    with pytest.raises(ValueError, match="need 3 inputs"):
        harness.emulate_streams(sched, x[:2])
    with pytest.raises(ValueError, match="elements"):
        harness.emulate_streams(sched, [np.zeros(11, np.float32)] * 3)
    with pytest.raises(ValueError, match="itemsize"):
        harness.emulate_streams(sched, [np.zeros(10, np.float64)] * 3)
    with pytest.raises(ValueError, match="one device per rank"):
        harness.emulate_streams(sched, x, devices=[0, 1])
    with pytest.raises(ValueError, match="peer"):
        harness.emulate_streams(sched, x, devices=[0, 1, 2], peer=np.ones((2, 2), bool))
    with pytest.raises(ValueError, match="repeat"):
        harness.emulate_streams(sched, x, repeat=0)
    with pytest.raises(ValueError, match="invalid jax_blink schedule"):
        harness.emulate_streams(sched[:-1], x)


# ------------------------------------------- the CUDA handler's host protocol
@pytest.mark.parametrize("devices", ["one-gpu", "gpu-per-rank"])
@pytest.mark.parametrize("nranks", [2, 5, 8])
def test_each_rank_enqueues_its_own_part_call_after_call(nranks, devices):
    """The ranks meet on threads through JoinAndEnqueue, as the CUDA FFI
    handler does, and each enqueues its own part, three calls in a row."""
    sched = lowered(nranks, 3001, "bfloat16", 4)
    inputs = make_inputs("bfloat16", nranks, 3001, seed=nranks)
    dev = [0] * nranks if devices == "one-gpu" else list(range(nranks))
    res = emulate(sched, inputs, devices=dev, repeat=3, seed=nranks)
    assert res["errors"] == [None] * nranks
    check_sum("bfloat16", inputs, res["outputs"][0])
    assert_bit_identical(res["outputs"])


def test_handler_protocol_times_out_naming_the_missing_rank():
    sched = lowered(4, 100, "float32", 1)
    res = harness.emulate_streams(sched, make_inputs("float32", 4, 100), skip_ranks=[2],
                                  timeout_ms=200)
    assert res["errors"][2] == "skipped"
    for r in (0, 1, 3):
        assert res["errors"][r].startswith("DEADLINE_EXCEEDED: ")
        assert "timed out after 200 ms" in res["errors"][r]
        assert "rank(s) [2] never arrived" in res["errors"][r]


def test_handler_protocol_fails_every_rank_on_one_bad_buffer():
    sched = lowered(3, 100, "float32", 1)
    res = harness.emulate_streams(sched, make_inputs("float32", 3, 100), bad_count_rank=1)
    assert len(set(res["errors"])) == 1  # the same verdict everywhere
    assert res["errors"][0].startswith("INVALID_ARGUMENT: ")
    assert "rank 1: the buffers have 101 (input) and 101 (output) elements" in res["errors"][0]
    assert "the allreduce schedule's are 100 and 100" in res["errors"][0]
    assert res["stats"]["exec_kernels"] == 0  # nothing was enqueued


# ----------------------------------------------- fewer calls, no allocation
def test_reduce_scatter_at_each_root_is_one_fused_kernel():
    """shm:8 plans reduce each rank's slice at its root from the 7 others: the
    7 RECV_REDUCEs fuse into one 8-operand kernel (6 join the first), per
    root and chunk."""
    topo = topology("shm:8")
    for chunks in (1, 3):
        sched = encode(planned("shm:8", None, "allreduce").lower(8000 * 4, "float32",
                                                                 chunks=chunks))
        res = check(sched, make_inputs("float32", 8, 8000))
        ntrees = info(sched)["ntrees"]
        assert res["stats"]["fused_steps"] == ntrees * chunks * (topo.n - 2)
        assert res["stats"]["exec_kernels"] == ntrees * chunks  # one reduction per root chunk


@pytest.mark.parametrize("dtype,direct,alias", [("float32", True, False), ("bfloat16", True, False),
                                                ("float32", False, False), ("int32", True, True)])
def test_workspace_is_what_the_dtype_staging_and_aliasing_need(dtype, direct, alias):
    """The executor allocates nothing; its workspace per rank: a float32
    accumulator for f16/bf16, a snapshot of an aliased input, and staging for
    the chunks each staged reduction reads (a plain copy needs none)."""
    n, count = 4, 1000
    sched = lowered(n, count, dtype, chunks=2)
    res = check(sched, make_inputs(dtype, n, count), direct=direct, alias=alias,
                devices=list(range(n)))
    itemsize = np.dtype(NP_DTYPES[dtype]).itemsize
    align = lambda b: -(-b // 256) * 256  # noqa: E731
    want = (align(count * 4) if dtype == "bfloat16" else 0) + (align(count * itemsize) if alias else 0)
    if direct:
        assert res["stats"]["max_workspace_bytes"] == want
        assert res["stats"]["staged_links"] == 0
    else:
        assert res["stats"]["max_workspace_bytes"] > want
        assert res["stats"]["staged_links"] == n * (n - 1)


# ------------------------------------------- ranks of several processes (CUDA IPC)
@pytest.mark.parametrize("alias", [False, True], ids=["separate", "alias"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ranks_meeting_through_proxies_of_their_views_are_race_free(dtype, alias, seed):
    """The meeting of ranks in several processes (tests/executor/test_cuda_ipc.py runs it
    over CUDA IPC on a GPU): each rank reads its peers only through proxies (their buffers
    as PeerBuffers gives them, their events) and their progress where they publish it.
    No races, the numpy sum, the CPU executor's bits, call after call."""
    itemsize = np.dtype(NP_DTYPES[dtype]).itemsize
    for sched in [lowered(5, 3001, dtype, chunks=3),
                  encode(baseline("nccl-ring", topology("dgx1-v100", (0, 3, 5, 6)), 2000 * itemsize,
                                  dtype))]:
        n = info(sched)["nranks"]
        inputs = make_inputs(dtype, n, info(sched)["count"], seed=seed)
        check(sched, inputs, proxies=True, alias=alias, repeat=2, seed=seed,
              devices=[r % 2 for r in range(n)])


def test_the_proxied_meeting_stages_reads_where_peers_cannot_read_each_other():
    sched = lowered(4, 2000, "float16", chunks=2)
    res = check(sched, make_inputs("float16", 4, 2000), proxies=True, direct=False,
                devices=[0, 1, 2, 3])
    assert res["stats"]["staged_links"] > 0


def test_the_proxied_meeting_catches_a_missing_wait():
    """The race checker still sees what proxies hide: dropping the dependency waits races."""
    sched = lowered(5, 300, "float32", chunks=3)
    res = harness.emulate_streams(sched, make_inputs("float32", 5, 300), proxies=True,
                                  omit=harness.OMIT_DEP_WAITS)
    assert res["races"]
