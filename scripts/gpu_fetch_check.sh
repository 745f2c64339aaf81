#!/usr/bin/env bash
# Results kept by key fetched over IPC vs serialized against a kimi-k2.5 server (the vLLM connector path), then the
# GPU decode bench with its one-level-noise yardstick. From the repo root with the wheels in /tmp/site; output in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=".:/tmp/site"
PORT=50171
python3 -m service.app.cli serve --model kimi-k2.5 --device cuda:0 --dtype bfloat16 --transport auto --grpc-address 127.0.0.1:$PORT --http-address "" --ipc-pool-mb 1024 > "$OUT/k25_server.log" 2>&1 &
server=$!
for _ in $(seq 300); do python3 -m service.app.cli health --target 127.0.0.1:$PORT >/dev/null 2>&1 && break; sleep 1; done
for size in 448 1024; do python3 -m tests.support.ipc_consumer fetch 127.0.0.1:$PORT 50 $size; done | tee "$OUT/fetch.jsonl"
kill -TERM $server; wait $server
python3 -m benchmarks.gpu_preprocess --batch 16 --reps 3 --sizes 512x512 1920x1080 --json "$OUT/gpu_preprocess_floor.json"
