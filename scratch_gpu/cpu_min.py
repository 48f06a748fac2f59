import sys, numpy as np
sys.path.insert(0, "tests")
from jax_blink import _ffi
from reference import lowered
ext = _ffi.load_extension()
print("validate", ext.validate_schedule(lowered(2, 1, "float32", 1)), flush=True)
sched = lowered(2, 1, "float32", 1)
inputs = [np.ones(1, np.float32), np.ones(1, np.float32)]
outs = [np.zeros(1, np.float32) for _ in inputs]
print("run", ext.run_ranks(sched, inputs, outs, 5000), outs, flush=True)
