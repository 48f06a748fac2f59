"""Command line interface: ``python -m jax_blink {plan,bench} ...``.

Argument parsing and printing only; the work is done by the library
packages. Each subcommand lives in its own module (:mod:`.plan_cmd`,
:mod:`.bench_cmd`), which provides ``add_parser(subparsers)``; the parser it
adds sets ``func``. :mod:`.sizes` parses message sizes (``1K:1G``).
"""

import argparse
import math
import os
import re
import sys

__all__ = ["main", "plain", "output_path", "wrote"]


def plain(doc: str) -> str:
    """A docstring as plain text for ``--help``: Sphinx roles and literal
    quotes dropped (``:func:`~x.y``` -> ``y``, ````x```` -> ``x``)."""
    doc = re.sub(r":\w+:`~[\w.]*\.(\w+)`", r"\1", doc)
    doc = re.sub(r":\w+:`([^`]+)`", r"\1", doc)
    return doc.replace("``", "")


def output_path(path, option: str):
    """``path`` if its folder exists (checked before any long work), else a
    ValueError naming ``option``."""
    if path is None:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{option} {path}: the folder {folder} does not exist")
    return path


def wrote(path, what: str) -> None:
    """Says on stderr where an output file went."""
    print(f"wrote {what} to {os.path.abspath(path)}", file=sys.stderr)


def allocations(n: int, smallest: int) -> int:
    """How many allocations of at least ``smallest`` of ``n`` ranks there are."""
    return sum(math.comb(n, k) for k in range(smallest, n + 1))


def main(argv=None) -> int:
    """Runs ``python -m jax_blink`` with ``argv`` (default: the process's)."""
    from jax_blink.cli import bench_cmd, plan_cmd

    parser = argparse.ArgumentParser(
        prog="python -m jax_blink",
        description="Topology-aware collectives for JAX: plan, inspect and benchmark.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    plan_cmd.add_parser(sub)
    bench_cmd.add_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)
