#!/usr/bin/env bash
# Everything the CUDA path needs verified on a machine with an NVIDIA GPU, in
# one go: build over the installed jax (no network), the CUDA tests, the
# kernel/allreduce benchmark, and jax_blink.psum under XLA:GPU.
#
#   bash benchmarks/gpu_check.sh [OUTDIR]
#
# Logs and JSON results go to OUTDIR (default ./gpu_check_out).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu_check_out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PJRT_NPROC=64

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,pci.bus_id --format=csv
  nvidia-smi topo -m
  nvcc --version | tail -1
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
} 2>&1 | tee "$out/machine.txt"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  python3 -m pip install --no-build-isolation --no-deps -e . 2>&1 | tail -25 | tee "$out/build.log" || exit 1
fi
python3 -c "import jax_blink; print('has_cuda_support', jax_blink.has_cuda_support())" \
  2>&1 | tee -a "$out/build.log"

JAX_PLATFORMS=cuda,cpu timeout 420 python3 -m pytest -q --maxfail=15 --timeout 120 -p no:cacheprovider \
  tests/test_cuda.py 2>&1 | tail -60 | tee "$out/test_cuda.log"

JAX_PLATFORMS=cuda,cpu timeout 200 python3 benchmarks/bench_cuda.py --out "$out/bench_cuda.json" \
  2>&1 | tee "$out/bench_cuda.log"
