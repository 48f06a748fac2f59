"""jax_blink across processes: real jax.distributed jobs on 127.0.0.1 (free
ports, a time limit, every process reaped; jax_blink.launch.run_local),
compared case by case with lax in every process (tests/multiprocess/worker.py:
every dtype, pytrees, grads, the host transport, the hierarchical and the
in-process paths, the lax fallbacks and what explain() says), and the faults:
a process that never calls, a process killed inside a call."""

import os
import re
import sys
import time

import pytest

from jax_blink.launch import run_local

WORKER = os.path.join(os.path.dirname(__file__), "worker.py")


def launch(scenario, processes, devices, timeout_s, host_transport=True):
    start = time.monotonic()
    env = dict(os.environ, JAX_BLINK_HOST_TRANSPORT="1" if host_transport else "0")
    results = run_local([sys.executable, WORKER, scenario], processes,
                        devices_per_process=devices, timeout_s=timeout_s, env=env)
    return results, time.monotonic() - start


def report(results):
    return "\n".join(f"--- process {r.process_id} (exit {r.returncode})\n{r.stdout[-4000:]}\n"
                     f"{r.stderr[-3000:]}" for r in results)


# (2 x 2: several processes and several devices each, the two sides of the hierarchical path;
# the hierarchical path over 4 x 2 runs in the two-hosts test below)
@pytest.mark.parametrize("processes, devices", [(2, 2)])
def test_collectives_across_processes_match_lax(processes, devices):
    """Without the host transport: the hierarchical path and lax, as across hosts."""
    results, _ = launch("cases", processes, devices, timeout_s=600, host_transport=False)
    assert all(r.ok for r in results), report(results)
    for r in results:
        assert "CHECKS" in r.stdout and "FAILED 0" in r.stdout, report(results)


# (one device per process, and several; the 2 x 1 job runs in the profile and fault tests)
@pytest.mark.parametrize("processes, devices", [(2, 2), (4, 1)])
def test_host_transport_matches_lax(processes, devices):
    """One schedule over every device of the host's processes, through shared memory."""
    results, _ = launch("host", processes, devices, timeout_s=600)
    assert all(r.ok for r in results), report(results)
    for r in results:
        assert "CHECKS" in r.stdout and "FAILED 0" in r.stdout, report(results)


@pytest.mark.parametrize("lax_faster", [True, False], ids=["lax 10x faster", "lax 10x slower"])
def test_every_op_across_processes_follows_a_profile_that_leaves_no_doubt(tmp_path, monkeypatch, lax_faster):
    """2 x 1 processes over the host transport, a profile whose every table (the allreduce's,
    the reduce-scatter's and the all-gather's, in one process and in several) measured lax 10x
    faster, or 10x slower: every op runs the faster, and gives lax's result."""
    from jax_blink.choice import machine
    from jax_blink.planning import profile as profiles

    sizes = [1, 1000, 100_000, 1_000_000]
    blink = [100.0 * (1 + s / 1000) for s in sizes]
    table = {"elements": sizes, "blink": blink, "lax": [b / 10 if lax_faster else b * 10 for b in blink],
             "spread": [5.0] * len(sizes)}
    made = profiles.Profile(machine.machine_key(), {"1x8": table, "2x1": table},
                            collectives={k: {c: table for c in profiles.COLLECTIVES} for k in ("1x8", "2x1")})
    monkeypatch.setenv("JAX_BLINK_PROFILE", str(profiles.save(made, tmp_path / "profile.json")))
    monkeypatch.setenv("JAX_BLINK_EXPECT", "lax" if lax_faster else "blink")
    results, _ = launch("obey", 2, 1, timeout_s=300)
    assert all(r.ok for r in results), report(results)
    for r in results:
        assert "CHECKS" in r.stdout and "FAILED 0" in r.stdout, report(results)


# (4 x 2: each host's phase over two processes of two devices)
@pytest.mark.parametrize("processes, devices", [(4, 2)])
def test_two_hosts_of_two_processes_take_the_hierarchical_path_with_shared_memory_inside(
        processes, devices):
    """Processes labelled as two hosts (JAX_BLINK_HOST_KEY): the three phases across the
    hosts, each host's phases one schedule over its two processes' shared memory."""
    results, _ = launch("hosts", processes, devices, timeout_s=600)
    assert all(r.ok for r in results), report(results)
    for r in results:
        assert "CHECKS" in r.stdout and "FAILED 0" in r.stdout, report(results)


