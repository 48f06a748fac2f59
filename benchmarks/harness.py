"""What every benchmark shares: the machine record beside its results, the timing, the
wrong-element check and the result line of a local job's processes.

Nothing here imports jax: a benchmark sets jax's environment up (:func:`cpu_devices`)
after importing it. The timing is calibrate's own (:mod:`jax_blink.measure.rounds`: interleaved rounds, the
median of paired differences and its spread), and so is the check
(:func:`jax_blink.numerics.wrong_elements`); they are re-exported here so that a benchmark
imports one module.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

from jax_blink.measure.rounds import interleaved, paired, paired_spread, print_result, read_result
from jax_blink.numerics import wrong_elements
from jax_blink.planning.profile import cpu_model  # (the CPU a machine's profile is keyed by)

__all__ = ["ROOT", "RESULTS", "cpu_model", "cpu_devices", "subcommands", "commit", "RUN_COMMIT", "machine_tag", "machine", "job_result",
           "interleaved", "paired", "paired_spread", "print_result", "read_result", "wrong_elements"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def cpu_devices(n: int = 8) -> None:
    """``n`` virtual CPU devices (unless ``XLA_FLAGS`` already sets a count), jax on the
    CPU (unless ``JAX_PLATFORMS`` names another platform) and XLA CPU's threads for them
    (``settings.set_xla_cpu_threads``). jax reads these once, when it is imported or starts
    its CPU client, so this runs before the first import of jax."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from jax_blink.settings import set_xla_cpu_threads  # imports no jax

    set_xla_cpu_threads()


def commit() -> str:
    """The checkout's commit (short hash), ``+changes`` when tracked files differ from it,
    or ``unknown`` outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=ROOT, timeout=30)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "jax_blink", "cc", "benchmarks/*.py"],
                               cwd=ROOT, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+changes" if dirty.returncode == 1 else "")


#: The code a benchmark runs: the commit when it starts (it imports this module first),
#: not when it ends, since the checkout may move on while a long benchmark runs.
RUN_COMMIT = commit()


def machine_tag() -> str:
    """A short name of this machine for result files: vendor, family and cores
    (``amd-epyc-2core``, ``intel-xeon-2core``)."""
    cpu = cpu_model().lower()
    words = [w for w in re.sub(r"\(r\)|\(tm\)|processor|cpu|@.*", " ", cpu).split() if w.isalpha()]
    name = "-".join(words[:2]) or "cpu"
    return f"{name}-{os.cpu_count()}core"


def machine(**extra) -> dict:
    """CPU model, core count, Python version and the commit it ran (:data:`RUN_COMMIT`),
    plus ``extra`` fields."""
    return {"cpu": cpu_model(), "cores": os.cpu_count(),
            "python": platform.python_version(), "commit": RUN_COMMIT, **extra}


def job_result(outputs: Sequence[tuple]) -> Optional[dict]:
    """What process 0 of a local job reported (:func:`print_result`), from ``(ok, stdout,
    stderr)`` per process; None, after printing every process's output, when a process
    failed or process 0 reported nothing."""
    value = read_result(outputs[0][1])
    if value is None or not all(ok for ok, _, _ in outputs):
        for i, (ok, out, err) in enumerate(outputs):
            print(f"--- process {i} ({'ok' if ok else 'failed'})\n{out[-2000:]}\n{err[-3000:]}", file=sys.stderr)
        return None
    return value


def subcommands(doc: str):
    """``(parser, add)``: a command line described by ``doc``'s first paragraph, and
    ``add(run, help)``, which adds the subcommand ``run.__name__`` (its description ``run``'s
    docstring, a ``--machine`` option naming the results files) that calls ``run(args)``
    (``args.parser``: its own parser). Returns the subcommand's parser, for its options."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def add(run, help):
        p = sub.add_parser(run.__name__, help=help, description=run.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--machine", default=None, help="name in the results files (default: this machine's tag)")
        p.set_defaults(run=run, parser=p)
        return p

    return parser, add
