"""The JAX side: the ``blink_collective`` primitive and the drop-ins for ``lax`` collectives.

* :mod:`~jax_blink.ops.primitive`: the primitive, its rules and its lowering.
* :mod:`~jax_blink.ops.axes`: axis sizes, typing over the axes, rank and group.
* :mod:`~jax_blink.ops.collective`: one call over a pytree (dtypes, grouping,
  decisions, binding or the lax fallback), shared by the ops below.
* :mod:`~jax_blink.ops.psum`: ``psum``, ``pmean``, ``pmax``, ``pmin``, ``explain``.
* :mod:`~jax_blink.ops.scatter_gather`: ``psum_scatter``, ``all_gather``.
* :mod:`~jax_blink.ops.broadcast`: ``broadcast``.
* :mod:`~jax_blink.ops.pvary`: ``pvary`` (its transpose is ``psum``).
"""

from jax_blink.ops.broadcast import broadcast
from jax_blink.ops.psum import explain, pmax, pmean, pmin, psum
from jax_blink.ops.pvary import pvary
from jax_blink.ops.scatter_gather import all_gather, psum_scatter

__all__ = ["psum", "pmean", "pmax", "pmin", "psum_scatter", "all_gather", "broadcast", "pvary",
           "explain"]
