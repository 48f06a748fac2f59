"""Do quick calibrations choose right under noise? ``--runs`` quick calibrations in a row on
8 CPU devices, every other one beside a busy process (a pure-Python loop on one core), and
each profile's choices (psum, psum_scatter, all_gather at the sizes a quick calibration
measures) checked against one long interleaved measurement of the same calls made first:
a choice is wrong when the side it picked is slower there by more than ``--tolerance``
(10%). A choice the profile could not make (the two within the measured spread: the plan)
counts as wrong on the same terms.

    python benchmarks/bench_profile_robustness.py [--runs 6] [--truth-rounds 61]
        [--tolerance 0.1] [--json OUT] [--machine NAME]

Writes ``benchmarks/results/quick_profiles_<machine>.json`` (``--machine``: another name;
``--json``: another file). Exit status 1 when any choice was wrong.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

harness.cpu_devices(8)  # before jax is imported

from jax_blink.choice import decide, machine as machines  # noqa: E402
from jax_blink.measure import calibration  # noqa: E402

SIZES = {"allreduce": calibration.QUICK_ELEMENTS,
         **{c: sizes[::2] for c, sizes in calibration.COLLECTIVE_ELEMENTS.items()}}  # a quick one's


def truth(rounds):
    """``{(collective, elements): (blink_us, lax_us)}``: a long interleaved measurement."""
    out = {}
    for c, sizes in SIZES.items():
        for r in calibration.measure_collective(c, sizes, rounds):
            out[c, r["count"]] = (r["blink_added_us"], r["lax_added_us"])
    return out


def chosen(collective, count, nranks=8):
    whole = count * nranks if collective == "allgather" else count
    d = decide.decide(whole, "float32", nranks, collective=collective, platform="cpu")
    return ("blink" if d.uses_blink else "lax"), d.undecided


def busy_process():
    return subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 120\n"
                             "while time.time() < end: pass"], start_new_session=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--truth-rounds", type=int, default=61)
    ap.add_argument("--tolerance", type=float, default=0.1)
    ap.add_argument("--json", default=None,
                    help="write the results here (default: benchmarks/results/quick_profiles_<machine>.json)")
    ap.add_argument("--machine", default=None, help="the machine's name in the default results file")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    measured = truth(args.truth_rounds)
    print(f"long measurement ({args.truth_rounds} rounds): {time.monotonic() - t0:.0f} s")
    runs, wrong_total, total = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.runs):
            loaded = k % 2 == 1
            burner = busy_process() if loaded else None
            try:
                path = Path(tmp) / f"profile{k}.json"
                made, _ = calibration.calibrate(quick=True, path=path, progress=False)
            finally:
                if burner is not None:
                    burner.kill()
                    burner.wait()
            os.environ["JAX_BLINK_PROFILE"] = str(path)
            machines.forget()
            rows = []
            for (c, count), (blink_us, lax_us) in measured.items():
                side, undecided = chosen(c, count)
                picked, other = (blink_us, lax_us) if side == "blink" else (lax_us, blink_us)
                wrong = picked > (1 + args.tolerance) * other
                rows.append({"collective": c, "elements": count, "chose": side, "undecided": undecided,
                             "blink_us": blink_us, "lax_us": lax_us, "wrong": wrong})
            wrong_n = sum(r["wrong"] for r in rows)
            wrong_total += wrong_n
            total += len(rows)
            runs.append({"busy": loaded, "seconds": made.seconds, "provisional": made.provisional,
                         "choices": rows})
            print(f"run {k + 1} ({'beside a busy process' if loaded else 'idle'}, {made.seconds:.1f} s"
                  f"{', provisional' if made.provisional else ''}): {wrong_n} of {len(rows)} choices wrong, "
                  f"{sum(r['undecided'] for r in rows)} undecided (the plan)")
            for r in rows:
                if r["wrong"]:
                    print(f"    {r['collective']} {r['elements']:g}: chose {r['chose']}, blink "
                          f"{r['blink_us']:.0f} us, lax {r['lax_us']:.0f} us")
    print(f"wrong: {wrong_total} of {total} choices")
    path = Path(args.json or harness.RESULTS / f"quick_profiles_{args.machine or harness.machine_tag()}.json")
    path.write_text(json.dumps({"machine": harness.machine(), "tag": harness.machine_tag(),
                                "truth_rounds": args.truth_rounds, "tolerance": args.tolerance, "runs": runs,
                                "wrong": wrong_total, "choices": total}, indent=1) + "\n")
    print(f"wrote {path}")
    return 1 if wrong_total else 0


if __name__ == "__main__":
    sys.exit(main())
