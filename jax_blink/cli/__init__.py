"""Command line interface: ``python -m jax_blink {plan,bench,calibrate} ...``.

Argument parsing and printing only; the work is done by the library
packages. Each subcommand lives in its own module (:mod:`.plan_cmd`,
:mod:`.bench_cmd`, :mod:`.calibrate_cmd`), which provides ``add_parser(subparsers)``; the parser it
adds sets ``func``. :mod:`.sizes` parses message sizes (``1K:1G``),
:mod:`.common` holds what both commands print and check.
"""

import argparse

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """An argument parser whose refusals are one line on stderr (exit status 2)."""

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def main(argv=None) -> int:
    """Runs ``python -m jax_blink`` with ``argv`` (default: the process's)."""
    from jax_blink.cli import bench_cmd, calibrate_cmd, plan_cmd

    parser = _Parser(
        prog="python -m jax_blink",
        description="Topology-aware collectives for JAX: plan, inspect, benchmark and calibrate.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    plan_cmd.add_parser(sub)
    bench_cmd.add_parser(sub)
    calibrate_cmd.add_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)
