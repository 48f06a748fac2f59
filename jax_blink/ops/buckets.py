"""Buckets: which leaves of a pytree one psum sums together.

``psum``/``pmean`` of a pytree (and so the transpose of ``pvary``, which
sums the gradients of replicated parameters) send its leaves in buckets,
one collective each, as PyTorch DDP and Horovod do. A bucket's collective
depends only on its own leaves, so XLA starts it as soon as they are
computed, while the backward pass goes on producing the others (the CPU
handler is asynchronous: a waiting collective holds no XLA thread). The
leaves are taken last first: for ``jax.grad`` of a layered model the
gradients of the last layers are produced first.

The size is ``bucket_bytes=`` / ``JAX_BLINK_BUCKET_BYTES``, else on CPU
devices the size this machine's profile measured best in the training steps
of the model nearest the pytree in bytes
(:func:`jax_blink.ops.predict_cpu.tuned_bucket_bytes`), else the cost model
of the executor that will run the buckets
(:func:`jax_blink.planning.cost.bucket_bytes` over
:func:`jax_blink.ops.predict_cpu.cpu_allreduce`: this machine's profile's
isolated calls, else the recorded costs).
"""

from __future__ import annotations

from typing import Optional

from jax_blink import settings
from jax_blink.ops import predict_cpu
from jax_blink.planning.cost import bucket_bytes as _model_bytes

__all__ = ["bucket_size", "split"]


def bucket_size(value, platform: str, nbytes: float) -> tuple:
    """``(bytes or None, why)``: the bucket size of a psum of a pytree of
    ``nbytes`` per device over ``platform``'s devices; None means one bucket."""
    chosen = settings.bucket_bytes(value)
    if chosen is not None:
        return chosen, "bucket_bytes=" if value is not None else "JAX_BLINK_BUCKET_BYTES"
    if platform == "cpu":
        tuned, where = predict_cpu.tuned_bucket_bytes(nbytes)
        if tuned is not None:
            return tuned, f"the training steps of {where}"
        source = predict_cpu.cpu_allreduce(4).source
        return (_model_bytes(lambda s: predict_cpu.cpu_allreduce(s).blink_s,
                             fixed_s=predict_cpu.blink_fixed_seconds()), f"the CPU model ({source})")
    # On GPUs the CUDA executor enqueues on XLA's compute stream, in program order: a bucket
    # would not overlap the backward pass, only add its per-call cost.
    return None, "one bucket: the CUDA executor runs in the compute stream's order"


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
