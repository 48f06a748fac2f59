"""The host transport under the sanitizers (.ci/sanitizers runs it with the ASan +
UBSan modules preloaded and first on the path): a 2 x 2 job of
tests/multiprocess/worker.py's host cases, and a 2 x 1 job whose process 1 is
killed inside a call. Every process must be clean of sanitizer reports, and
the cases must pass (the killed job: the survivor names the exited process).

    python -S .ci/host_transport_sanitized.py <path of tests/multiprocess/worker.py>
"""

import sys

from jax_blink.launch import run_local

worker = sys.argv[1]
bad = 0
for scenario, (processes, devices) in (("host", (2, 2)), ("killed", (2, 1))):
    # -S: the children, like this process, import the sanitized copy on PYTHONPATH
    results = run_local([sys.executable, "-S", worker, scenario], processes,
                        devices_per_process=devices, timeout_s=600)
    for r in results:
        text = r.stdout + r.stderr
        report = "ERROR: AddressSanitizer" in text or "runtime error:" in text
        if scenario == "host":
            ok = r.ok and "FAILED 0" in r.stdout
        else:  # process 1 kills itself; process 0 fails naming it
            ok = r.process_id == 1 or (r.ok and "has exited" in r.stdout)
        print(f"{scenario} process {r.process_id}: exit {r.returncode}, "
              f"{'a sanitizer report' if report else 'no sanitizer report'}, {'ok' if ok else 'FAILED'}")
        if report or not ok:
            bad += 1
            print(text[-4000:])
sys.exit(1 if bad else 0)
