#!/usr/bin/env bash
# Session-4 GPU checks, from the repo root with the wheels in .whl/ (see docs/benchmarks/README.md); output in $OUT:
#   1. `mmproc serve --model kimi-k3 --device cuda:0` serves (health SERVING), single-image latency end to end
#      (1 x 448^2 JPEG, concurrency 1, IPC and serialized) with CUDA graphs on;
#   2. results kept by key and fetched over IPC vs serialized (the vLLM connector's worker path), GPU tests;
#   3. JPEG decode on the GPU (torchvision nvJPEG, nvImageCodec fancy upsampling) vs the CPU path.
set -uo pipefail
OUT=${OUT:-/tmp/out}
PORT=${PORT:-50161}
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
python3 -m service.app.cli serve --model kimi-k3 --device cuda:0 --dtype bfloat16 --transport auto \
  --grpc-address 127.0.0.1:$PORT --http-address "" --ipc-pool-mb 1024 > "$OUT/k3_server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server' EXIT
for _ in $(seq 300); do python3 -m service.app.cli health --target 127.0.0.1:$PORT >/dev/null 2>&1 && break; sleep 1; done
python3 -m service.app.cli health --target 127.0.0.1:$PORT || { echo "K3 server never became SERVING"; tail -30 "$OUT/k3_server.log"; exit 1; }
common=(--target 127.0.0.1:$PORT --device cuda:0 --images-per-request 1 --resolutions 448x448 --format jpeg
        --requests 300 --warmup 30 --concurrency 1 --quiet)
python3 -m mmproc.bench.serve "${common[@]}" --compare transport --rounds 2 --json "$OUT/k3_serve_1x448.json"
for size in 448 1024; do python3 -m tests.support.ipc_consumer fetch 127.0.0.1:$PORT 50 $size; done | tee "$OUT/fetch.jsonl"
grep -E "family|kernels|IPC|graph|ERROR|Traceback" "$OUT/k3_server.log" | head -20
kill -TERM $server; wait $server; trap - EXIT
python3 -m pytest -q -rs -p no:cacheprovider tests/transport/test_ipc_gpu.py -k "fetch or bit_for_bit or reports" 2>&1 | tail -5
python3 -m benchmarks.gpu_preprocess --batch 16 --reps 3 --json "$OUT/gpu_preprocess.json"
