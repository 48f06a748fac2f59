"""Measurement on the devices present: the ops against lax, the profile's calibration,
which ranks arrive late.

* :mod:`~jax_blink.measure.timing`: psum against ``lax.psum``, training steps, buckets.
* :mod:`~jax_blink.measure.calibration`: ``calibrate``, which measures this machine's
  profile (:mod:`jax_blink.choice.machine` reads it back).
* :mod:`~jax_blink.measure.lateness`: ``stats`` and ``slow_ranks``.
"""
