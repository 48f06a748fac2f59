"""What both commands share: plain-text help, output paths checked up front and
reported, and counting allocations."""

from __future__ import annotations

import math
import os
import re
import sys

__all__ = ["plain", "output_path", "wrote", "allocations"]


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
