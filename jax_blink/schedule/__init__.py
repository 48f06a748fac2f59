"""Schedules, the contract between the planner and the executors: format, validation, lowering.

Modules: :mod:`~jax_blink.schedule.constants` (version, codes, dtypes, the
error type), :mod:`~jax_blink.schedule.format` (:class:`Schedule`,
:class:`Step`, JSON and the flat ``int64`` encoding),
:mod:`~jax_blink.schedule.validate` (the checks of
:meth:`Schedule.validate`), :mod:`~jax_blink.schedule.lower`
(:func:`lower_trees`, :func:`lower_ring`). ``docs/schedule_format.md`` is the specification.
Pure Python: never imports jax.
"""

from .constants import COLLECTIVES, DTYPES, FORMAT_VERSION, REDUCE_OPS, ScheduleError, dtype_name
from .format import Schedule, Step
from .lower import lower_ring, lower_trees

__all__ = ["Schedule", "Step", "ScheduleError", "lower_trees", "lower_ring", "dtype_name", "DTYPES",
           "FORMAT_VERSION", "COLLECTIVES", "REDUCE_OPS"]
