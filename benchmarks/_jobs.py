"""What the benchmarks that start local jobs share: process 0's ``RESULT <json>`` line."""

from __future__ import annotations

import json
from typing import Optional, Sequence


def result(outputs: Sequence[tuple]) -> Optional[dict]:
    """The JSON of the ``RESULT`` line process 0 printed, from ``(ok, stdout, stderr)`` per
    process; None (after printing every process's output) when a process failed or
    process 0 printed none."""
    line = next((ln for ln in outputs[0][1].splitlines() if ln.startswith("RESULT ")), None)
    if line is None or not all(ok for ok, _, _ in outputs):
        for i, (ok, out, err) in enumerate(outputs):
            print(f"--- process {i} ({'ok' if ok else 'failed'})\n{out[-2000:]}\n{err[-3000:]}")
        return None
    return json.loads(line[len("RESULT "):])
