"""A long run: many jitted psum calls and many distinct shapes keep memory and
jax_blink's caches bounded.

    python benchmarks/soak.py [--calls 10000] [--shapes 200] [--devices 8] [--out FILE]

Reports resident memory (RSS) at the start, after the calls and after the
shapes, and the sizes of jax_blink's own caches: the schedule cache
(``choice.requests.schedule_for``, an LRU of 256), the process plan cache
(``planning.cache``), the recorded decisions (64 at most) and the in-process
rendezvous (entries, active and pooled slots, tombstones). Each new shape is a
new trace, lowering and XLA compilation, so part of the memory growth over
the shapes is jax's own executable cache, reported separately as the number
of compiled executables jax keeps.
"""

import argparse
import json
import os
import sys
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--shapes", type=int, default=200)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={args.devices}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from jax_blink.settings import set_xla_cpu_threads  # imports no jax
    set_xla_cpu_threads()  # XLA CPU\'s threads: twice the devices
    import numpy as np
    import psutil

    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_blink
    from jax_blink import _ffi
    from jax_blink.choice import log as _decisions
    from jax_blink.choice import requests as _schedules
    from jax_blink.planning import cache

    proc = psutil.Process(os.getpid())
    n = args.devices
    mesh = jax.make_mesh((n,), ("i",))

    def caches():
        return {"schedules": _schedules.schedule_for.cache_info().currsize,
                "plans_in_process": len(cache._MEMORY_CACHE),
                "decisions": len(_decisions.recent()),
                "rendezvous": _ffi.load_testing().rendezvous_stats()}

    def snapshot(label, t0):
        row = {"at": label, "rss_mib": proc.memory_info().rss / 2**20,
               "seconds": time.perf_counter() - t0, **caches()}
        print(json.dumps(row), flush=True)
        return row

    def step_for(size):
        return jax.jit(jax.shard_map(lambda v: jax_blink.psum(v, "i") * (1.0 / n), mesh=mesh,
                                     in_specs=P("i"), out_specs=P("i")))

    t0 = time.perf_counter()
    x = jax.device_put(np.ones((n, 4096), np.float32), NamedSharding(mesh, P("i")))
    step = step_for(4096)
    for _ in range(50):  # warm up: compile, pools, rendezvous tables
        x = step(x)
    x.block_until_ready()
    rows = [snapshot("start", t0)]
    for k in range(args.calls):
        x = step(x)
        if k % 100 == 0:
            x.block_until_ready()
        if k == args.calls // 2:
            rows.append(snapshot(f"after {k} calls", t0))
    x.block_until_ready()
    ok_calls = bool(np.all(np.asarray(x) == 1.0))
    rows.append(snapshot(f"after {args.calls} calls", t0))
    for k in range(args.shapes):
        size = 1000 + 7 * k
        y = jax.device_put(np.ones((n, size), np.float32), NamedSharding(mesh, P("i")))
        out = step_for(size)(y)
        assert np.all(np.asarray(out) == 1.0), size
        if k == args.shapes // 2:
            rows.append(snapshot(f"after {k} shapes", t0))
    rows.append(snapshot(f"after {args.shapes} shapes", t0))
    result = {"calls": args.calls, "shapes": args.shapes, "devices": n, "calls_correct": ok_calls,
              "rows": rows}
    if args.out:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from _machine import machine

        result["machine"] = machine(jax=jax.__version__)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if ok_calls else 1


if __name__ == "__main__":
    sys.exit(main())
