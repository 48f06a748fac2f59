"""jax_blink across processes: real jax.distributed jobs on 127.0.0.1 (free
ports, a time limit, every process reaped; jax_blink.launch.run_local),
compared case by case with lax in every process (tests/multiprocess/worker.py:
every dtype, pytrees, grads, the hierarchical and the in-process paths, the
lax fallbacks and what explain() says)."""

import os
import sys
import time

import pytest

from jax_blink.launch import run_local

WORKER = os.path.join(os.path.dirname(__file__), "worker.py")


def launch(scenario, processes, devices, timeout_s):
    start = time.monotonic()
    results = run_local([sys.executable, WORKER, scenario], processes,
                        devices_per_process=devices, timeout_s=timeout_s)
    return results, time.monotonic() - start


def report(results):
    return "\n".join(f"--- process {r.process_id} (exit {r.returncode})\n{r.stdout[-4000:]}\n"
                     f"{r.stderr[-3000:]}" for r in results)


@pytest.mark.parametrize("processes, devices", [(2, 4), (4, 2)])
def test_collectives_across_processes_match_lax(processes, devices):
    results, _ = launch("cases", processes, devices, timeout_s=600)
    assert all(r.ok for r in results), report(results)
    for r in results:
        assert "CHECKS" in r.stdout and "FAILED 0" in r.stdout, report(results)


def test_a_process_that_never_calls_fails_the_others_not_a_hang():
    """Process 1 never calls the collective. The in-process phases never wait
    for it; the cross-process phase is XLA's (gloo) and fails when its
    context cannot be set up (about 30 s), with XLA's error."""
    results, seconds = launch("absent", 2, 4, timeout_s=240)
    assert all(r.returncode is not None for r in results), report(results)  # none killed
    assert "ERROR" in results[0].stdout and "gloo" in results[0].stdout.lower(), report(results)
    assert seconds < 240
