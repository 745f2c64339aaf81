#!/usr/bin/env bash
# Issue 16 on the GPU host, from the repo root (wheels in .whl/, docs/benchmarks/README.md); output in $OUT:
#   1. GPU encoder tests (uint8 bytes normalized on the GPU == the bf16-packed pixels, no syncs, CUDA graphs);
#   2. A/B of `gpu_preprocess` on a kimi-k2.5 server: 4 x 512^2 JPEGs per request, one client process of 8 threads
#      (IPC), then 1 x 448^2 at concurrency 1; the server's CPU seconds per image (its whole process tree);
#   3. the serialized staging bench at 4 and 16 MiB stream chunks.
#   MMPROC_COMMIT=<sha> bash scripts/gpu_bytes_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
PORT=${PORT:-50171}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=".:/tmp/site"
else
  export PYTHONPATH="."
fi
echo "# gpu_bytes_check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit=${MMPROC_COMMIT:-unknown} cpus=$(nproc)"
python3 -m pytest -q -rs -p no:cacheprovider -m cuda tests/model/test_gpu.py 2>&1 | tail -4
# The encoder alone on the same images (its capacity for the e2e figures below)
python3 -m mmproc.bench.forward --workloads 512x4 512x32 --no-baseline --reps 5 --warmup 2 2>&1 | grep -E "512x"

tree_cpu() { python3 scripts/tree_cpu_seconds.py "$1"; }  # the server and its decode workers

for side in on off; do
  flag=--gpu-preprocess; [ "$side" = off ] && flag=--no-gpu-preprocess
  python3 -m service.app.cli serve --model kimi-k2.5 --device cuda:0 --dtype bfloat16 --transport auto $flag \
    --grpc-address 127.0.0.1:$PORT --http-address "" --ipc-pool-mb 2048 > "$OUT/server_$side.log" 2>&1 &
  server=$!
  for _ in $(seq 300); do python3 -m service.app.cli health --target 127.0.0.1:$PORT >/dev/null 2>&1 && break; sleep 1; done
  python3 -m service.app.cli health --target 127.0.0.1:$PORT >/dev/null || { echo "server ($side) never SERVING"; tail -20 "$OUT/server_$side.log"; kill $server; continue; }
  common=(--target 127.0.0.1:$PORT --device cuda:0 --format jpeg --transport ipc --quiet)
  python3 -m mmproc.bench.serve "${common[@]}" --images-per-request 4 --resolutions 512x512 --requests 40 --warmup 0 \
    --concurrency 8 > /dev/null 2>&1  # warm: pos-emb tables, graphs, workers
  before=$(tree_cpu $server)
  python3 -m mmproc.bench.serve "${common[@]}" --images-per-request 4 --resolutions 512x512 --requests 600 --warmup 16 \
    --concurrency 8 --json "$OUT/serve_4x512_$side.json" 2>&1 | tail -12
  after=$(tree_cpu $server)
  python3 -c "print('gpu_preprocess=$side: server CPU per image %.2f ms (%.1f s over 2464 images)' % (($after - $before) / 2464 * 1000, $after - $before))"
  python3 -m mmproc.bench.serve "${common[@]}" --images-per-request 1 --resolutions 448x448 --requests 300 --warmup 30 \
    --concurrency 1 --json "$OUT/serve_1x448_$side.json" 2>&1 | tail -8
  grep -E "ERROR|Traceback" "$OUT/server_$side.log" | head -5
  kill -TERM $server; wait $server
done
for chunk in 4 16; do
  python3 -m benchmarks.d2h --device cuda:0 --mb 20 --reps 50 --chunk-mb $chunk --json "$OUT/d2h_chunk$chunk.json" 2>&1 | grep -E "server_stream|payloads"
done
