"""The machine a benchmark ran on, and the code it ran, recorded next to its results."""

import os
import platform
import re
import subprocess


def cpu_model() -> str:
    """The CPU's model name (from lscpu), or the platform's best guess."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        match = re.search(r"Model name:\s*(.+)", out)
        if match:
            return match.group(1).strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def commit() -> str:
    """The checkout's commit (short hash), ``+changes`` when tracked files differ from it,
    or ``unknown`` outside a git checkout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=root, timeout=30)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "jax_blink", "cc", "benchmarks/*.py"],
                               cwd=root, timeout=30)
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
