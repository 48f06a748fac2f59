#!/usr/bin/env bash
# Everything the CUDA path needs verified on a machine with an NVIDIA GPU: build over
# the installed jax (no network), the CUDA tests serially and in parallel, the
# wrong-values stress of both executors, the executors side by side, and the whole
# suite on the image's jax. A lease is 15 minutes of device time, start-up included,
# so the check runs as two calls of at most 8 minutes each on a warm machine (each
# begins with the wheel install lines of ../shared/gpu/wheels.sh):
#
#   STAGES="tests device stress" bash benchmarks/gpu_check.sh gpu_out
#   STAGES="parallel executors suite" SKIP_BUILD=1 bash benchmarks/gpu_check.sh gpu_out
#
# The benchmark stages are steps of the runner's gpu suite (python -m benchmarks run
# --suite gpu --only ...; benchmarks/__main__.py). Each call ends with its record step:
# benchmarks/gpu_record.py collects what the stages left in OUTDIR into
# benchmarks/results/gpu_check_<gpu>.json (the stress's calls, processes, wrong elements and
# fresh device executors; the executors at 1, 16 and 256 MB; the suite's jax version, passed
# and failed), cuda_<gpu>.json and cuda_ipc_<gpu>.json, and the runner regenerates
# docs/performance.md's tables from them. It commits nothing: commit those files, and
# OUTDIR's logs where they explain a failure, yourself.
#
# Stages, in order (STAGES picks some; unset: all of them, about 15 minutes):
#   tests     the CUDA tests, serially
#   device    the device executor's GPU tests, and the CUDA tests with
#             JAX_BLINK_CUDA_EXECUTOR=device
#   stress    benchmarks/gpu_stress.py, 4 and 8 processes on the GPU at once, 25 s
#             each: the stream executor, then the device executor, every call of which
#             is a freshly built executor's first call
#   parallel  the CUDA tests under pytest -n 8, PARALLEL_RUNS times (default 2), then
#             tests/executor once under -n 8 (parallel runs found wrong sums that
#             serial ones hid)
#   executors benchmarks/bench_cuda.py, both executors side by side at 1, 16 and 256 MB
#             per rank, three runs (the 1 MB spread)
#   suite     the whole suite on the CPU under the image's jax, and the tests that start
#             CPU processes under the GPU machine's default platforms
#   bench     (not by default) the other bench_cuda.py runs and bench_cuda_ipc.py
#   calibrate (not by default; about 10 min) the runner's cpu suite on the host's CPU
#             (python -m benchmarks run --suite cpu under JAX_PLATFORMS=cpu: a full
#             calibration, then the CPU benchmarks choosing from it; its results are copied
#             to OUTDIR). A psum over one GPU is lax's, so a one-GPU machine has no GPU
#             allreduce to calibrate: `python -m jax_blink calibrate` measures one on hosts
#             of several GPUs
# Logs and JSON results go to OUTDIR (default ./gpu_check_out). BUDGET_S (default 450)
# bounds a call: every stage's timeout is cut to what is left of it, and a stage that
# would start with under 30 s left is skipped and says so. TEST_TIMEOUT (seconds, default
# 240) bounds each test run; the gpu suite's steps have their own timeouts.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu_check_out}"
mkdir -p "$out"
stages="${STAGES:-tests device stress parallel executors suite}"
export PYTHONUNBUFFERED=1
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
start=$SECONDS
budget="${BUDGET_S:-450}"
stamp() { echo "gpu_check: $1 at +$((SECONDS - start)) s"; }
left() { echo $((budget - (SECONDS - start))); }
# a stage runs when STAGES names it and at least 30 s of the budget are left
want() {
  [[ " $stages " == *" $1 "* ]] || return 1
  if [ "$(left)" -lt 30 ]; then
    echo "gpu_check: stage $1 skipped: $(left) s of BUDGET_S=$budget left" | tee -a "$out/skipped.txt"
    status=1
    return 1
  fi
}
# the smaller of a stage's own timeout and what is left of the budget
limit() { local l; l=$(left); echo $(( $1 < l ? $1 : l )); }

