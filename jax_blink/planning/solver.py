"""The one place planning calls the LP/MILP solver (cvxpy with HiGHS), and keeps it quiet.

A library must not write to its caller's stdout. HiGHS 1.16 prints a
two-line banner ("Running HiGHS 1.16.0 ... Copyright ...") to file
descriptor 1 when the first ``highspy.Highs`` object of a process is made,
before any option can turn it off (earlier releases print nothing with
cvxpy's default ``verbose=False``). :func:`solve` therefore makes that first
object itself, once per process, with descriptor 1 redirected to a
temporary file; whatever else reached the descriptor meanwhile (another
thread's output) is written back, so only HiGHS's own banner lines are
dropped. Every solve then runs with HiGHS's console log off.
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
import threading
import warnings

__all__ = ["solve"]

#: Lines HiGHS writes on its first ``Highs()``: its banner and the licence note after it.
BANNER_PREFIXES = (b"Running HiGHS ", b"Includes third-party software components")

_lock = threading.Lock()
_banner_absorbed = False


def _flush_c_stdio() -> None:
    """Flush C's stdio buffers (HiGHS writes through them), where libc can be reached."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no libc symbols (not Linux/macOS): nothing buffered we can reach
        pass


def _absorb_banner() -> None:
    """Make the process's first ``highspy.Highs()`` with descriptor 1 captured (once per process)."""
    global _banner_absorbed
    with _lock:
        if _banner_absorbed:
            return
        _banner_absorbed = True
        try:
            import highspy
        except ImportError:  # cvxpy will say that its HIGHS solver is missing
            return
        try:
            sys.stdout.flush()
        except (AttributeError, OSError, ValueError):  # stdout closed or replaced by an object without flush
            pass
        _flush_c_stdio()
        try:
            saved = os.dup(1)
        except OSError:  # no descriptor 1 at all: nothing can be written to it
            highspy.Highs()
            return
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 1)
            try:
                highspy.Highs()
            finally:
                _flush_c_stdio()
                os.dup2(saved, 1)
                os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True)
                    if not line.startswith(BANNER_PREFIXES)]
        if kept:
            os.write(1, b"".join(kept))


def solve(problem, *, time_limit_s: float | None = None, inaccurate_ok: bool = False) -> None:
    """Solve a cvxpy ``problem`` with HiGHS, writing nothing to stdout or stderr.

    ``time_limit_s`` bounds a MILP (HiGHS keeps its best incumbent);
    ``inaccurate_ok`` hides cvxpy's "Solution may be inaccurate" warning,
    which a time-limited MILP raises when it stops early. The caller reads
    ``problem.status``.
    """
    import cvxpy as cp

    _absorb_banner()
    opts = {"solver": cp.HIGHS, "verbose": False}
    if time_limit_s is not None:
        opts["time_limit"] = float(time_limit_s)
    with warnings.catch_warnings():
        if inaccurate_ok:
            warnings.filterwarnings("ignore", message="Solution may be inaccurate")
        problem.solve(**opts)
