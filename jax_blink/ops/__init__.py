"""The JAX side: the ``blink_psum`` primitive and the drop-ins for ``lax`` collectives.

* :mod:`~jax_blink.ops.decide`: what a call does (plan, or lax.psum and why);
  shared by the ops and :func:`explain`.
* :mod:`~jax_blink.ops.primitive`: the primitive, its rules and its lowering.
* :mod:`~jax_blink.ops.psum`: ``psum``, ``pmean``, ``explain``.
"""

from jax_blink.ops.psum import explain, pmean, psum

__all__ = ["psum", "pmean", "explain"]
