"""Command line interface: ``python -m jax_blink {plan,bench} ...``.

Each subcommand lives in its own module (``plan_cli``, ``bench_cli``), which
provides ``add_parser(subparsers)``; the parser it adds sets ``func``.
"""

import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m jax_blink",
        description="Topology-aware collectives for JAX: plan, inspect and benchmark.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    from jax_blink import bench_cli, plan_cli

    plan_cli.add_parser(sub)
    bench_cli.add_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
