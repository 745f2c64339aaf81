#!/usr/bin/env bash
# The client's transport seam on the GPU host (issue 20 item 3, issue 16 item 3): the GPU tests that drive the
# IPC reader (mmproc/client/readers.py IpcReader -> IpcClient), then `mmproc bench client` (per-request client CPU)
# over IPC and serialized against a K2.5-shaped server. Run from the repo root with the wheels in .whl/
# (docs/benchmarks/README.md); output goes to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
PORT=${PORT:-50161}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
{
  date -u; echo "commit ${MMPROC_COMMIT:-unknown}"; nvidia-smi --query-gpu=name,uuid,driver_version --format=csv
  python3 -c "import torch, grpc; print('torch', torch.__version__, 'grpc', grpc.__version__)"
} 2>&1 | tee "$OUT/client_tests.log"
# IPC reader: encode_images / views / into / fetch / cache hits (test_ipc_gpu, test_ipc_cache_gpu); TP read_shared
# (test_multi_gpu skips with one GPU); the async client's threaded IPC reader (test_ipc_gpu's async cases).
tests_rc=0
if [ -z "${SKIP_TESTS:-}" ]; then  # SKIP_TESTS=1: the bench alone (the tests ran on this commit already)
  python3 -m pytest -q -p no:cacheprovider tests/transport/test_ipc_gpu.py tests/transport/test_ipc_cache_gpu.py \
    tests/transport/test_multi_gpu.py tests/transport/test_fanout.py tests/client 2>&1 | tee -a "$OUT/client_tests.log"
  tests_rc=${PIPESTATUS[0]}
fi
python3 -m service.app.cli serve --model kimi-k2.5 --device cuda:0 --dtype bfloat16 --transport auto \
  --grpc-address 127.0.0.1:$PORT --http-address "" --ipc-pool-mb 1024 > "$OUT/client_server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server' EXIT
for _ in $(seq 300); do python3 -m service.app.cli health --target 127.0.0.1:$PORT >/dev/null 2>&1 && break; sleep 1; done
python3 -m service.app.cli health --target 127.0.0.1:$PORT || { echo "server never became SERVING"; exit 1; }
for transport in auto serialized; do
  python3 -m mmproc.bench.client --target 127.0.0.1:$PORT --device cuda:0 --transport $transport --images 1,4 \
    --size 512 --requests "${REQUESTS:-300}" --profile --json "$OUT/client_$transport.json" 2>&1 \
    | tee "$OUT/client_$transport.log"
done
exit "$tests_rc"
