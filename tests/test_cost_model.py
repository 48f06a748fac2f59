"""The CPU model that chooses what runs on CPU devices (psum's auto choice between the plan
and lax.psum, the bucket size) is the recorded per-call measurements, and predicts them:
tests replay benchmarks/results/psum_cpu_amd-epyc-2core.json."""

import json
from pathlib import Path

import pytest

from jax_blink.planning import cost

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "psum_cpu_amd-epyc-2core.json"


def recorded():
    return json.loads(RESULTS.read_text())


def test_the_model_is_the_recorded_per_call_measurement():
    data = recorded()
    assert "per call, a sync after each" in data["method"]  # latency, not a burst's throughput
    rows = data["rows"]
    assert list(cost.CPU_ALLREDUCE_US["elements"]) == [r["count"] for r in rows]
    for which in ("blink", "lax"):
        assert list(cost.CPU_ALLREDUCE_US[which]) == pytest.approx(
            [r[f"{which}_added_us"] for r in rows], abs=0.06), which
    assert all(r["wrong"] == 0 for r in rows)


@pytest.mark.parametrize("which", ["blink", "lax"])
def test_the_model_predicts_every_recorded_call_within_25_percent(which):
    for r in recorded()["rows"]:
        predicted = cost.cpu_allreduce_seconds(which, r["size_bytes"]) * 1e6
        assert predicted == pytest.approx(r[f"{which}_added_us"], rel=0.25), r["count"]


def test_the_auto_choice_follows_the_recorded_winner_where_it_is_clear():
    """Where one library was at least 20% faster per call, the model picks it."""
    for r in recorded()["rows"]:
        blink, lax = r["blink_added_us"], r["lax_added_us"]
        if min(blink, lax) < 0.8 * max(blink, lax):
            model = {w: cost.cpu_allreduce_seconds(w, r["size_bytes"]) for w in ("blink", "lax")}
            assert min(model, key=model.get) == ("blink" if blink < lax else "lax"), r["count"]


# --------------------------------------------------------------- the CUDA executor
CUDA_RESULTS = RESULTS.parent / "cuda_h100.json"


def cuda_runs_1mb():
    """``{chunks per tree: [seconds of each recorded run]}``: 1 MB float32, 8 ranks on one H100."""
    data, runs = json.loads(CUDA_RESULTS.read_text()), {}
    for section in ("runs", "earlier_run_same_session", "third_run_spin_yield_barrier"):
        for row in data[section]["bench_cuda_1mb"]["allreduce"]:
            runs.setdefault(row["chunks"], []).append(row["seconds"])
    return runs


def predicted_1mb(chunks):
    """The CUDA executor's model for the recorded 1 MB call (the schedule bench_cuda.py
    lowered; the transfer on one H100 is a few microseconds, below the host's cost)."""
    from jax_blink import Topology, plan

    schedule = plan(Topology.preset("shm:8")).lower(1_000_000, "float32", chunks=chunks,
                                                    launch_s=cost.CUDA_LAUNCH_SECONDS)
    return cost.CUDA_STREAM.seconds(0.0, schedule)


def test_the_cuda_model_is_the_median_of_the_recorded_one_chunk_runs():
    runs = cuda_runs_1mb()
    assert len(runs[1]) == 3
    median = sorted(runs[1])[1]
    assert predicted_1mb(1) == pytest.approx(median, rel=0.25)


def test_the_cuda_model_lies_within_the_spread_of_every_recorded_1mb_run():
    """More chunks: the recorded runs spread 1.5-6x between runs (one GPU's eight host
    threads interleave their CUDA calls differently each time), so no model is within 25%
    of each run; the prediction lies within the runs' range, widened by 25%."""
    for chunks, seconds in cuda_runs_1mb().items():
        assert 0.75 * min(seconds) <= predicted_1mb(chunks) <= 1.25 * max(seconds), (chunks, seconds)


# --------------------------------------------------------------- across processes of one host
HOST_RESULTS = RESULTS.parent / "host_transport_amd-epyc-2core.json"


def host_rows(processes=2, devices=1):
    data = json.loads(HOST_RESULTS.read_text())
    run = next(r for r in data["results"]
               if r["processes"] == processes and r["devices_per_process"] == devices)
    return [r for r in run["rows"] if r["what"] == "psum"]


def test_the_cross_process_model_is_the_recorded_2x1_measurement():
    rows = host_rows()
    assert list(cost.CPU_HOST_ALLREDUCE_US["elements"]) == [r["size"] for r in rows]
    for which in ("blink", "lax"):
        assert list(cost.CPU_HOST_ALLREDUCE_US[which]) == pytest.approx(
            [r[f"{which}_ms"] * 1e3 for r in rows], abs=0.06), which
    assert all(r["wrong"]["blink"] == 0 for r in rows)


@pytest.mark.parametrize("layout", [(2, 1), (4, 1), (2, 4)])
def test_the_cross_process_choice_follows_every_recorded_winner(layout):
    """The model (2 x 1) picks, at every size recorded in every layout, the library that was
    at least 20% faster there; and predicts the 2 x 1 calls within 25%."""
    for r in host_rows(*layout):
        blink, lax = r["blink_ms"], r["lax_ms"]
        model = {w: cost.cpu_allreduce_seconds(w, r["size"] * 4, cost.CPU_HOST_ALLREDUCE_US)
                 for w in ("blink", "lax")}
        if min(blink, lax) < 0.8 * max(blink, lax):
            assert min(model, key=model.get) == ("blink" if blink < lax else "lax"), r["size"]
        if layout == (2, 1):
            assert model["blink"] * 1e3 == pytest.approx(blink, rel=0.25), r["size"]
            assert model["lax"] * 1e3 == pytest.approx(lax, rel=0.25), r["size"]
