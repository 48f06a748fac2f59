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
# Each call ends by recording what its stages left in OUTDIR into
# benchmarks/results/gpu_check_<gpu>.json (benchmarks/gpu_record.py: the stress's calls,
# processes, wrong elements and fresh device executors; the executors at 1, 16 and
# 256 MB; the suite's jax version, passed and failed). It commits nothing: commit
# that file, and OUTDIR's logs where they explain a failure, yourself.
#
# Stages, in order (STAGES picks some; unset: all of them, about 15 minutes):
#   tests     the CUDA tests, serially
#   device    the device executor's GPU tests, and the CUDA tests with
#             JAX_BLINK_CUDA_EXECUTOR=device
#   stress    benchmarks/gpu_stress.py, 4 and 8 processes on the GPU at once,
#             STRESS_SECONDS each (default 25): the stream executor, then the device
#             executor, every call of which is a freshly built executor's first call
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
# would start with under 30 s left is skipped and says so. TEST_TIMEOUT and
# BENCH_TIMEOUT (seconds, default 240 and 180) bound each test run and benchmark.
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

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,pci.bus_id --format=csv
  nvidia-smi topo -m
  nvcc --version | tail -1
  python3 -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
} 2>&1 | tee "$out/machine.txt"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  python3 -m pip install --no-build-isolation --no-deps -e . 2>&1 | tail -25 || exit 1
fi
python3 -c "import jax_blink; print('has_cuda_support', jax_blink.has_cuda_support())" \
  2>&1
git rev-parse HEAD > "$out/commit.txt" 2>/dev/null || true
status=0

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
  for executor in stream device; do
    stamp "gpu_stress $executor"
    secs="${STRESS_SECONDS:-25}"
    timeout "$(limit $((2 * secs + 120)))" python3 benchmarks/gpu_stress.py --processes 4 8 \
      --seconds "$secs" --grace 60 --executor "$executor" --out "$out/gpu_stress_$executor.json" \
      2>&1 | tee "$out/gpu_stress_$executor.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
if want parallel; then
  for i in $(seq "${PARALLEL_RUNS:-2}"); do
    run_tests "test_cuda_n8_run$i" -n 8 "${cuda_tests[@]}"
  done
  run_tests test_executor_n8 -n 8 tests/executor
  stamp "tested in parallel"
fi
bench() {  # name, then bench_cuda.py arguments
  local name="$1"; shift
  stamp "$name"
  JAX_PLATFORMS=cuda,cpu timeout "$(limit "${BENCH_TIMEOUT:-180}")" python3 benchmarks/bench_cuda.py \
    --out "$out/$name.json" "$@" 2>&1
  [ -s "$out/$name.json" ] || { echo "gpu_check: $name wrote no results" >&2; status=1; }
}
if want executors; then
  # both executors side by side, three runs for the 1 MB spread
  for run in "" _run2 _run3; do
    bench "bench_cuda_executors$run" --mbytes 1 16 256 --executors stream device
  done
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
  bench bench_cuda_f32 --chunks 1 2 4 8 16 32
  bench bench_cuda_f32_planner
  bench bench_cuda_bf16 --dtype bfloat16
  bench bench_cuda_f32_staged --staged
  # 1 MB is host-bound: three runs, for the executor's cost model (tests/test_cost_model.py)
  bench bench_cuda_1mb --mbytes 1 --chunks 1 2 4 8
  bench bench_cuda_1mb_run2 --mbytes 1 --chunks 1 2 4 8
  bench bench_cuda_1mb_run3 --mbytes 1 --chunks 1 2 4 8
  bench bench_cuda_16mb --mbytes 16 --chunks 1 2 4 8 16
  bench bench_cuda_hgx --preset hgx-h100
  stamp "bench_cuda_ipc"
  timeout "$(limit "${BENCH_TIMEOUT:-180}")" python3 benchmarks/bench_cuda_ipc.py \
    --out "$out/bench_cuda_ipc.json" 2>&1
  [ -s "$out/bench_cuda_ipc.json" ] || { echo "gpu_check: bench_cuda_ipc wrote no results" >&2; status=1; }
fi
if want calibrate; then
  stamp "calibrate"
  JAX_PLATFORMS=cpu timeout "$(limit "${CALIBRATE_TIMEOUT:-600}")" python3 -m benchmarks run --suite cpu \
    > "$out/cpu_suite.log" 2>&1 || status=1
  tag=$(JAX_PLATFORMS=cpu python3 -c "from benchmarks import harness; print(harness.machine_tag())")
  cp benchmarks/results/*_"$tag".* "$out"/ 2>/dev/null || status=1
fi
python3 benchmarks/gpu_record.py "$out" || status=1
stamp "done"
exit $status
