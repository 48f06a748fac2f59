"""A decorator that pauses Python's cyclic garbage collector around a function.

Lowering a large plan and simulating the result allocate tens of thousands of
containers (steps, dependency lists, event tuples) that mostly survive until the
function returns. The allocations trigger the collector over and over, and once its
young generations fill, a full pass over the whole heap: with jax and cvxpy imported,
millions of objects. Those passes took more than half of a lowering (the whole
DGX-1 P100 plan at 256 MB, 55,552 steps: 450-570 ms, and 230-270 ms paused).
Lowering and simulation make no reference cycles; psum's GPU decision, paused as
a whole, plans with cvxpy, whose cycles wait for the collector's next pass after
it returns (one decision's worth of memory). Pure Python.
"""

import functools
import gc

__all__ = ["gc_paused"]


def gc_paused(fn):
    """``fn`` with the cyclic collector paused while it runs, and restored after
    (unless it was off already)."""

    @functools.wraps(fn)
    def paused(*args, **kwargs):
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return paused
