"""examples/flax_resnet.py, the README's first command, run for a few steps.

The example runs in a subprocess (it configures its own devices before it
imports jax); it inherits the 8 virtual CPU devices from conftest and is told
to use jax's CPU platform (JAX_PLATFORMS=cpu): on a machine with a GPU,
conftest's "cpu,cuda" would make the example see a GPU (and refuse
--processes), and these tests are about the 8 CPU devices.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "flax_resnet.py"

pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")


def _env(environ=None):
    env = dict(os.environ if environ is None else environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


#: pytest-xdist workers per core: the example's run time grows with them (4 workers on 2
#: cores took the 42 s module fixture past 180 s), so its time limits do too.
_LOAD = max(1.0, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) / (os.cpu_count() or 1))


def _run(*args, timeout=180):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=timeout * _LOAD)


#: the compare run's training: the two-process run trains the same model on the same batches
TRAINING = ("--steps", "20", "--epochs", "2", "--width", "8", "--batch-size", "64", "--lr", "1e-2")


@pytest.fixture(scope="module")
def compare_run(run_once):
    """``(folder, stdout, results)`` of the --compare run, made once per test run."""
    def make(out):
        proc = _run("--compare", *TRAINING, "--out-dir", str(out))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        with open(out / "results.json") as f:
            return out, proc.stdout, json.load(f)
    return run_once("flax_resnet_compare", make)


def test_example_trains_loss_goes_down(compare_run):
    _, _, result = compare_run
    loss = np.asarray(result["runs"]["blink"]["loss"])
    assert len(loss) == 20
    assert np.all(np.isfinite(loss))
    assert loss[-5:].mean() < 0.9 * loss[:5].mean(), loss


def test_example_blink_and_lax_psum_loss_curves_agree(compare_run):
    _, _, result = compare_run
    blink = np.asarray(result["runs"]["blink"]["loss"])
    lax = np.asarray(result["runs"]["lax"]["loss"])
    np.testing.assert_allclose(blink, lax, rtol=1e-4, atol=1e-6)
    assert result["loss_max_abs_diff"] == pytest.approx(np.max(np.abs(blink - lax)))


def test_example_gradients_take_the_planned_blink_path(compare_run):
    # The gradients are large enough for a planned tree allreduce, not the
    # small-value lax.psum fallback; otherwise the comparison would be vacuous.
    _, _, result = compare_run
    n_params = result["runs"]["blink"]["params"]
    lines = [l for l in result["jax_blink_explain"].splitlines() if f"x {n_params} " in l]
    assert lines, result["jax_blink_explain"]
    assert all("lax.psum" not in l for l in lines), lines


def test_example_gradient_sums_run_on_the_jax_blink_executor(compare_run):
    """pvary's transpose sums the gradients with jax_blink: the blink step has
    no XLA all-reduce at all (gradients and metrics are custom calls), the lax
    step has no custom call."""
    _, _, result = compare_run
    blink, lax = result["runs"]["blink"]["collectives"], result["runs"]["lax"]["collectives"]
    assert blink["xla_all_reduce"] == 0 and blink["jax_blink"] >= 2, blink
    assert lax["jax_blink"] == 0 and lax["xla_all_reduce"] >= 1, lax


def test_example_reports_table_plot_and_step_times(compare_run):
    out, stdout, result = compare_run
    assert (out / "loss_curves.png").stat().st_size > 0
    assert "jax_blink.psum" in stdout and "jax.lax.psum" in stdout
    assert "max |blink - lax|" in stdout
    for run in result["runs"].values():
        assert run["step_ms_median"] > 0 and run["compile_s"] > 0
    assert result["env"]["n_devices"] == 8


def test_example_rejects_batch_not_divisible_by_devices(tmp_path):
    proc = _run("--batch-size", "12", "--steps", "1", "--out-dir", str(tmp_path), timeout=60)
    assert proc.returncode != 0
    assert "must be divisible by the number of devices (8)" in proc.stderr


def test_two_processes_train_as_one_and_agree_with_lax(compare_run, tmp_path):
    """--processes 2: two local processes of one jax.distributed job (4 CPU devices each)
    train the compare run's model on its batches; the gradients' psum spans both and runs
    as one schedule over their shared memory, and the loss curve is the one lax.psum gave
    in one process."""
    _, _, one_process = compare_run
    proc = _run("--processes", "2", *TRAINING, "--out-dir", str(tmp_path), timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(tmp_path / "results.json") as f:
        result = json.load(f)
    assert result["env"]["processes"] == 2 and result["env"]["n_devices"] == 8
    np.testing.assert_allclose(result["runs"]["blink"]["loss"], one_process["runs"]["lax"]["loss"],
                               rtol=1e-4, atol=1e-6)
    assert "one schedule over the shared memory of this host's processes: 2 processes" in \
        result["jax_blink_explain"]
    assert result["runs"]["blink"]["collectives"]["jax_blink"] >= 2


def test_example_calibrates_a_machine_without_a_profile(tmp_path):
    """The README's first command on a fresh machine: there is no profile, so the example
    first measures psum's costs here (a quick calibration, one line), and psum's choices then
    name that profile."""
    env = _env({k: v for k, v in os.environ.items() if k != "JAX_BLINK_PROFILE"})
    env["JAX_BLINK_CACHE_DIR"] = str(tmp_path / "cache")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--steps", "2", "--epochs", "1", "--width", "8",
                           "--batch-size", "64", "--out-dir", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300 * _LOAD)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    said = [ln for ln in proc.stdout.splitlines() if ln.startswith("jax_blink: this machine had no profile")]
    assert len(said) == 1, proc.stdout[-3000:]
    assert len(list((tmp_path / "cache").glob("profile-*.json"))) == 1
    assert "no machine profile" not in proc.stderr  # the one line says it
    with open(tmp_path / "results.json") as f:
        assert "this machine's quick profile (1x8" in json.load(f)["jax_blink_explain"]
