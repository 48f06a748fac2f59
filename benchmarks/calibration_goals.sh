#!/usr/bin/env bash
# Issue 45's goals on this machine, in one run: a fresh full calibration, then psum
# (bench_psum_cpu), training steps (bench_steps) and processes of one host
# (bench_host_transport), each with jax_blink.psum choosing from that profile, against
# lax in the same run. Run it on an idle machine (nothing else timing or building).
#
#   bash benchmarks/calibration_goals.sh [STEP_ROUNDS]
#   (STEPS_ARGS: more arguments of bench_steps.py, e.g. --no-resnet where scikit-learn,
#   which the example's data comes from, is missing)
#
# Writes benchmarks/results/{profile,psum_cpu,steps,host_transport}_<machine>.json
# (<machine>: benchmarks/_machine.py's machine_tag, e.g. intel-xeon-2core).
set -euo pipefail
cd "$(dirname "$0")/.."
export PJRT_NPROC=$(python3 -c "from jax_blink.settings import xla_cpu_threads; print(xla_cpu_threads(8))")
tag=$(cd benchmarks && python3 -c "import _machine; print(_machine.machine_tag())")
out=benchmarks/results
profile="$out/profile_${tag}.json"
start=$SECONDS
python3 -m jax_blink calibrate --out "$profile"
echo "calibrated in $((SECONDS - start)) s"
export JAX_BLINK_PROFILE="$PWD/$profile"   # what every benchmark below chooses from
python3 benchmarks/bench_psum_cpu.py --out "$out/psum_cpu_${tag}.json"
python3 benchmarks/bench_steps.py --rounds "${1:-7}" ${STEPS_ARGS:-}  # e.g. STEPS_ARGS=--no-resnet
python3 benchmarks/bench_host_transport.py --layouts 2x1 4x1 2x4 1x8 --sizes 1 1e3 1e5 1e6 \
  --json "$out/host_transport_${tag}.json"
echo "calibration_goals: done in $((SECONDS - start)) s"
