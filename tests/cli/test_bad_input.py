"""Every bad value of every option of the command line: exit status 2, one line on stderr,
no traceback, and no long work before the refusal (issue 30, item 4)."""

import os
import time

import pytest

from jax_blink.cli import main

BAD = [
    # plan
    ("plan", []),  # --topology is required
    ("plan", ["--topology", "no-such-preset"]),
    ("plan", ["--topology", "dgx1-v100", "--gpus", "0,x"]),
    ("plan", ["--topology", "dgx1-v100", "--gpus", "0,9"]),
    ("plan", ["--topology", "dgx1-v100", "--gpus", "0,0"]),
    ("plan", ["--topology", "dgx1-v100", "--collective", "gather"]),
    ("plan", ["--topology", "dgx1-v100", "--collective", "broadcast", "--root", "8"]),
    ("plan", ["--topology", "dgx1-v100", "--collective", "broadcast", "--root", "-1"]),
    ("plan", ["--topology", "dgx1-v100", "--max-trees", "0"]),
    ("plan", ["--topology", "dgx1-v100", "--max-trees", "two"]),
    ("plan", ["--topology", "dgx1-v100", "--tolerance", "-0.1"]),
    ("plan", ["--topology", "dgx1-v100", "--tolerance", "1"]),
    ("plan", ["--topology", "dgx1-v100", "--tolerance", "nan"]),
    ("plan", ["--topology", "dgx1-v100", "--links", "slow"]),
    ("plan", ["--topology", "dgx1-v100", "--png", "out.xyz"]),
    ("plan", ["--topology", "dgx1-v100", "--png", "trees"]),
    ("plan", ["--topology", "dgx1-v100", "--png", "/proc/x.png"]),
    ("plan", ["--topology", "dgx1-v100", "--png", "/no/such/folder/x.png"]),
    ("plan", ["--topology", "dgx1-v100", "--png", "{tmp}"]),
    ("plan", ["--topology", "dgx1-v100", "--hosts", "0"]),
    ("plan", ["--topology", "dgx1-v100", "--hosts", "2", "--nic-gbps", "inf"]),
    ("plan", ["--topology", "dgx1-v100", "--hosts", "2", "--nic-gbps", "0"]),
    ("plan", ["--topology", "dgx1-v100", "--hosts", "2", "--nics", "0"]),
    ("plan", ["--topology", "{disconnected}"]),
    ("plan", ["--topology", "{fifo}"]),
    ("plan", ["--topology", "dgx1-v100", "--no-such-option"]),
    # bench, simulated
    ("bench", ["--topology", "shm:4", "--all-subsets", "--min-gpus", "9"]),
    ("bench", ["--topology", "shm:4", "--all-subsets", "--min-gpus", "1"]),
    ("bench", ["--topology", "shm:4", "--jobs", "0"]),
    ("bench", ["--topology", "shm:4", "--jobs", "-1"]),
    ("bench", ["--topology", "shm:4", "--sizes", ","]),
    ("bench", ["--topology", "shm:4", "--sizes", "0"]),
    ("bench", ["--topology", "shm:4", "--sizes", "1K:1M:1"]),
    ("bench", ["--topology", "shm:4", "--sizes", "abc"]),
    ("bench", ["--topology", "shm:4", "--dtype", "garbage"]),
    ("bench", ["--topology", "shm:4", "--step-overhead-us", "inf"]),
    ("bench", ["--topology", "shm:4", "--step-overhead-us", "-1"]),
    ("bench", ["--topology", "shm:4", "--reduce-gbps", "0"]),
    ("bench", ["--topology", "shm:4", "--reduce-gbps", "nan"]),
    ("bench", ["--topology", "shm:4", "--json", "{tmp}"]),
    ("bench", ["--topology", "shm:4", "--json", "/no/such/folder/x.json"]),
    ("bench", ["--topology", "shm:4", "--png", "{tmp}"]),
    ("bench", ["--topology", "shm:1"]),
    ("bench", ["--topology", "{disconnected}"]),
    ("bench", ["--topology", "dgx1-v100", "--hosts", "17"]),
    # bench on devices
    ("bench", ["--devices", "--dtype", "garbage"]),
    ("bench", ["--devices", "--iters", "0"]),
    ("bench", ["--devices", "--cpu-devices", "0"]),
    ("bench", ["--devices", "--steps"]),
    ("bench", ["--steps", "--models", "8x"]),
    ("bench", ["--steps", "--models", "0x8"]),
    ("bench", ["--steps", "--batch", "0"]),
    ("bench", ["--steps", "--rounds", "0"]),
]


@pytest.fixture
def paths(tmp_path):
    from jax_blink import Topology

    fifo = tmp_path / "topology.json"
    os.mkfifo(fifo)
    disconnected = tmp_path / "pairs.json"
    disconnected.write_text(Topology.from_links(4, [(0, 1, 10.0), (2, 3, 10.0)], name="pairs").to_json())
    return {"tmp": str(tmp_path), "fifo": str(fifo), "disconnected": str(disconnected)}


@pytest.mark.parametrize("command, argv", BAD, ids=[" ".join([c] + a) for c, a in BAD])
def test_a_bad_value_is_one_line_and_exit_2(capsys, paths, command, argv):
    argv = [a.format(**paths) for a in argv]
    start = time.perf_counter()
    try:
        code = main([command] + argv)
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    elapsed = time.perf_counter() - start
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and "Traceback" not in out
    assert elapsed < 20, elapsed  # refused before any long work


def test_png_and_json_report_the_file_they_wrote(capsys, tmp_path):
    png = tmp_path / "trees.png"
    assert main(["plan", "--topology", "shm:3", "--png", str(png)]) == 0
    assert png.exists() and f"wrote the trees to {png}" in capsys.readouterr().err
