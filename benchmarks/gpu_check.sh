#!/usr/bin/env bash
# Everything the CUDA path needs verified on a machine with an NVIDIA GPU, in
# one go: build over the installed jax (no network), the CUDA tests, the
# kernel/allreduce benchmark, and jax_blink.psum under XLA:GPU.
#
#   bash benchmarks/gpu_check.sh [OUTDIR]
#
# Logs and JSON results go to OUTDIR (default ./gpu_check_out). TEST_TIMEOUT and
# BENCH_TIMEOUT (seconds, default 420 and 300) bound the tests and each benchmark, so
# that the whole check fits a short lease of a GPU machine.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu_check_out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PJRT_NPROC=64
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
start=$SECONDS
stamp() { echo "gpu_check: $1 at +$((SECONDS - start)) s"; }

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,pci.bus_id --format=csv
  nvidia-smi topo -m
  nvcc --version | tail -1
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
} 2>&1 | tee "$out/machine.txt"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  python3 -m pip install --no-build-isolation --no-deps -e . 2>&1 | tail -25 || exit 1
fi
python3 -c "import jax_blink; print('has_cuda_support', jax_blink.has_cuda_support())" \
  2>&1

status=0
# (tests/conftest.py makes jax start its CUDA backend beside the 8 CPU devices)
stamp "built"
timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q --maxfail=15 -p no:cacheprovider \
  -rfEs tests/executor/test_cuda.py tests/executor/test_cuda_ipc.py > "$out/test_cuda.log" 2>&1
rc=$?
grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$out/test_cuda.log" | tail -40
if [ "$rc" != 0 ]; then
  echo "gpu_check: the CUDA tests failed or did not finish (pytest exit $rc)" | tee -a "$out/test_cuda.log"
  status=1
fi
stamp "tested"
git rev-parse HEAD > "$out/commit.txt" 2>/dev/null || true

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

stamp "bench_cuda_ipc"
timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/bench_cuda_ipc.py --out "$out/bench_cuda_ipc.json" 2>&1

for f in bench_cuda_f32 bench_cuda_f32_planner bench_cuda_bf16 bench_cuda_f32_staged bench_cuda_1mb \
         bench_cuda_1mb_run2 bench_cuda_1mb_run3 bench_cuda_16mb bench_cuda_hgx bench_cuda_ipc; do
  if [ ! -s "$out/$f.json" ]; then
    echo "gpu_check: $f wrote no results" >&2
    status=1
  fi
done
stamp "done"
exit $status
