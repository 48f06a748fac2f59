"""The tables docs/performance.md quotes, made from the recorded results.

docs/performance.md marks each table it quotes::

    <!-- table: benchmarks/results/steps_amd-epyc-2core.md 1 -->
    | ... |
    <!-- end table -->

(the first Markdown table of that file), or, for results recorded as JSON only,
``<!-- table: benchmarks/results/psum_cpu_amd-epyc-2core.json psum_cpu -->``
(the table that :data:`RENDER` makes of it). This rewrites every marked table
from its source; ``--check`` only reports (exit 1) the tables that differ, which
tests/test_docs.py runs, so the document never quotes numbers its results do
not hold. A marker that names no table (a missing file, a table number past
the file's last, an unknown renderer) is one line on stderr and exit 2.

Usage: ``python -m benchmarks docs [--check]`` (:func:`refresh`; each suite of the runner
ends with it).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "performance.md"
MARKED = re.compile(r"(<!-- table: (\S+) (\S+) -->\n)(.*?)(<!-- end table -->)", re.S)


def markdown_table(text: str, index: int) -> str:
    """The ``index``-th (from 1) run of lines starting with ``|`` in ``text``."""
    tables, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    if not 1 <= index <= len(tables):
        raise ValueError(f"asked for table {index}; the file has {len(tables)}")
    return "\n".join(tables[index - 1]) + "\n"


def _size(count) -> str:
    """``1e6`` for 1000000, ``4e6`` for 4000000; other counts as they are."""
    digits = str(count)
    lead = digits.rstrip("0")
    return f"{lead}e{len(digits) - 1}" if len(lead) == 1 and count >= 100 else digits


def psum_cpu(data: dict) -> str:
    """bench_cpu.py psum's rows: each call's time and the time it adds to the step without it."""
    lines = ["| elements per device | no psum | lax.psum | jax_blink.psum | blink / lax | added by lax | "
             "added by jax_blink | added: blink / lax | wrong |", "|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        lines.append(f"| {_size(r['count'])} | {r['none_us']:.1f} us | {r['lax_us']:.1f} us | {r['blink_us']:.1f} us "
                     f"| {r['ratio_blink_over_lax']:.2f} | {r['lax_added_us']:.1f} us | {r['blink_added_us']:.1f} us "
                     f"| {r['added_ratio_blink_over_lax']:.2f} | {r['wrong']} |")
    return "\n".join(lines) + "\n"


def multiprocess(data: dict) -> str:
    """bench_processes.py multiprocess's rows: jax_blink / lax time per op, layout and size; ``lax (r)``
    where jax_blink itself ran lax's collective (r: two runs of one program, this machine's noise)."""
    layouts = [(res["processes"], res["devices_per_process"]) for res in data["results"]]
    ops = list(dict.fromkeys(r["op"] for res in data["results"] for r in res["rows"]))
    header = [f"{op} {p}x{d}" for op in ops for p, d in layouts]
    lines = ["| elements per device | " + " | ".join(header) + " |", "|---|" + "---|" * len(header)]
    sizes = list(dict.fromkeys(r["size"] for res in data["results"] for r in res["rows"]))
    for size in sizes:
        cells = []
        for op in ops:
            for res in data["results"]:
                row = next((r for r in res["rows"] if r["op"] == op and r["size"] == size), None)
                if row is None:
                    cells.append("-")
                elif row["runs"] == "lax":
                    cells.append(f"lax ({row['ratio']:.2f})")
                else:
                    cells.append(f"{row['ratio']:.2f}" + (f" ({row['wrong']} wrong)" if row["wrong"] else ""))
        lines.append(f"| {_size(size)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def host_transport(data: dict) -> str:
    """bench_processes.py host_transport's rows: per layout and size, jax_blink over the host transport
    (interleaved with the others, and alone), lax.psum (gloo) and the path without the host
    transport, in ms and as ratios to lax."""
    lines = ["| processes x devices | elements per device | jax_blink | jax_blink alone | lax.psum | "
             "blink / lax | without the host transport / lax | wrong |",
             "|---|---|---|---|---|---|---|---|"]
    for res in data["results"]:
        for r in res["rows"]:
            what = _size(r["size"]) if r["what"] == "psum" else r["what"]
            old = f"{r['old_ms'] / r['lax_ms']:.2f}" if "old_ms" in r else "-"
            alone = f"{r['blink_alone_ms']:.3f} ms" if "blink_alone_ms" in r else "-"
            lines.append(f"| {res['processes']} x {res['devices_per_process']} | {what} "
                         f"| {r['blink_ms']:.3f} ms | {alone} | {r['lax_ms']:.3f} ms "
                         f"| {r['blink_ms'] / r['lax_ms']:.2f} | {old} | {r['wrong']['blink']} |")
    return "\n".join(lines) + "\n"


def cuda(data: dict) -> str:
    """gpu_check.sh's bench_cuda.py results (``runs``: one JSON per benchmark): each
    allreduce with its plan, time, bus bandwidth, ratio to the copy bound and host costs;
    where a benchmark was repeated (``NAME``, ``NAME_run2``, ...) the times of every run."""
    lines = ["| run | plan | trees x chunks | time | busbw per rank | x copy bound | "
             "API calls per rank | host enqueue per rank | workspace per rank |",
             "|---|---|---|---|---|---|---|---|---|"]
    runs = data["runs"]
    for name in sorted(runs, key=lambda k: (-runs[k]["bytes_per_rank"], k)):
        b = runs[name]
        if "_run" in name:
            continue
        repeats = [runs[k] for k in sorted(runs) if k.startswith(name + "_run")]
        what = (f"{b['bytes_per_rank'] / 1e6:g} MB {b['dtype']}" + (", staged reads" if b["staged"] else "")
                + (", model's chunks" if name.endswith("_planner") else ""))
        for i, r in enumerate(b["allreduce"]):
            times = [r["seconds"]] + [x["allreduce"][i]["seconds"] for x in repeats]
            lines.append(
                f"| {what} | {b['preset']} | {r['trees']} x {r['chunks']} "
                f"| {' / '.join(f'{t * 1e3:.3f}' for t in times)} ms | {r['busbw_gbps']:.1f} GB/s "
                f"| {r['ratio_to_copy_bound']:.2f} | {r['api_calls_per_rank']:.0f} "
                f"| {r['enqueue_us_per_rank']:.0f} us | {r['workspace_bytes_per_rank'] / 1e6:.0f} MB |")
    return "\n".join(lines) + "\n"


def cuda_ipc(data: dict) -> str:
    """bench_cuda_ipc.py's rows: P ranks as processes over CUDA IPC against P rank threads of
    one process, on one GPU."""
    lines = ["| processes | MB per rank | P rank threads, one process | P processes, CUDA IPC | "
             "ratio | wrong |", "|---|---|---|---|---|---|"]
    for r in data["rows"]:
        lines.append(f"| {r['processes']} | {r['bytes_per_rank'] / 1e6:g} | {r['in_process_s'] * 1e3:.3f} ms "
                     f"| {r['across_processes_s'] * 1e3:.3f} ms | {r['ratio']:.2f} | {r['wrong']} |")
    return "\n".join(lines) + "\n"


#: Renderers of results recorded as JSON only.
RENDER = {"psum_cpu": psum_cpu, "multiprocess": multiprocess, "host_transport": host_transport,
          "cuda": cuda, "cuda_ipc": cuda_ipc}


def table(source: str, which: str) -> str:
    """The table a marker names; ValueError saying why where it names none."""
    try:
        text = (ROOT / source).read_text()
    except OSError as e:
        raise ValueError(f"cannot read {source}: {e.strerror or e}") from None
    if which.isdigit():
        return markdown_table(text, int(which))
    if which not in RENDER:
        raise ValueError(f"no renderer {which!r}: give a table number or one of {', '.join(RENDER)}")
    try:
        return RENDER[which](json.loads(text))
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{source} is not a {which} result ({type(e).__name__}: {e})") from None


#: How a lead cites the run behind its results: ``[results](../benchmarks/results/NAME),
#: commit HASH, the MACHINE VM`` (the commit alone, or ``that VM``, also match).
CITED = r"(\[results\]\(\.\./{name}\),\s+)(?:commit\s+)?[0-9a-f]{{7,40}}(?:,\s+(?:the|that)\s+[^,;)]*?VM)?"


def stamp(text: str, runs: dict) -> tuple:
    """``(text, unstamped)``: ``text`` with the run each results file of ``runs`` (path ->
    ``(commit, machine)``) came from in the leads that cite it (:data:`CITED`), and the
    files ``text`` links to but no lead cites so (their leads are edited by hand)."""
    unstamped = []
    for path, (commit, machine) in runs.items():
        if f"(../{path})" not in text:
            continue
        text, n = re.subn(CITED.format(name=re.escape(path)), lambda m: f"{m.group(1)}commit {commit}, the {machine} VM",
                          text)
        if not n:
            unstamped.append(path)
    return text, unstamped


def refresh(doc: Path = DOC, check: bool = False, retarget: Optional[dict] = None,
            runs: Optional[dict] = None) -> int:
    """Rewrites every marked table of ``doc`` from its source (``check``: only reports, exit 1,
    the tables that differ). ``retarget`` (old source -> new) first points markers at other
    results files: a suite's own machine's; ``runs`` (results file -> ``(commit, machine)``)
    the leads at the run that wrote them (:func:`stamp`). Returns the exit status."""
    try:
        text = doc.read_text()
    except OSError as e:
        print(f"benchmarks docs: cannot read {doc}: {e.strerror or e}", file=sys.stderr)
        return 2
    for old, new in (retarget or {}).items():  # the marker, and links to its results (any extension)
        old_stem, new_stem = old.rsplit(".", 1)[0], new.rsplit(".", 1)[0]
        text = text.replace(f"<!-- table: {old} ", f"<!-- table: {new} ").replace(f"{old_stem}.", f"{new_stem}.")
    text, unstamped = stamp(text, runs or {})
    for path in unstamped:
        print(f"benchmarks docs: no lead in {doc} cites {path} as '[results](../{path}), commit HASH, the "
              "MACHINE VM'; say which run it quotes by hand", file=sys.stderr)
    stale = []

    def one(match):
        try:
            new = table(match.group(2), match.group(3))
        except ValueError as e:
            raise ValueError(f"the marker '{match.group(2)} {match.group(3)}': {e}") from None
        if new != match.group(4):
            stale.append(f"{match.group(2)} {match.group(3)}")
        return match.group(1) + new + match.group(5)

    try:
        updated = MARKED.sub(one, text)
    except ValueError as e:
        print(f"benchmarks docs: {doc}: {e}", file=sys.stderr)
        return 2
    if not MARKED.search(text):
        print(f"no marked tables in {doc}", file=sys.stderr)
        return 1
    if check:
        for s in stale:
            print(f"{doc}: the table from {s} differs from its source; run python -m benchmarks docs",
                  file=sys.stderr)
        return 1 if stale else 0
    doc.write_text(updated)
    print(f"updated {len(stale)} table(s) in {doc}")
    return 0


def sources(doc: Path = DOC) -> list:
    """The results files ``doc``'s markers quote."""
    return [m.group(2) for m in MARKED.finditer(doc.read_text())]