python3 benchmarks/gpu_record.py "$out" --describe  # machine.txt, commit.txt

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  python3 -m pip install --no-build-isolation --no-deps -e . 2>&1 | tail -25 || exit 1
fi
python3 -c "import jax_blink; print('has_cuda_support', jax_blink.has_cuda_support())" \
  2>&1
status=0
# steps of the gpu suite (python -m benchmarks list), within what is left of the budget
# (but record, which keeps what the stages did, whatever is left)
suite_steps() {
  stamp "gpu suite: $*"
  local budget=(--budget "$(left)")
  [ "$*" = record ] && budget=()
  python3 -m benchmarks run --suite gpu --out "$out" ${budget[@]+"${budget[@]}"} --only "$@" 2>&1 || status=1
}

cuda_tests=(tests/executor/test_cuda.py tests/executor/test_cuda_ipc.py tests/executor/test_device_exec_cuda.py)
# pytest run: log name, then pytest arguments; fails the check when pytest does.
run_tests() {
  local log="$out/$1.log"; shift
  timeout "$(limit "${TEST_TIMEOUT:-240}")" python3 -m pytest -q -p no:cacheprovider -rfEs -n 0 "$@" > "$log" 2>&1
  local rc=$?
  grep -E "^(FAILED|ERROR)|passed|failed" "$log" | tail -20
  if [ "$rc" != 0 ]; then
    echo "gpu_check: $log: pytest exit $rc" | tee -a "$log"
    status=1
  fi
}
# (tests/conftest.py makes jax start its CUDA backend beside the 8 CPU devices)
stamp "built"
if want tests; then
  run_tests test_cuda --maxfail=15 "${cuda_tests[@]}"
  stamp "tested"
fi
if want device; then
  # the device executor: its own tests, and the CUDA tests with it in the handler
  run_tests test_device_exec_cuda tests/executor/test_device_exec_cuda.py
  JAX_BLINK_CUDA_EXECUTOR=device run_tests test_cuda_device_executor --maxfail=15 tests/executor/test_cuda.py
  stamp "device tested"
fi
if want stress; then
  suite_steps "stress stream" "stress device"
fi
if want parallel; then
  for i in $(seq "${PARALLEL_RUNS:-2}"); do
    run_tests "test_cuda_n8_run$i" -n 8 "${cuda_tests[@]}"
  done
  run_tests test_executor_n8 -n 8 tests/executor
  stamp "tested in parallel"
fi
if want executors; then
  suite_steps executors executors_run2 executors_run3
fi
if want suite; then
  stamp "suite"
  # the whole suite on the image's jax; about 3.5 min on 16 cores
  TEST_TIMEOUT="${SUITE_TIMEOUT:-300}" JAX_PLATFORMS=cpu \
    run_tests suite -n "$(( $(nproc) > 2 ? $(nproc) - 2 : 1 ))" tests
  # the README's test command as a user runs it on a GPU machine (conftest: cpu,cuda), for the
  # tests that start CPU processes
  run_tests suite_gpu_env -n 8 tests/ops/test_example.py tests/ops/test_readme.py \
    tests/ops/test_arguments.py tests/multiprocess
fi
if want bench; then
  suite_steps f32 f32_planner bf16 f32_staged 1mb 1mb_run2 1mb_run3 16mb hgx cuda_ipc
fi
if want calibrate; then
  stamp "calibrate"
  JAX_PLATFORMS=cpu timeout "$(limit "${CALIBRATE_TIMEOUT:-600}")" python3 -m benchmarks run --suite cpu \
    > "$out/cpu_suite.log" 2>&1 || status=1
  tag=$(JAX_PLATFORMS=cpu python3 -c "from benchmarks import harness; print(harness.machine_tag())")
  cp benchmarks/results/*_"$tag".* "$out"/ 2>/dev/null || status=1
fi
# gpu_record.py, then the tables of docs/performance.md regenerated from what it recorded
suite_steps record
stamp "done"
exit $status
