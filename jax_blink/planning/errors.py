"""The planning package's error type: planning was asked something impossible or malformed.

Pure Python: never imports jax.
"""

__all__ = ["PlanError"]


class PlanError(ValueError):
    """Planning was asked something impossible or malformed; the message says what to change."""
