"""Failure is all or nothing: jitted psums under timeouts so short that some
ranks fail, counting calls that return a wrong sum without an error.

    python benchmarks/stress_timeouts.py [--calls 2000] [--sizes 16 1048576]
        [--timeouts-ms 1 2 5] [--devices 8] [--out results.json]

Each device's result is checked on its own against the exact sum
(integer-valued float32 inputs, so any summation order gives the same bits):
it either raises (every rank of the call failed together) or holds the right
sum. Counts are per device result. The goal is 0 silently wrong results, 0
hangs and 0 crashes (the process is still running at the end, and a final
call with a normal timeout works).
"""

import argparse
import json
import os
import sys
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per (size, timeout)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 1 << 20])
    ap.add_argument("--timeouts-ms", type=float, nargs="+", default=[1, 2, 5])
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={args.devices}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from jax_blink.settings import set_xla_cpu_threads  # imports no jax
    set_xla_cpu_threads()  # XLA CPU\'s threads: twice the devices
    import numpy as np

    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_blink

    n = args.devices
    mesh = jax.make_mesh((n,), ("i",))
    rows = []
    for size in args.sizes:
        x = np.arange(n * size, dtype=np.float32).reshape(n, size) % 1000
        want = x.sum(0)
        xs = jax.device_put(x, NamedSharding(mesh, P("i")))
        for timeout_ms in args.timeouts_ms:
            f = jax.jit(jax.shard_map(
                lambda v, t=timeout_ms: jax_blink.psum(v, "i", timeout_s=t / 1000),
                mesh=mesh, in_specs=P("i"), out_specs=P("i")))
            ok = wrong = failed = 0
            messages = {}
            t0 = time.perf_counter()
            for _ in range(args.calls):
                # Each device's result on its own: a device whose collective
                # failed raises; one that returns must hold the right sum.
                try:
                    shards = f(xs).addressable_shards
                except Exception as e:  # noqa: BLE001 - every failure is counted, by kind
                    shards, kind = [], str(e).split(":")[0][:40]
                    messages[kind] = messages.get(kind, 0) + 1
                    failed += n
                for shard in shards:
                    try:
                        row = np.asarray(shard.data)[0]
                    except Exception as e:  # noqa: BLE001
                        failed += 1
                        kind = str(e).split(":")[0][:40]
                        messages[kind] = messages.get(kind, 0) + 1
                        continue
                    if np.array_equal(row, want):
                        ok += 1
                    else:
                        wrong += 1
            row = dict(size=size, timeout_ms=timeout_ms, calls=args.calls, ok=ok, failed=failed,
                       silently_wrong=wrong, seconds=time.perf_counter() - t0, errors=messages)
            rows.append(row)
            print(json.dumps(row), flush=True)
    # The process keeps working afterwards.
    g = jax.jit(jax.shard_map(lambda v: jax_blink.psum(v, "i"), mesh=mesh, in_specs=P("i"),
                              out_specs=P("i")))
    x = np.ones((n, 1000), np.float32)
    after = bool(np.all(np.asarray(g(jax.device_put(x, NamedSharding(mesh, P("i"))))) == n))
    print(f"a normal call afterwards: {'ok' if after else 'WRONG'}")
    total_wrong = sum(r["silently_wrong"] for r in rows)
    print(f"total: {sum(r['calls'] for r in rows)} calls, {total_wrong} silently wrong, "
          f"{sum(r['failed'] for r in rows)} raised")
    if args.out:
        from _machine import machine

        with open(args.out, "w") as fh:
            json.dump({"machine": machine(), "rows": rows, "normal_call_after": after}, fh,
                      indent=1)
    return 1 if total_wrong or not after else 0


if __name__ == "__main__":
    sys.exit(main())
