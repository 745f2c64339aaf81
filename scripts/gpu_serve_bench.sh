#!/usr/bin/env bash
# Transport benchmarks on the GPU host: a K2.5-shaped server (random weights, bf16) and `mmproc bench serve`
# in its own process. 4 seeded 512x512 images per request -> 4 x 361 tokens x 7168 x bf16 = 20.7 MB.
set -uo pipefail
OUT=${OUT:-/tmp/out}
PORT=${PORT:-50151}
python3 -m service.app.cli serve --model kimi-k2.5 --device cuda:0 --dtype bfloat16 --transport auto \
  --grpc-address 127.0.0.1:$PORT --http-address "" --ipc-pool-mb 1024 > "$OUT/server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server' EXIT
# Ready = gRPC health SERVING (`mmproc health`, the probe command the containers use), within 5 minutes.
for _ in $(seq 300); do python3 -m service.app.cli health --target 127.0.0.1:$PORT >/dev/null 2>&1 && break; sleep 1; done
python3 -m service.app.cli health --target 127.0.0.1:$PORT || { echo "server never became SERVING"; exit 1; }
REQUESTS=${REQUESTS:-200}
common=(--target 127.0.0.1:$PORT --device cuda:0 --images-per-request 4 --resolutions 512x512 --format jpeg
        --requests "$REQUESTS" --warmup 20 --concurrency 1 --quiet)
python3 -m mmproc.bench.serve "${common[@]}" --compare transport --rounds 2 --json "$OUT/serve_transport.json"
python3 -m mmproc.bench.serve "${common[@]}" --transport ipc --compare handle-cache --rounds 2 \
  --json "$OUT/serve_handle_cache.json"
if [ -z "${QUICK:-}" ]; then
python3 -m mmproc.bench.serve "${common[@]}" --transport ipc --concurrency 8 --requests 400 \
  --json "$OUT/serve_ipc_c8.json"
fi
# The D2H yardstick and the serialized path's stages (production code) against it, in one process.
python3 -m benchmarks.d2h --device cuda:0 --mb 20 --reps 50 --json "$OUT/d2h.json"
grep -E "IPC|transport|reclaimed|ERROR" "$OUT/server.log" | head -20
