"""The machine a benchmark ran on, recorded next to its results."""

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


def machine(**extra) -> dict:
    """CPU model, core count and Python version, plus ``extra`` fields."""
    return {"cpu": cpu_model(), "cores": os.cpu_count(),
            "python": platform.python_version(), **extra}
