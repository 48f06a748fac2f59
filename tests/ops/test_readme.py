"""The README's Python snippet runs as pasted and prints what it says."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_snippet_runs_as_pasted(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "no python block in the README"
    script = tmp_path / "snippet.py"
    script.write_text(blocks[0])
    # the snippet's own 8 CPU devices (it sets XLA_FLAGS), on jax's CPU platform even where a
    # GPU is (conftest's "cpu,cuda"; the README says what to change on a GPU machine)
    env = {k: v for k, v in __import__("os").environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.splitlines()
    assert lines[0] == "[8. 8. 8.]", res.stdout
    assert "psum over ('data',)" in res.stdout and "plan on" in res.stdout, res.stdout
