"""Message sizes on the command line: ``4096``, ``1K``, ``256M``, ``1K:1G`` ranges."""

from __future__ import annotations

import argparse
import re

__all__ = ["parse_size", "parse_sizes", "format_size"]

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """Bytes in ``text``: an integer with an optional binary suffix K, M or G.

    Examples
    --------
    >>> parse_size("1K"), parse_size("256M"), parse_size("4096")
    (1024, 268435456, 4096)
    """
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", str(text), re.IGNORECASE)
    if not m or int(m.group(1)) < 1:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: expected e.g. 4096, 1K, 256M or 1G")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def parse_sizes(text: str) -> list:
    """Sizes from ``LO:HI[:FACTOR]`` (geometric, factor 2 by default) or a comma list.

    Examples
    --------
    >>> parse_sizes("1K:8K")
    [1024, 2048, 4096, 8192]
    >>> parse_sizes("1M,256M")
    [1048576, 268435456]
    """
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise argparse.ArgumentTypeError(f"bad size range {text!r}: expected LO:HI or LO:HI:FACTOR")
        lo, hi = parse_size(parts[0]), parse_size(parts[1])
        factor = int(parts[2]) if len(parts) == 3 and parts[2].isdigit() else 2
        if len(parts) == 3 and (not parts[2].isdigit() or factor < 2):
            raise argparse.ArgumentTypeError(f"bad factor in {text!r}: expected an integer >= 2")
        if hi < lo:
            raise argparse.ArgumentTypeError(f"bad size range {text!r}: {hi} < {lo}")
        sizes = [lo]
        while sizes[-1] * factor <= hi:
            sizes.append(sizes[-1] * factor)
        return sizes
    return [parse_size(part) for part in text.split(",") if part.strip()]


def format_size(size_bytes: int) -> str:
    """``1024 -> '1K'``; sizes that are not whole K/M/G stay in bytes."""
    for suffix in ("G", "M", "K"):
        if size_bytes >= _UNITS[suffix] and size_bytes % _UNITS[suffix] == 0:
            return f"{size_bytes // _UNITS[suffix]}{suffix}"
    return str(size_bytes)
