#!/usr/bin/env bash
# The tensor data plane's device checks, in the order their minutes are worth, as one script for a GPU machine.
#
#   bash benchmarks/gpu_check.sh            # from the repository root; results under $OUT, else ./gpu-check
#
# On the lent GPU machine (see GPU_MACHINE.md beside this repository: torch there is the image's, nothing
# installs from a registry) carry the pure-Python wheels the suite needs in .whl/ (structlog, pytest-asyncio,
# sybil, gymnasium; `pip download --no-deps -d .whl ...` here), which this script puts on PYTHONPATH with the
# source tree. Each step has its own timeout (530 s in all, under the device's 600 s a command) and its own
# file, so a step that fails or aborts hides none after it:
#   1. the abort and size checks (each risky case is a test that runs its own processes)
#   2. the rest of the cuda tests, the property test's examples bounded (40 per path)
#   3. bench_gpu.py --rounds 5: every path beside raw torch RPC and the device copy's limit
#   4. bench_rpc.py --transport uv --lane on: the message path and CPU tensors on this machine's cores
set -u
out=${OUT:-gpu-check}
mkdir -p "$out"
export PYTHONPATH="$PWD"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site:$PWD"
fi
python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))' >"$out/0-device.txt" 2>&1
nvidia-smi >>"$out/0-device.txt" 2>&1
pytest=(python3 -m pytest -o addopts="" -p no:cacheprovider -p no:benchmark -m cuda -q -rs)
step() {  # step NAME SECONDS COMMAND...: run it, keep its output and exit code
    local name=$1 seconds=$2
    shift 2
    local started=$SECONDS
    timeout "$seconds" "$@" >"$out/$name.txt" 2>&1
    echo "$name: exit $? in $((SECONDS - started)) s" | tee -a "$out/summary.txt"
}
step 1-abort-and-size 110 "${pytest[@]}" tests/base/test_devices_cuda.py -k "never_aborts or crosses_with_the_defaults"
step 2-cuda-tests 180 "${pytest[@]}" -n 4 --dist loadfile --continue-on-collection-errors tests -k "not never_aborts and not crosses_with_the_defaults"
step 3-bench-gpu 140 python3 benchmarks/bench_gpu.py --rounds 5
step 4-bench-rpc 100 python3 benchmarks/bench_rpc.py --transport uv --lane on --rounds 3
