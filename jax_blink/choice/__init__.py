"""The choice: what a collective call runs (the plan, a tuned subset, the phases across
processes, or the lax equivalent), and the predictions it is made from.

* :mod:`~jax_blink.choice.decide`: the one chooser; every op, every path, and
  ``explain()`` ask it.
* :mod:`~jax_blink.choice.requests`: what a choice runs (``PlanRequest``, the schedule
  for a call, the tuned schedule, the baselines).
* :mod:`~jax_blink.choice.predict_cpu`, :mod:`~jax_blink.choice.predict_gpu`: how long
  each candidate takes here, with the source of the numbers.
* :mod:`~jax_blink.choice.across_hosts`: Blink's phases against NCCL over all GPUs.
* :mod:`~jax_blink.choice.machine`: this machine's key and the profile the predictions read.
* :mod:`~jax_blink.choice.log`: the recent decisions ``explain()`` prints.

Imports jax, never the ops: the front end (:mod:`jax_blink.ops`) asks, this package answers.
"""