def _shm_names():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


# (2 x 2: the killed process's ranks are several threads inside the call)
@pytest.mark.parametrize("processes, devices", [(2, 2)])
def test_a_process_killed_inside_a_call_fails_the_others_fast(processes, devices):
    """Process 1 is SIGKILLed while its ranks are inside a psum (timeout 3 s): the other
    process fails within a second, naming the exited process, and nothing is left in
    /dev/shm (the arenas are anonymous memory files)."""
    before = _shm_names()
    results, _ = launch("killed", processes, devices, timeout_s=120)
    assert results[1].returncode == -9, report(results)
    assert results[0].ok, report(results)
    line = next((ln for ln in results[0].stdout.splitlines() if ln.startswith("ERROR")), "")
    assert "DEADLINE_EXCEEDED" in line and "process 1 of this host" in line, report(results)
    assert "has exited" in line, report(results)
    seconds = float(line.split()[2])
    assert seconds < 3.0, line  # found before the timeout, not after it
    assert _shm_names() <= before


def test_a_process_that_stops_calling_is_named_by_the_host_rendezvous():
    """Process 1 makes one call, then never calls again: process 0's next call fails when
    its timeout (5 s) expires, naming the ranks that never arrived."""
    results, seconds = launch("absent-later", 2, 2, timeout_s=120)
    assert all(r.returncode is not None for r in results), report(results)
    line = next((ln for ln in results[0].stdout.splitlines() if ln.startswith("ERROR")), "")
    assert "host rendezvous timed out after 5000 ms" in line, report(results)
    assert "rank(s) [2, 3] never arrived" in line, report(results)
    assert seconds < 60


@pytest.fixture(scope="module")
def absent_jobs(run_once):
    """``{host_transport: (results, seconds)}``: process 1 never calls, in a 2 x 4 job without
    the host transport and a 2 x 2 job with it, both at once (each waits about 30 s for gloo:
    one wait serves both), once per test run."""
    from concurrent.futures import ThreadPoolExecutor

    def make(_):
        jobs = {False: (2, 4), True: (2, 2)}
        with ThreadPoolExecutor(len(jobs)) as pool:
            running = {transport: pool.submit(launch, "absent", processes, devices, timeout_s=240,
                                              host_transport=transport)
                       for transport, (processes, devices) in jobs.items()}
            return {transport: job.result() for transport, job in running.items()}
    return run_once("absent_process", make)


def test_a_process_that_never_calls_fails_the_others_not_a_hang(absent_jobs):
    """Process 1 never calls the collective (without the host transport). The
    in-process phases never wait for it; the cross-process phase is XLA's
    (gloo) and fails when its context cannot be set up (about 30 s), with
    XLA's error."""
    results, seconds = absent_jobs[False]
    assert all(r.returncode is not None for r in results), report(results)  # none killed
    assert "ERROR" in results[0].stdout and "gloo" in results[0].stdout.lower(), report(results)
    assert seconds < 240


def test_a_process_that_never_calls_fails_host_discovery_not_a_hang(absent_jobs):
    """Process 1 never calls (host transport on): finding the host's processes is a gather
    every process takes part in, and process 0's fails (gloo's context, about 30 s) with
    jax_blink's error saying what each process must do."""
    results, seconds = absent_jobs[True]
    assert all(r.returncode is not None for r in results), report(results)
    # gloo's context fails after about 30 s; jax_blink's own bound is JAX_BLINK_TIMEOUT_S (60 s)
    assert re.search("finding which processes share a host (failed|timed out)",
                     results[0].stdout), report(results)
    assert seconds < 240


def test_local_processes_run_on_cpu_devices_whatever_the_environment_says():
    """run_local's processes use jax's CPU platform: where conftest (or the user) has
    JAX_PLATFORMS="cuda,cpu" or "cpu,cuda" on a machine with a GPU, every process would
    otherwise start the GPU backend as well, or on it (issue 44)."""
    code = "import jax; print(jax.default_backend(), jax.device_count())"
    for platforms in ("cuda,cpu", "cuda"):
        results = run_local([sys.executable, "-c", code], 2, devices_per_process=3, timeout_s=120,
                            env=dict(os.environ, JAX_PLATFORMS=platforms))
        assert all(r.ok for r in results), report(results)
        assert [r.stdout.split() for r in results] == [["cpu", "3"]] * 2, report(results)
