set -x
python3 -c "import pybind11, numpy, sys; print(pybind11.__version__, numpy.__version__, sys.version)"; g++ --version | head -1; ulimit -a | grep stack; lscpu | grep -i "model name\|^CPU(s)\|flags" | cut -c1-300
python3 -m pip install -q --no-build-isolation --no-deps -C cmake.build-type=RelWithDebInfo -e . 2>&1 | tail -3
cuda-gdb -q -batch -ex run -ex bt -ex "info threads" --args python3 scratch_gpu/cpu_min.py 2>&1 | grep -v "^\[New Thread\|Thread.*exited" | tail -60
cd tests && JAX_PLATFORMS=cuda,cpu cuda-gdb -q -batch -ex run -ex bt --args python3 -m pytest -q -x -p no:cacheprovider test_cuda.py -k test_custom_call_runs 2>&1 | grep -v "^\[New Thread\|Thread.*exited" | tail -60
