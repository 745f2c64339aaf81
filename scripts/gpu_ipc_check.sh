#!/usr/bin/env bash
# CUDA IPC transport on the GPU host: separate-process tests, then the transport benchmarks.
# Run from the repo root with the wheels in .whl/ (see docs/benchmarks/README.md); output goes to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
{
  date -u; echo "commit ${MMPROC_COMMIT:-unknown}"; nvidia-smi --query-gpu=name,uuid,driver_version --format=csv
  python3 -c "import torch, cupy, google.protobuf, grpc; print('torch', torch.__version__, 'cupy', cupy.__version__, 'protobuf', google.protobuf.__version__, 'grpc', grpc.__version__)"
  python3 -c "from cuda.bindings import driver; print('cuda-python driver bindings: ok')" || echo "no cuda-python: consumers poll the ready word"
} 2>&1 | tee "$OUT/ipc_tests.log"
python3 -m pytest -q -p no:cacheprovider tests/transport/test_ipc_gpu.py 2>&1 | tee -a "$OUT/ipc_tests.log"
tests_rc=${PIPESTATUS[0]}
if [ -f mmproc/bench/serve.py ]; then
  bash scripts/gpu_serve_bench.sh 2>&1 | tee "$OUT/serve_bench.log"
fi
exit "$tests_rc"
