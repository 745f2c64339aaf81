#!/usr/bin/env bash
# Multi-GPU fan-out on an nvidia-h200-x2 / -x4 host, one command: cross-GPU tests (tests/transport/test_multi_gpu.py and the
# CPU-side tests/transport/test_fanout.py), the P2P / IPC open-close microbench, and the handle-cache A/B at TP2 (and TP4
# with >= 4 GPUs) against a kimi-k2.5-shaped server on GPU 0. Run from the repo root with the wheels in .whl/ (see
# docs/benchmarks/README.md). Output, 5 files in $OUT: multi_gpu.log, p2p.json, server.log, fanout_tp2.json,
# fanout_tp4.json. QUICK=1: fewer requests. Record the results in docs/benchmarks/multi-gpu.md.
set -uo pipefail
OUT=${OUT:-/tmp/out}
PORT=${PORT:-50161}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
LOG="$OUT/multi_gpu.log"
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
{
  date -u; echo "commit ${MMPROC_COMMIT:-unknown}; GPUs: $GPUS; CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}"
  nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv
  nvidia-smi topo -m
  python3 -c "import torch, cupy, google.protobuf, grpc; print('torch', torch.__version__, 'cupy', cupy.__version__, 'protobuf', google.protobuf.__version__, 'grpc', grpc.__version__)"
  python3 -c "from cuda.bindings import driver; print('cuda-python driver bindings: ok')" || echo "no cuda-python: consumers poll the ready word"
} > "$LOG" 2>&1
rc=0
echo "== tests" >> "$LOG"
timeout 300 python3 -m pytest -q -rs -p no:cacheprovider tests/transport/test_multi_gpu.py tests/transport/test_fanout.py >> "$LOG" 2>&1 || rc=1
echo "== P2P microbench" >> "$LOG"
timeout 180 python3 -m benchmarks.fanout --p2p --src 0 --mb 256 --reps 20 --json "$OUT/p2p.json" >> "$LOG" 2>&1 || rc=1

echo "== handle-cache A/B (server: kimi-k2.5 shape, random weights, bf16, cuda:0)" >> "$LOG"
python3 -m service.app.cli serve --model kimi-k2.5 --device cuda:0 --dtype bfloat16 --transport ipc \
  --grpc-address 127.0.0.1:$PORT --http-address "" --ipc-pool-mb 1024 > "$OUT/server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server' EXIT
# Ready = gRPC health SERVING (`mmproc health`, the probe command the containers use), within 5 minutes.
for _ in $(seq 300); do python3 -m service.app.cli health --target 127.0.0.1:$PORT >/dev/null 2>&1 && break; sleep 1; done
python3 -m service.app.cli health --target 127.0.0.1:$PORT >> "$LOG" 2>&1 || { echo "server never became SERVING"; exit 1; }
REQUESTS=${REQUESTS:-200}
[ -n "${QUICK:-}" ] && REQUESTS=60
# One 448x448 JPEG per request (256 tokens x 7168 x bf16 = 3.7 MB): a short encode, so the per-request pool open
# that the cache saves is visible; rank r on GPU r, so rank 0 shares the encoder's GPU and the others read peer.
common=(--target 127.0.0.1:$PORT --transport ipc --compare handle-cache --rounds 2 --requests "$REQUESTS" --warmup 10
        --images-per-request 1 --resolutions 448x448 --format jpeg --max-seconds 240 --quiet)
timeout 270 python3 -m benchmarks.fanout "${common[@]}" --tp 2 --devices 0,1 --json "$OUT/fanout_tp2.json" >> "$LOG" 2>&1 || rc=1
if [ "$GPUS" -ge 4 ]; then
  timeout 270 python3 -m benchmarks.fanout "${common[@]}" --tp 4 --devices 0,1,2,3 --json "$OUT/fanout_tp4.json" >> "$LOG" 2>&1 || rc=1
else
  echo "TP4 skipped: $GPUS GPUs" >> "$LOG"
fi
grep -E "IPC|reclaimed|expired|ERROR" "$OUT/server.log" | head -20 >> "$LOG"
echo "exit $rc" >> "$LOG"
exit "$rc"
