"""Planning writes nothing to its caller's stdout or stderr, at any highspy version."""

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(code, tmp_path, *args):
    """Run ``code`` (or ``python -m jax_blink args``) in a fresh process with an empty plan cache."""
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_BLINK_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-c", textwrap.dedent(code)] if code else [sys.executable, "-m", "jax_blink", *args]
    return subprocess.run(cmd, capture_output=True, cwd=ROOT, env=env, timeout=300)


def test_planning_in_a_fresh_process_writes_nothing(tmp_path):
    # the LP (column generation), the MILP (fewest trees) and every family
    out = run("""
        from jax_blink import Topology, plan
        t = Topology.preset("dgx1-v100").subset([0, 1, 2, 4, 5])
        plan(t)
        plan(t, "broadcast", root=1)
        plan(t, max_trees=2)
        plan(Topology.preset("hgx-h100"), "reduce_scatter")
        plan(Topology.from_links(3, [(0, 1, 10.0, "nvlink", 5.0), (1, 2, 10.0), (0, 2, 3.0)]))  # "split"
    """, tmp_path)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout == b"" and out.stderr == b""


def test_plan_json_prints_json_only_on_a_cold_cache(tmp_path):
    out = run(None, tmp_path, "plan", "--topology", "dgx1-v100", "--gpus", "0,1,2,5", "--json")
    assert out.returncode == 0, out.stderr.decode()
    assert json.loads(out.stdout)["gpus"] == [0, 1, 2, 5]
    assert out.stderr == b""


def test_only_the_solvers_banner_is_dropped_and_other_output_survives(tmp_path):
    # a stand-in highspy whose first Highs() writes HiGHS 1.16's two banner lines to descriptor 1,
    # mixed with a line of the program's own (another thread writing at that moment)
    out = run("""
        import os, sys, types
        fake = types.ModuleType("highspy")
        class Highs:
            def __init__(self):
                os.write(1, b"Running HiGHS 9.9.9 (git hash: x): Copyright (c) 2099\\n"
                            b"the caller's own line\\n"
                            b"Includes third-party software components, see THIRD_PARTY_NOTICES.md\\n")
        fake.Highs = Highs
        sys.modules["highspy"] = fake
        print("before", flush=True)
        from jax_blink.planning import solver
        solver._absorb_banner()
        solver._absorb_banner()  # once per process
        print("after")
    """, tmp_path)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().splitlines() == ["before", "the caller's own line", "after"]
