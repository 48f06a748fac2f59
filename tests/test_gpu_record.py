"""benchmarks/gpu_record.py: what gpu_check.sh's calls leave in their output folder becomes
one results file, each call adding its sections. The stress part comes from a real
gpu_stress.py run on CPU (the device executor's host build, every call a fresh
executor's first); the suite and executor parts from files shaped as gpu_check writes
them."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_record  # noqa: E402

MACHINE = ("name, memory.total [MiB], driver_version, pci.bus_id\n"
           "NVIDIA H200, 143771 MiB, 580.159.04, 00000000:00:05.0\n"
           "jax 0.11.2 jaxlib 0.11.2 [CudaDevice(id=0)]\n")


def test_the_two_calls_add_their_sections(tmp_path):
    out, results = tmp_path / "out", tmp_path / "results"
    out.mkdir()
    (out / "machine.txt").write_text(MACHINE)
    (out / "commit.txt").write_text("abc1234\n")
    # call 1: the stress, run for real (2 processes, a couple of seconds)
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_stress.py"), "--backend",
                          "emulator", "--executor", "device", "--processes", "2", "--seconds", "2",
                          "--grace", "120", "--out", str(out / "gpu_stress_device.json")],
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    target = gpu_record.record(out, results)
    assert target.name == "gpu_check_h200.json"
    doc = json.loads(target.read_text())
    row, = doc["stress"]
    assert row["executor"] == "device" and row["processes"] == 2
    assert row["calls"] > 0 and row["fresh_executors"] == row["calls"]
    assert row["wrong_elements"] == 0 and row["errors"] == 0 and row["failed_processes"] == 0
    assert "executors" not in doc and "suite" not in doc
    # call 2, in a fresh folder: executors and the suite; the stress stays
    out2 = tmp_path / "out2"
    out2.mkdir()
    (out2 / "machine.txt").write_text(MACHINE)
    (out2 / "commit.txt").write_text("def5678\n")
    for k, (stream, device) in enumerate([(2.0, 1.0), (3.0, 1.5), (4.0, 1.0)]):
        rows = [{"executor": "stream", "bytes_per_rank": 1_000_000, "seconds": stream * 1e-3},
                {"executor": "device", "bytes_per_rank": 1_000_000, "seconds": device * 1e-3}]
        (out2 / f"bench_cuda_executors{'' if k == 0 else f'_run{k + 1}'}.json").write_text(
            json.dumps({"allreduce": rows}))
    (out2 / "suite.log").write_text("....\nFAILED tests/x.py::t\n2090 passed, 1 failed, 430 skipped in 200.1s\n")
    gpu_record.record(out2, results)
    doc = json.loads(target.read_text())
    assert doc["stress"] == [row] and doc["commits"] == {"stress": "abc1234", "executors": "def5678",
                                                         "suite": "def5678"}
    ex, = doc["executors"]
    assert ex["stream_ms"] == 3.0 and ex["device_ms"] == 1.0 and ex["stream_runs"] == 3
    assert abs(ex["device_over_stream"] - 1 / 3) < 1e-12
    assert doc["suite"] == {"jax": "0.11.2", "jaxlib": "0.11.2",
                            "suite": {"passed": 2090, "failed": 1, "skipped": 430, "errors": 0}}


def test_results_are_named_by_the_gpu_model():
    assert gpu_record.gpu_tag(MACHINE) == "h200"
    assert gpu_record.gpu_tag("NVIDIA H100 80GB HBM3, 81559 MiB, 580, 0:0") == "h100"
    assert gpu_record.gpu_tag("jax 0.11.2 jaxlib 0.11.2 []") == "gpu"


def test_the_bench_stage_becomes_the_tables_results(tmp_path):
    """The bench stage's allreduce runs replace theirs in cuda_<gpu>.json (the others kept) and
    its CUDA IPC run becomes cuda_ipc_<gpu>.json: the files docs/performance.md quotes, which
    its cuda and cuda_ipc renderers read."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import tables

    out, results = tmp_path / "out", tmp_path / "results"
    out.mkdir()
    results.mkdir()
    (out / "machine.txt").write_text(MACHINE)
    (out / "commit.txt").write_text("abc1234\n")
    recorded = json.loads((ROOT / "benchmarks" / "results" / "cuda_h200.json").read_text())
    (results / "cuda_h200.json").write_text(json.dumps({"runs": {"bench_cuda_old": {"kept": True}}}))
    fresh = recorded["runs"]["bench_cuda_16mb"]
    (out / "bench_cuda_16mb.json").write_text(json.dumps(fresh))
    (out / "bench_cuda_executors.json").write_text(json.dumps({"allreduce": []}))  # not a table's run
    ipc = json.loads((ROOT / "benchmarks" / "results" / "cuda_ipc_h200.json").read_text())
    (out / "bench_cuda_ipc.json").write_text(json.dumps(ipc))
    gpu_record.record(out, results)
    doc = json.loads((results / "cuda_h200.json").read_text())
    assert set(doc["runs"]) == {"bench_cuda_old", "bench_cuda_16mb"} and doc["commit"] == "abc1234"
    assert doc["runs"]["bench_cuda_16mb"] == fresh
    assert "16 MB" in tables.cuda({"runs": {"bench_cuda_16mb": fresh}})
    made = json.loads((results / "cuda_ipc_h200.json").read_text())
    assert tables.cuda_ipc(made) == tables.cuda_ipc(ipc)
