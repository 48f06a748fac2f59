"""Buckets: which leaves of a pytree one psum sums together.

``psum``/``pmean`` of a pytree (and so the transpose of ``pvary``, which
sums the gradients of replicated parameters) send its leaves in buckets,
one collective each, as PyTorch DDP and Horovod do. A bucket's collective
depends only on its own leaves, so XLA starts it as soon as they are
computed, while the backward pass goes on producing the others (the CPU
handler is asynchronous: a waiting collective holds no XLA thread). The
leaves are taken last first: for ``jax.grad`` of a layered model the
gradients of the last layers are produced first.

The size is the chooser's (:func:`jax_blink.choice.decide.bucket_size`).
"""

from __future__ import annotations

from typing import Optional

__all__ = ["split"]


def split(nbytes: list, size: Optional[int]) -> list:
    """Leaf indices per bucket, the leaves taken last first: a leaf of at least
    ``size`` bytes is a bucket of its own (large enough to travel alone, it
    starts as soon as it exists), smaller leaves fill buckets until one holds
    at least ``size`` bytes; one bucket with every leaf when ``size`` is None.

    Examples
    --------
    >>> split([400, 4, 400, 4], 256)  # two large leaves alone, the two small ones together
    [[2], [0], [3, 1]]
    >>> split([100, 100, 100, 100], 256)
    [[3, 2, 1], [0]]
    >>> split([1, 2, 3], None)
    [[2, 1, 0]]
    """
    order = list(range(len(nbytes)))[::-1]
    if size is None:
        return [order] if order else []
    buckets, small, held = [], [], 0
    for i in order:
        if nbytes[i] >= size:
            buckets.append([i])
            continue
        small.append(i)
        held += nbytes[i]
        if held >= size:
            buckets.append(small)
            small, held = [], 0
    if small:
        buckets.append(small)
    return buckets
