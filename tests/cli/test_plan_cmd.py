"""``python -m jax_blink plan``: JSON that loads back, text, and clear errors."""

import json
import math

from jax_blink import Plan, Topology
from jax_blink.cli import plan_cmd


def _cli(argv):
    import argparse

    parser = argparse.ArgumentParser()
    plan_cmd.add_parser(parser.add_subparsers())
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
