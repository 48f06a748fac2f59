#!/usr/bin/env bash
# Everything the CUDA path needs verified on a machine with an NVIDIA GPU, in
# one go: build over the installed jax (no network), the CUDA tests serially and
# in parallel, the wrong-values stress, the benchmarks, and the whole suite on the
# image's jax.
#
#   bash benchmarks/gpu_check.sh [OUTDIR]
#   STAGES="tests parallel stress" SKIP_BUILD=1 bash benchmarks/gpu_check.sh out2
#
# Stages, in order (STAGES picks some; all of them take about 15 minutes on an H100
# host with 16 cores, more than one call of the device tool: run
# STAGES="tests parallel device stress" first (issues 42 and 43, about 7 minutes),
# then STAGES="bench suite" SKIP_BUILD=1 on the same warm machine):
#   tests     the CUDA tests, serially
#   parallel  the CUDA tests under pytest -n 8, PARALLEL_RUNS times (default 5),
#             then tests/executor once under -n 8 (parallel runs found wrong sums
#             that serial ones hid: issue 42)
#   device    the device executor's GPU tests, and the CUDA tests with
#             JAX_BLINK_CUDA_EXECUTOR=device (issue 43)
#   stress    benchmarks/gpu_stress.py: 4 and 8 processes on the GPU at once,
#             STRESS_SECONDS each (default 40), counting wrong elements
#   bench     benchmarks/bench_cuda.py and bench_cuda_ipc.py
#   suite     the whole suite on the CPU under the image's jax, and the tests that start CPU
#             processes under the GPU machine's default platforms (issue 44)
#   repro     (not by default; about 10 min) issue 44's multi-process segfault reproducer
#   calibrate (not by default; about 5 min) issue 45's goals on the host's CPU
#             (benchmarks/calibration_goals.sh under JAX_PLATFORMS=cpu; its results are
#             copied to OUTDIR). A psum over one GPU is lax's, so a one-GPU machine has no
#             GPU allreduce to calibrate: `python -m jax_blink calibrate` measures one on
#             hosts of several GPUs
# Logs and JSON results go to OUTDIR (default ./gpu_check_out). TEST_TIMEOUT and
# BENCH_TIMEOUT (seconds, default 420 and 300) bound each test run and each
# benchmark, so that the whole check fits a short lease of a GPU machine.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu_check_out}"
mkdir -p "$out"
stages="${STAGES:-tests parallel device stress bench suite}"
want() { [[ " $stages " == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
start=$SECONDS
stamp() { echo "gpu_check: $1 at +$((SECONDS - start)) s"; }

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
  timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider -rfEs "$@" > "$log" 2>&1
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
if want parallel; then
  for i in $(seq "${PARALLEL_RUNS:-5}"); do
    run_tests "test_cuda_n8_run$i" -n 8 "${cuda_tests[@]}"
  done
  run_tests test_executor_n8 -n 8 tests/executor
  stamp "tested in parallel"
fi
if want device; then
  # the device executor (issue 43): its own tests, and the CUDA tests with it in the handler
  run_tests test_device_exec_cuda tests/executor/test_device_exec_cuda.py
  JAX_BLINK_CUDA_EXECUTOR=device run_tests test_cuda_device_executor --maxfail=15 tests/executor/test_cuda.py
  stamp "device tested"
fi
if want stress; then
  stamp "gpu_stress"
  timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/gpu_stress.py --processes 4 8 \
    --seconds "${STRESS_SECONDS:-40}" --out "$out/gpu_stress.json" 2>&1 | tee "$out/gpu_stress.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if want bench; then
  bench() {  # name, then bench_cuda.py arguments
    local name="$1"; shift
    stamp "$name"
    JAX_PLATFORMS=cuda,cpu timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/bench_cuda.py --out "$out/$name.json" "$@" 2>&1
  }
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
  # both executors side by side (issue 43's goals), three runs for the 1 MB spread
  bench bench_cuda_executors --mbytes 1 16 256 --executors stream device
  bench bench_cuda_executors_run2 --mbytes 1 16 256 --executors stream device
  bench bench_cuda_executors_run3 --mbytes 1 16 256 --executors stream device

  stamp "bench_cuda_ipc"
  timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/bench_cuda_ipc.py --out "$out/bench_cuda_ipc.json" 2>&1

  for f in bench_cuda_f32 bench_cuda_f32_planner bench_cuda_bf16 bench_cuda_f32_staged bench_cuda_1mb \
           bench_cuda_1mb_run2 bench_cuda_1mb_run3 bench_cuda_16mb bench_cuda_hgx bench_cuda_ipc \
           bench_cuda_executors bench_cuda_executors_run2 bench_cuda_executors_run3; do
    if [ ! -s "$out/$f.json" ]; then
      echo "gpu_check: $f wrote no results" >&2
      status=1
    fi
  done
fi
if want suite; then
  stamp "suite"
  # the whole suite on the image's jax (issue 44); about 3.5 min on 16 cores
  TEST_TIMEOUT="${SUITE_TIMEOUT:-600}" JAX_PLATFORMS=cpu \
    run_tests suite -n "$(( $(nproc) > 2 ? $(nproc) - 2 : 1 ))" tests
  # the README's test command as a user runs it on a GPU machine (conftest: cpu,cuda), for the
  # tests that start CPU processes
  run_tests suite_gpu_env -n 8 tests/ops/test_example.py tests/ops/test_readme.py \
    tests/ops/test_arguments.py tests/multiprocess
fi
if want calibrate; then
  stamp "calibrate"
  # (the ResNet's step needs scikit-learn's digits, which the image may lack)
  STEPS_ARGS=$(python3 -c "import sklearn" 2>/dev/null || echo --no-resnet) \
  JAX_PLATFORMS=cpu timeout "${CALIBRATE_TIMEOUT:-480}" bash benchmarks/calibration_goals.sh \
    > "$out/calibration_goals.log" 2>&1 || status=1
  tag=$(cd benchmarks && JAX_PLATFORMS=cpu python3 -c "import _machine; print(_machine.machine_tag())")
  cp benchmarks/results/*_"$tag".* "$out"/ 2>/dev/null || status=1
fi
if want repro; then
  # issue 44's multi-process segfault under load (about 10 min); if it crashes, rerun with --gdb
  stamp "repro"
  timeout 600 python3 benchmarks/repro_multiprocess_load.py --rounds 5 --burners 14 --parallel 2 \
    --out "$out/repro_multiprocess" 2>&1 | tee "$out/repro_multiprocess.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
stamp "done"
exit $status
