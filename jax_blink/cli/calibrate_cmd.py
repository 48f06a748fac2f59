"""``python -m jax_blink calibrate``: measure this machine's collective costs (the allreduce,
reduce-scatter and all-gather, by jax_blink's executor and by lax, with the spread between
them) and keep them as its profile, which the ops' choices (``auto``, the bucket size) then
use instead of the costs recorded on another machine.

Run it once per machine type, before training, with the devices the jobs will have
(``--cpu-devices N`` for N virtual CPU devices; default 8 where XLA_FLAGS sets no count).
A full calibration measures 6 sizes, local processes and training steps (about a minute
on 8 CPU devices of a 2-core VM), ``--quick`` 4 sizes (under 10 s). The profile goes to the cache directory
(``JAX_BLINK_CACHE_DIR``), keyed by this machine, jax's version and the extension's build,
or to ``--out``; ``JAX_BLINK_PROFILE=FILE`` makes psum use such a file elsewhere.

    python -m jax_blink calibrate [--quick] [--cpu-devices 8] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys

from jax_blink import settings
from jax_blink.cli.common import plain

__all__ = ["add_parser"]

_COUNT_FLAG = "--xla_force_host_platform_device_count"


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``calibrate`` subcommand to ``subparsers``."""
    p = subparsers.add_parser("calibrate", help="measure this machine's allreduce costs for psum's choices",
                              description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="4 sizes, fewer calls (under 10 s)")
    p.add_argument("--cpu-devices", type=int, default=None,
                   help="virtual CPU devices to measure (default 8 unless XLA_FLAGS sets a count)")
    p.add_argument("--rounds", type=int, default=None, help="calls per program and size (default 21, --quick 7)")
    p.add_argument("--out", default=None, help="write the profile here instead of the cache directory")
    p.set_defaults(func=main)
    return p


def main(args) -> int:
    try:
        if args.rounds is not None and args.rounds < 1:
            raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
        flags = os.environ.get("XLA_FLAGS", "")
        if args.cpu_devices is not None or _COUNT_FLAG not in flags:
            count = 8 if args.cpu_devices is None else args.cpu_devices
            if count < 2:
                raise ValueError(f"--cpu-devices must be >= 2 (an allreduce needs two devices), got {count}")
            if "jax" in sys.modules:
                raise ValueError("--cpu-devices must be set before jax is imported")
            os.environ["XLA_FLAGS"] = f"{flags} {_COUNT_FLAG}={count}".strip()
        settings.set_xla_cpu_threads()
        from jax_blink.measure.calibration import calibrate, describe  # imports jax

        made, where = calibrate(quick=args.quick, path=args.out, rounds=args.rounds)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"jax_blink calibrate: wrote {where} ({'quick, ' if made.quick else ''}{made.seconds:.1f} s)")
    print(describe(made))
    return 0
