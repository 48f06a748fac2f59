"""Mutation fuzzing of the two schedule validators: do they accept exactly the same schedules?

Feeds ``Schedule.decode(words).validate()`` (Python) and
``jax_blink._blink_ext.validate_schedule(words)`` (C++) the same mutated
schedules (``tests/schedule_mutations.py``: real schedules from the planner,
the baselines and by hand, with fields changed, extreme values, truncations,
extensions, steps inserted, deleted and reordered) and counts the cases, the
accepted ones, the disagreements (one accepts, the other rejects) and the
crashes (anything but a rejection: another exception type). Prints a summary;
``--out`` writes it as JSON with the machine and every disagreement's words.
``tests/schedule/test_validators_agree.py`` runs a few thousand of these on
every test run; this script runs many more.

``--write-corpus DIR`` instead writes the unmutated seed schedules, one raw
little-endian int64 file each, as the seed corpus of the C++ fuzz target
(``cc/fuzz/fuzz_decode_schedule.cc``), and ``--compare-corpus DIR`` has
both validators judge every file of a corpus (the inputs the fuzz target
kept, read as it reads them); ``.ci/sanitizers`` does both around a fuzzing
run.

Usage: ``python tools/fuzz_schedules.py [--cases 100000] [--seed 0] [--out FILE.json]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from benchmarks.harness import machine  # noqa: E402

from schedule_mutations import mutated_cases, seed_schedules, verdicts  # noqa: E402


def write_corpus(directory: Path, seeds: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, schedule in seeds.items():
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
        (directory / f"{safe}.bin").write_bytes(schedule.encode().astype("<i8").tobytes())
    print(f"wrote {len(seeds)} seed schedules to {directory}")


def read_corpus(directory: Path):
    """``(file name, words)`` of every file, its bytes read as the fuzz target reads them."""
    for path in sorted(directory.iterdir()):
        data = path.read_bytes()
        yield path.name, np.frombuffer(data[:len(data) // 8 * 8], dtype="<i8").astype(np.int64)


def judge(inputs, ext) -> dict:
    """Both validators' verdicts on ``(name, words)`` inputs, counted."""
    accepted = rejected = cases = 0
    disagreements, crashes = [], []
    t0 = time.perf_counter()
    for case, (name, words) in enumerate(inputs):
        cases += 1
        try:
            v = verdicts(words, ext)
        except Exception as e:  # noqa: BLE001 - a crash is what this looks for
            crashes.append({"case": case, "input": name, "error": f"{type(e).__name__}: {e}"[:500],
                            "words": words.tolist()[:4096]})
            continue
        if not v.agree:
            disagreements.append({"case": case, "input": name, "python": v.python, "cpp": v.cpp,
                                  "words": words.tolist()[:4096]})
        elif v.python is None:
            accepted += 1
        else:
            rejected += 1
    seconds = time.perf_counter() - t0
    return {"cases": cases, "accepted_by_both": accepted, "rejected_by_both": rejected,
            "disagreements": len(disagreements), "crashes": len(crashes), "seconds": round(seconds, 2),
            "cases_per_second": round(cases / seconds, 1) if seconds else None,
            "disagreement_cases": disagreements[:100], "crash_cases": crashes[:100]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100_000, help="mutated schedules to try")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the mutations")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--write-corpus", type=Path, metavar="DIR",
                        help="write the seed schedules as the C++ fuzz target's corpus and exit")
    parser.add_argument("--compare-corpus", type=Path, metavar="DIR",
                        help="judge the files of a fuzz corpus instead of mutated schedules")
    args = parser.parse_args(argv)

    from jax_blink import _ffi

    if args.write_corpus:
        write_corpus(args.write_corpus, seed_schedules())
        return 0
    if args.compare_corpus:
        result = {"corpus": str(args.compare_corpus),
                  **judge(read_corpus(args.compare_corpus), _ffi.load_extension())}
    else:
        seeds = seed_schedules()
        result = {"seed": args.seed, "seed_schedules": sorted(seeds),
                  **judge(mutated_cases(seeds, args.cases, args.seed), _ffi.load_extension())}
    print(f"{result['cases']} cases in {result['seconds']} s ({result['cases_per_second']}/s): "
          f"{result['accepted_by_both']} accepted and {result['rejected_by_both']} rejected by both, "
          f"{result['disagreements']} disagreements, {result['crashes']} crashes")
    for d in result["disagreement_cases"][:10]:
        print(f"  case {d['case']} ({d['input']}): python {d['python']!r}, C++ {d['cpp']!r}")
    for c in result["crash_cases"][:10]:
        print(f"  case {c['case']} ({c['input']}): {c['error']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": machine(), **result}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 1 if result["disagreements"] or result["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
