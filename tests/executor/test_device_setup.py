"""The device executor's setup is complete before its first kernel, checked on CPU.

The device executor uploads its program and zeroes its flags and control words
once per executor (``cc/device/device_setup.h``). On a GPU its kernels run on
XLA's streams, which are non-blocking: they do not wait for the legacy default
stream, and a pageable copy or a memset may still be landing when the host
goes on to launch. The host build models that device memory:
``run_fresh_device_executors`` builds executors one after another in one
emulated memory whose freed blocks come back with their bytes (an earlier
executor's program, flags and control words), and whose setup writes land
only when the setup waits for them, or after a call (a late DMA). A setup
that let a kernel start before its writes landed would run with stale flags
(waits that pass at once) or an earlier program, so the first call of each
executor is checked against numpy, per element.
"""

import numpy as np
import pytest

from jax_blink import _ffi
from jax_blink.schedule import lower_ring
from reference import NP_DTYPES, check_outputs, make_inputs, v2_schedules

harness = _ffi.load_testing()


def schedules():
    """Trees and rings, several collectives and rank counts: 4 x 50 fresh executors."""
    v2 = v2_schedules(4, 4 * 1000 + 4 * 13, "float32", "sum", chunks=3)
    return [v2["trees:allreduce"], v2["trees:reduce_scatter"],
            v2_schedules(3, 3 * 700, "int32", "max", chunks=2)["trees:allreduce"],
            lower_ring(list(range(5)), collective="allreduce", count=5 * 401, dtype="float32",
                       chunks=3).validate()]


def inputs_for(s, seed):
    return make_inputs(s.dtype, s.nranks, s.in_count, seed, specials=s.op != "sum")


@pytest.mark.parametrize("index", range(4))
def test_the_first_call_of_every_fresh_executor_is_right(index):
    s = schedules()[index]
    inputs = inputs_for(s, index)
    runs = harness.run_fresh_device_executors(s.encode(), inputs, executors=50, calls=2,
                                              delayed_writes=True)
    assert len(runs) == 50
    for e, calls in enumerate(runs):
        for k, (errors, outputs) in enumerate(calls):
            assert errors == [None] * s.nranks, (e, k, errors)
            check_outputs(s, inputs, outputs)


def test_writes_that_land_at_once_give_the_same_bits():
    s = schedules()[0]
    inputs = inputs_for(s, 0)
    delayed = harness.run_fresh_device_executors(s.encode(), inputs, executors=3,
                                                 delayed_writes=True)
    at_once = harness.run_fresh_device_executors(s.encode(), inputs, executors=3,
                                                 delayed_writes=False)
    for a, b in zip(delayed, at_once):
        for x, y in zip(a[0][1], b[0][1]):
            assert x.tobytes() == y.tobytes()


def test_the_checker_rejects_a_stale_first_call():
    """What a first call with stale flags gives (a peer's value read before it was
    written: zeros, or a rank's contribution missing) fails check_outputs."""
    s = schedules()[0]
    inputs = inputs_for(s, 0)
    (errors, outputs), = harness.run_fresh_device_executors(s.encode(), inputs, executors=1)[0]
    assert errors == [None] * s.nranks
    check_outputs(s, inputs, outputs)
    zeros = [o.copy() for o in outputs]
    zeros[2][:] = 0
    without_rank_1 = [(o - inputs[1]).astype(o.dtype) for o in outputs]
    poisoned = [o.copy() for o in outputs]
    poisoned[0][17] = np.frombuffer(b"\xa5" * 4, np.float32)[0]  # an element never written
    for wrong in (zeros, without_rank_1, poisoned):
        with pytest.raises(AssertionError):
            check_outputs(s, inputs, wrong)


def test_a_program_of_another_executor_is_refused_naming_both():
    """The kernel checks the program's header (magic and executor id) first: memory that
    still holds another executor's program gives an error naming the executor and the
    call, and no rank writes its output."""
    s = schedules()[0]
    inputs = inputs_for(s, 1)
    fill = np.float32(3)
    outputs = [np.full(s.out_count, fill, NP_DTYPES[s.dtype]) for _ in range(s.nranks)]
    calls = harness.run_device_ranks(s.encode(), inputs, outputs, timeout_ms=20000,
                                     foreign_program=True)
    first, = calls
    for r, e in enumerate(first):
        assert e is not None and e.startswith("INTERNAL: jax_blink: device executor "), e
        executor = int(e.split("device executor ")[1].split(":")[0])
        assert f": generation 1 at rank {r} failed: " in e, e
        assert f"another program than executor {executor}'s" in e, e
        assert f"read a program header of executor {executor + 1000}" in e, e
    assert all((o == fill).all() for o in outputs)


def test_bad_arguments_raise():
    s = schedules()[0]
    inputs = inputs_for(s, 0)
    with pytest.raises(ValueError, match="executors and calls must be >= 1"):
        harness.run_fresh_device_executors(s.encode(), inputs, executors=0)
    with pytest.raises(ValueError, match="needs 4052 input elements"):
        harness.run_fresh_device_executors(s.encode(), [x[:3] for x in inputs], executors=1)
