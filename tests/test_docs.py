"""The README and docs/: every table docs/performance.md quotes matches its recorded
results, every relative link resolves, no document is orphaned, the README stays a
front page."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
UPDATE = [sys.executable, "-m", "benchmarks", "docs", "--check"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _run(*extra):
    return subprocess.run(UPDATE + list(extra), capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_performance_tables_match_their_results():
    result = _run()
    assert result.returncode == 0, result.stderr


def test_the_table_check_rejects_a_changed_number(tmp_path):
    doc = (ROOT / "docs" / "performance.md").read_text()
    name = re.search(r"<!-- table: benchmarks/results/(steps_[\w.-]+\.md) 1 -->", doc).group(1)
    marker = f"<!-- table: benchmarks/results/{name} 1 -->\n"
    head, rest = doc.split(marker, 1)
    table, tail = rest.split("<!-- end table -->", 1)
    rows = table.splitlines()
    # the first data row with its last cell changed (#wrong 0 -> 1)
    rows[2] = rows[2][: rows[2].rstrip(" |").rfind("|")] + "| 1 |"
    changed = tmp_path / "performance.md"
    changed.write_text(head + marker + "\n".join(rows) + "\n<!-- end table -->" + tail)
    result = _run("--doc", str(changed))
    assert result.returncode == 1
    assert name in result.stderr


@pytest.mark.parametrize("marker, says", [
    ("benchmarks/results/nope.md 1", "cannot read benchmarks/results/nope.md"),
    ("benchmarks/results/steps_amd-epyc-2core.md 9", "asked for table 9; the file has 1"),
    ("benchmarks/results/steps_amd-epyc-2core.md psum_cpu", "is not a psum_cpu result"),
    ("benchmarks/results/psum_cpu_amd-epyc-2core.json fancy", "no renderer 'fancy'"),
])
def test_a_marker_that_names_no_table_is_one_line_and_exit_2(tmp_path, marker, says):
    doc = tmp_path / "performance.md"
    doc.write_text(f"x\n<!-- table: {marker} -->\n<!-- end table -->\n")
    result = _run("--doc", str(doc))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"the marker '{marker}'" in result.stderr and says in result.stderr
    assert _run("--doc", str(tmp_path / "missing.md")).returncode == 2


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set:
    return {_slug(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")}


@pytest.mark.parametrize("path", [README] + DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(path):
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(target)
    assert not broken, f"{path.name}: links to nothing: {broken}"


def test_the_link_check_rejects_a_missing_anchor():
    assert "the-planner" in _anchors(ROOT / "docs" / "performance.md")
    assert "the-planers" not in _anchors(ROOT / "docs" / "performance.md")


def test_the_readme_links_every_document():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in LINK.findall(README.read_text())}
    orphans = [d.name for d in DOCS if d.resolve() not in linked]
    assert not orphans, f"docs the README does not link: {orphans}"


def test_the_readme_is_a_front_page():
    text = README.read_text()
    # the two commands come first: the example, then the tests (.ci/run runs the second)
    first_block = re.search(r"```\n(.*?)```", text, re.S).group(1).splitlines()
    assert "examples/flax_resnet.py" in first_block[0]
    assert "pytest" in first_block[1]
    assert first_block[1] in (ROOT / ".ci" / "run").read_text()
