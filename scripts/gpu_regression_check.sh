#!/usr/bin/env bash
# Session-5 GPU regression on the H200, from the repo root (wheels in .whl/ incl. xxhash and av; see
# docs/benchmarks/README.md); output in $OUT: the GPU tests of the encoder, device preprocessing, fused kernels,
# IPC (with the embedding cache's pool tier) and video; then `gpu_preprocess` on a kimi-k2.5 server again
# (4 x 512^2 per request, 8 threads, IPC; 1 x 448^2 at concurrency 1) with the server's CPU seconds per image.
#   MMPROC_COMMIT=<sha> bash scripts/gpu_regression_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
PORT=${PORT:-50191}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=".:/tmp/site"
echo "# gpu_regression_check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit=${MMPROC_COMMIT:-unknown}"
python3 -m pytest -q -rs -p no:cacheprovider -m cuda tests/model/test_gpu.py tests/preprocess/test_device.py \
  tests/model/test_rope_triton.py tests/model/test_add_norm_triton.py tests/transport/test_ipc_gpu.py tests/transport/test_ipc_cache_gpu.py \
  tests/model/test_video.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -8
python3 -m service.app.cli serve --model kimi-k2.5 --device cuda:0 --dtype bfloat16 --transport auto \
  --grpc-address 127.0.0.1:$PORT --http-address "" --ipc-pool-mb 2048 --cache-mb 0 > "$OUT/bytes_server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server' EXIT
for _ in $(seq 300); do python3 -m service.app.cli health --target 127.0.0.1:$PORT >/dev/null 2>&1 && break; sleep 1; done
common=(--target 127.0.0.1:$PORT --device cuda:0 --format jpeg --transport ipc --quiet)
python3 -m mmproc.bench.serve "${common[@]}" --images-per-request 4 --resolutions 512x512 --requests 40 --warmup 0 \
  --concurrency 8 > /dev/null 2>&1
cpu() { python3 scripts/tree_cpu_seconds.py "$1"; }
before=$(cpu $server)
python3 -m mmproc.bench.serve "${common[@]}" --images-per-request 4 --resolutions 512x512 --requests 600 --warmup 16 \
  --concurrency 8 --json "$OUT/serve_4x512.json" 2>&1 | grep -E "images/s|latency p50"
after=$(cpu $server)
python3 -c "print('server CPU per image %.2f ms (%.1f s over 2464 images)' % (($after - $before) / 2464 * 1000, $after - $before))"
python3 -m mmproc.bench.serve "${common[@]}" --images-per-request 1 --resolutions 448x448 --requests 300 --warmup 30 \
  --concurrency 1 --json "$OUT/serve_1x448.json" 2>&1 | grep -E "latency p50"
grep -E "ERROR|Traceback" "$OUT/bytes_server.log" | head -5
