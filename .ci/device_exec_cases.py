"""Writes the cases the device executor's ThreadSanitizer driver runs (.ci/sanitizers).

Usage: python .ci/device_exec_cases.py DIR. Each case (format in
cc/testing/device_exec_driver.cc) holds a schedule, the ranks' inputs and
the CPU executor's outputs (run_ranks of the normal build, checked against
numpy here first): every collective of tests/reference.v2_schedules with each
reduce op, float32, float16 and int64, a shuffled random schedule, repeated
calls, fewer blocks than peers, a rank that never starts and one that stops
in mid-call.
"""

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "executor"))

from reference import NP_DTYPES, check_outputs, v2_schedules  # noqa: E402
from test_device_exec import inputs_for, random_schedule, shuffled  # noqa: E402

from jax_blink import _ffi  # noqa: E402

harness = _ffi.load_testing()


def write(path, s, *, seed=0, skip_rank=-1, fault_rank=-1, fault_publishes=0, timeout_ms=20000,
          repeat=1, max_blocks=0):
    inputs = inputs_for(s, seed)
    outputs = [np.zeros(s.out_count, NP_DTYPES[s.dtype]) for _ in range(s.nranks)]
    assert harness.run_ranks(s.encode(), inputs, outputs, 20000) == [None] * s.nranks
    check_outputs(s, inputs, outputs)
    words = np.asarray(s.encode(), np.int64)
    mask = sum(1 << r for r in range(s.nranks) if s.collective != "reduce" or r == s.root)
    itemsize = np.dtype(NP_DTYPES[s.dtype]).itemsize
    header = [len(words), s.nranks, s.in_count * itemsize, s.out_count * itemsize, mask, skip_rank,
              fault_rank, fault_publishes, timeout_ms, repeat, max_blocks]
    with open(path, "wb") as f:
        f.write(np.asarray(header, np.int64).tobytes())
        f.write(words.tobytes())
        for x in inputs + outputs:
            f.write(np.ascontiguousarray(x).tobytes())


def main(out_dir):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for dtype in ("float32", "float16", "int64"):
        for op in ("sum", "max", "min"):
            for name, s in v2_schedules(4, 4 * 24, dtype, op).items():
                write(out / f"{n:03d}-{dtype}-{op}-{name.replace(':', '-')}.case", s, seed=n)
                n += 1
    for seed in range(3):
        s = shuffled(random_schedule(200 + seed), seed)
        write(out / f"{n:03d}-shuffled-{seed}.case", s, seed=seed, repeat=2)
        n += 1
    s = v2_schedules(6, 6 * 30, "float32", "sum", chunks=3)["trees:reduce_scatter"]
    write(out / f"{n:03d}-two-blocks.case", s, max_blocks=2, repeat=3)
    n += 1
    s = v2_schedules(4, 4 * 20, "float32", "sum", chunks=3)["ring:allreduce"]
    write(out / f"{n:03d}-never-starts.case", s, skip_rank=2, timeout_ms=500, repeat=2)
    n += 1
    write(out / f"{n:03d}-stops-mid-call.case", s, fault_rank=1, fault_publishes=2, timeout_ms=500, repeat=2)
    n += 1
    print(f"{n} device executor cases in {out}")


if __name__ == "__main__":
    main(sys.argv[1])
