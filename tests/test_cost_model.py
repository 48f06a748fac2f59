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
