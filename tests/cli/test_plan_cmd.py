"""``python -m jax_blink plan`` and ``bench``: JSON that loads back, text, and clear errors."""

import json
import math

from jax_blink import Plan, Topology
from jax_blink.cli import bench_cmd, plan_cmd


def _cli(argv):
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    plan_cmd.add_parser(sub)
    bench_cmd.add_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_json_is_the_plans_json_plus_the_gpus(capsys, tmp_path):
    png = tmp_path / "trees.png"
    assert _cli(["plan", "--topology", "dgx1-v100", "--gpus", "0,1,4,5", "--json", "--png", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"topology", "gpus", "collective", "family", "rate_gbps", "bound_gbps", "ring_rate_gbps",
            "trees", "plan_seconds"} <= set(out)
    assert out["gpus"] == [0, 1, 4, 5] and out["topology"]["name"] == "dgx1-v100[0,1,4,5]"
    assert math.isclose(out["rate_gbps"], out["bound_gbps"], rel_tol=1e-6)
    assert set(out["trees"][0]) == {"weight", "root", "edges", "paths"}
    again = Plan.from_json(out)  # the printed plan loads back
    assert again.topology == Topology.preset("dgx1-v100").subset([0, 1, 4, 5])
    assert again.rate_gbps == out["rate_gbps"]
    assert png.stat().st_size > 1000


def test_cli_text_and_errors(capsys, tmp_path):
    path = tmp_path / "t.json"
    path.write_text(Topology.preset("shm:3").to_json())
    assert _cli(["plan", "--topology", str(path), "--collective", "broadcast", "--root", "2"]) == 0
    assert "rate" in capsys.readouterr().out
    assert _cli(["plan", "--topology", "nope"]) == 2
    assert "valid names" in capsys.readouterr().err
    assert _cli(["plan", "--topology", "dgx1-v100", "--gpus", "0,9"]) == 2
    assert "out of range" in capsys.readouterr().err


def test_python_dash_m_runs_both_commands():
    import subprocess
    import sys

    for argv in (["plan", "--topology", "shm:4"],
                 ["bench", "--topology", "dgx1-v100", "--gpus", "0,1,2", "--sizes", "1M"]):
        res = subprocess.run([sys.executable, "-m", "jax_blink", *argv], capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        assert res.stdout.strip(), argv


def test_outputs_into_missing_folders_are_errors_before_any_work(capsys, tmp_path):
    assert _cli(["plan", "--topology", "shm:4", "--png", str(tmp_path / "no" / "t.png")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_help_is_plain_text_and_the_png_path_is_printed(capsys, tmp_path):
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "jax_blink", "bench", "--help"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and ":func:" not in res.stdout and "``" not in res.stdout
    png = tmp_path / "t.png"
    assert _cli(["plan", "--topology", "shm:4", "--png", str(png)]) == 0
    assert f"wrote the trees to {png}" in capsys.readouterr().err


def test_no_ring_is_said_in_words(capsys):
    assert _cli(["plan", "--topology", "shm:4"]) == 0
    out = capsys.readouterr().out
    assert "no NVLink/NVSwitch ring" in out and "ring 0 " not in out
    assert "rsag (reduce-scatter + all-gather" in out or "tree (each tree reduced" in out


def test_hosts_plan_the_three_phases(capsys):
    assert _cli(["plan", "--topology", "dgx1-v100", "--gpus", "0,1,2,5", "--hosts", "3", "--nic-gbps", "25",
                 "--nics", "2"]) == 0
    out = capsys.readouterr().out
    assert "3xdgx1-v100[0,1,2,5] (12 ranks: 3 hosts x 4)" in out
    assert "50 GB/s per host to the network" in out and "3. all-gather in each host" in out
    assert _cli(["plan", "--topology", "shm:4", "--hosts", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hosts"] == [[0, 1, 2, 3], [4, 5, 6, 7]] and out["network_gbps"] == 12.5
    assert Plan.from_json(json.dumps(out["reduce_scatter"])).collective == "reduce_scatter"
    assert _cli(["plan", "--topology", "shm:4", "--hosts", "2", "--root", "1"]) == 2
    assert "--root does not apply to the three-phase allreduce" in capsys.readouterr().err
    for bad, match in ((["--hosts", "0"], "--hosts must be >= 1"), (["--hosts", "2", "--nic-gbps", "0"], "NIC bandwidth"),
                       (["--hosts", "2", "--nics", "9"], "more than the host's 4 ranks")):
        assert _cli(["plan", "--topology", "shm:4", *bad]) == 2
        assert match in capsys.readouterr().err


def test_bench_hosts_prints_the_three_algorithms(capsys, tmp_path):
    path = tmp_path / "rows.json"
    assert _cli(["bench", "--topology", "shm:4", "--hosts", "2", "--nic-gbps", "2", "--sizes", "1M",
                 "--json", str(path)]) == 0
    out = capsys.readouterr().out
    for name in ("blink-3phase", "nccl-ring", "nccl-tree"):
        assert name in out
    assert "x vs best NCCL" in out and "(8 ranks: 2 hosts x 4" in out
    rows = json.loads(path.read_text())
    assert rows["hosts"] == 2 and set(rows["rows"][0]) >= {"size_bytes", "blink-3phase", "nccl-ring", "nccl-tree"}
    assert len(rows["rows"][0]["blink-3phase"]["phases_us"]) == 3
    assert _cli(["bench", "--topology", "shm:4", "--hosts", "2", "--all-subsets"]) == 2
    assert "drop --gpus and --hosts" in capsys.readouterr().err
    assert _cli(["bench", "--topology", "dgx1-v100", "--hosts", "128"]) == 2
    assert "1024 GPUs: simulating NCCL's flat ring over more than 128" in capsys.readouterr().err
