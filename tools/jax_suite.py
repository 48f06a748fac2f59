"""Run JAX's own collective tests with jax_blink's drop-ins swapped in.

JAX's test files do not ship in the jax wheel, so point this script at a
checkout of the JAX repository at the installed version (for example
``git -C jax worktree add /tmp/jax-0.10.2 jax-v0.10.2``). It copies the
chosen test files into a temporary folder, selects the tests whose source
calls one of the swapped ``lax`` functions, runs them twice with pytest (once
as they are, once with ``jax.lax.<op>`` replaced by ``jax_blink.<op>``) and
reports the tests that pass with lax but fail with jax_blink::

    python tools/jax_suite.py --jax-src /tmp/jax-0.10.2 \\
        --files tests/shard_map_test.py tests/pmap_test.py tests/batching_test.py

Nothing is downloaded. The run needs JAX's test dependencies (absl-py,
pytest); on 2 cores the three files above take about 10 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.harness import machine  # noqa: E402

OPS = ("psum", "pmean", "pmax", "pmin", "psum_scatter", "all_gather")

CONFTEST = textwrap.dedent('''
    import ast, os
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()
    OPS = {ops!r}
    SWAP = {swap!r}
    if SWAP:
        import jax, jax_blink
        for name in OPS:
            setattr(jax.lax, name, getattr(jax_blink, name))

    _calls = {{}}

    def _tests_calling(path):
        if path not in _calls:
            tree = ast.parse(open(path).read())
            found = set()
            for cls in [n for n in tree.body if isinstance(n, ast.ClassDef)]:
                for fn in [n for n in cls.body if isinstance(n, ast.FunctionDef)]:
                    names = {{a.attr for a in ast.walk(fn) if isinstance(a, ast.Attribute)}}
                    if names & set(OPS):
                        found.add((cls.name, fn.name))
            _calls[path] = found
        return _calls[path]

    def pytest_collection_modifyitems(config, items):
        keep = []
        for item in items:
            cls = item.cls.__name__ if item.cls else None
            base = item.originalname if hasattr(item, "originalname") else item.name
            base = base.split("[")[0]
            # absl's parameterized tests are named test_x0, test_x_name...: match by prefix
            calls = _tests_calling(str(item.fspath))
            if any(c == cls and (base == f or base.startswith(f)) for c, f in calls):
                keep.append(item)
        items[:] = keep
''')


def run(files, src, swap, timeout_s, workdir):
    work = Path(workdir) / ("swapped" if swap else "lax")
    work.mkdir(parents=True)
    for f in files:
        shutil.copy(Path(src) / f, work / Path(f).name)
    (work / "conftest.py").write_text(CONFTEST.format(ops=OPS, swap=swap))
    report = work / "report.json"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           "--junitxml", str(work / "junit.xml"), *[Path(f).name for f in files]]
    env = dict(os.environ, PJRT_NPROC="64", JAX_PLATFORMS="cpu")
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout_s)
    results = _junit(work / "junit.xml")
    report.write_text(json.dumps(results, indent=1))
    return results, proc.stdout[-2000:]


def _junit(path):
    import xml.etree.ElementTree as ET

    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        if case.find("skipped") is not None:
            out[name] = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            node = case.find("failure") if case.find("failure") is not None else case.find("error")
            out[name] = "failed: " + (node.get("message") or "")[:300]
        else:
            out[name] = "passed"
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jax-src", required=True, help="a JAX repository checkout at the installed version")
    p.add_argument("--files", nargs="+", default=["tests/shard_map_test.py", "tests/pmap_test.py"])
    p.add_argument("--timeout-s", type=int, default=3600)
    p.add_argument("--out", help="write the per-test results (JSON) here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        base, _ = run(args.files, args.jax_src, False, args.timeout_s, tmp)
        ours, tail = run(args.files, args.jax_src, True, args.timeout_s, tmp)
    passing = [t for t, r in base.items() if r == "passed"]
    regressions = {t: ours.get(t, "missing") for t in passing if ours.get(t) != "passed"}
    print(f"tests calling {', '.join(OPS)}: {len(base)}; pass with lax: {len(passing)}; "
          f"pass with jax_blink swapped in: {len(passing) - len(regressions)}")
    for t, r in sorted(regressions.items()):
        print(f"  {t}: {r}")
    if args.out:
        import jax

        command = ("python tools/jax_suite.py --jax-src <jax checkout at jax-v"
                   f"{jax.__version__}> --files {' '.join(args.files)}")
        Path(args.out).write_text(json.dumps({
            "machine": machine(), "jax": jax.__version__, "files": args.files, "command": command,
            "selected": len(base), "pass_with_lax": len(passing),
            "pass_with_jax_blink": len(passing) - len(regressions), "regressions": regressions,
            "lax": base, "jax_blink": ours}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
