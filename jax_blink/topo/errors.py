"""The topology package's error type: a topology, or its description, is invalid.

Pure Python: never imports jax.
"""

__all__ = ["TopologyError"]


class TopologyError(ValueError):
    """A topology (or its description) is invalid; the message says what and how to fix it."""
