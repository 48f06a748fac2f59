"""The log of what recent traces decided: :func:`record` (also logged with
``JAX_BLINK_DEBUG``) and :func:`recent`, which ``jax_blink.explain()`` prints."""

from __future__ import annotations

import collections
import logging

from jax_blink import settings

__all__ = ["record", "recent"]

logger = logging.getLogger("jax_blink")
if settings.debug():
    logging.basicConfig()
    logger.setLevel(logging.DEBUG)

_DECISIONS = collections.deque(maxlen=64)

def record(text: str) -> None:
    """Remembers a decision for :func:`recent` (and logs it with JAX_BLINK_DEBUG)."""
    _DECISIONS.append(text)
    logger.debug(text)


def recent() -> list:
    """The most recent decisions, oldest first."""
    return list(_DECISIONS)
