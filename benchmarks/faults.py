"""Failure is all or nothing: what calls do when ranks time out or a process fails them.

* ``timeouts``: jitted psums on CPU devices of one process under timeouts so short that
  some ranks fail. Each device's result is checked on its own against the exact sum
  (integer-valued float32 inputs, so any summation order gives the same bits): it either
  raises (every rank of the call failed together) or holds the right sum. Counts are per
  device result. The goal is 0 silently wrong results, 0 hangs and 0 crashes (the process
  is still running at the end, and a final call with a normal timeout works).
* ``processes``: what a multi-process psum does when a process fails it: how long the
  survivor takes to fail, and with which error (docs/multihost.md). Each scenario is a
  2 x 4 CPU-device job of tests/multiprocess/worker.py, psum over ("host", "local"):
  ``absent`` (process 1 never makes the first call), ``dies`` (after one call both made,
  process 1 exits), ``absent-later`` (after one call both made, process 1, alive, skips
  the next), ``killed`` (process 1 is SIGKILLed while its ranks wait inside a call). By
  default the processes share memory (the host transport); ``--no-host-transport`` runs
  the path processes on different hosts take (in-process phases, gloo across). Every
  process still running at ``--limit`` seconds is killed (reported as "killed"). About 5
  minutes with the default limits.

    python benchmarks/faults.py timeouts [--calls 2000] [--sizes 16 1048576] [--timeouts-ms 1 2 5]
        [--devices 8] [--out FILE]
    python benchmarks/faults.py processes [--scenarios absent dies absent-later killed]
        [--no-host-transport] [--limit 150] [--json FILE]

Writes ``benchmarks/results/timeouts_<machine>.json`` and
``multiprocess_faults_<machine>.json`` (``--machine``: another name; ``--out``/``--json``:
another file). ``timeouts`` exits 1 when a result was silently wrong or the final call
failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import harness

WORKER = harness.ROOT / "tests" / "multiprocess" / "worker.py"
SCENARIOS = ["absent", "dies", "absent-later", "killed"]


def timeouts(args) -> int:
    harness.cpu_devices(args.devices)  # before jax is imported
    import numpy as np

    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_blink

    def kind(e: Exception) -> str:
        return str(e).split(":")[0][:40]

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
                    shards = []
                    messages[kind(e)] = messages.get(kind(e), 0) + 1
                    failed += n
                for shard in shards:
                    try:
                        row = np.asarray(shard.data)[0]
                    except Exception as e:  # noqa: BLE001
                        failed += 1
                        messages[kind(e)] = messages.get(kind(e), 0) + 1
                        continue
                    # integers: every summation order gives these bits
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
    path = args.out or harness.RESULTS / f"timeouts_{args.machine or harness.machine_tag()}.json"
    with open(path, "w") as fh:
        json.dump({"machine": harness.machine(), "rows": rows, "normal_call_after": after}, fh, indent=1)
    print(f"wrote {path}")
    return 1 if total_wrong or not after else 0


def first_error(text: str) -> str:
    """The first error line a worker printed, or ``-``."""
    return next((line[:200] for line in text.splitlines() if line.startswith("ERROR")), "-")


def processes(args) -> int:
    from jax_blink.launch import run_local

    scenarios = []
    for scenario in args.scenarios:
        start = time.monotonic()
        env = dict(os.environ, JAX_BLINK_HOST_TRANSPORT="0" if args.no_host_transport else "1")
        results = run_local([sys.executable, str(WORKER), scenario], 2, devices_per_process=4,
                            timeout_s=args.limit, env=env)
        seconds = time.monotonic() - start
        print(f"\n{scenario}: {seconds:.0f} s until every process ended or was killed")
        ends = []
        for r in results:
            end = "killed" if r.returncode is None else f"exit {r.returncode}"
            ends.append({"process": r.process_id, "end": end, "error": first_error(r.stdout)})
            print(f"  process {r.process_id}: {end}; error seen: {ends[-1]['error']}")
        scenarios.append({"scenario": scenario, "seconds": round(seconds, 1), "processes": ends})
    path = args.json or harness.RESULTS / f"multiprocess_faults_{args.machine or harness.machine_tag()}.json"
    with open(path, "w") as f:
        json.dump({"machine": harness.machine(), "host_transport": not args.no_host_transport,
                   "limit_s": args.limit, "scenarios": scenarios}, f, indent=1)
    print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="sub", required=True)
    to = sub.add_parser("timeouts", help="psums under timeouts so short that some ranks fail")
    to.add_argument("--calls", type=int, default=2000, help="calls per (size, timeout)")
    to.add_argument("--sizes", type=int, nargs="+", default=[16, 1 << 20])
    to.add_argument("--timeouts-ms", type=float, nargs="+", default=[1, 2, 5])
    to.add_argument("--devices", type=int, default=8)
    to.add_argument("--out", default=None,
                    help="write the results here (default: benchmarks/results/timeouts_<machine>.json)")
    to.set_defaults(run=timeouts)
    pr = sub.add_parser("processes", help="a multi-process psum that a process fails")
    pr.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    pr.add_argument("--no-host-transport", action="store_true",
                    help="JAX_BLINK_HOST_TRANSPORT=0: the path of processes on different hosts")
    pr.add_argument("--limit", type=float, default=150.0,
                    help="seconds after which a process still running is killed")
    pr.add_argument("--json", default=None,
                    help="write the results here (default: benchmarks/results/multiprocess_faults_<machine>.json)")
    pr.set_defaults(run=processes)
    for p in (to, pr):
        p.add_argument("--machine", help="the machine's name in the default results file (default: this one's)")
    args = ap.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
