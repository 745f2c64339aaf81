#!/usr/bin/env bash
# GPU JPEG decode (issue 16 item 1) on the H200, from the repo root with the wheels in .whl/ (nvidia-nvimgcodec-cu13
# and nvidia-nvjpeg beside the service's; docs/benchmarks/README.md); output in $OUT.
# 1. the GPU-decode tests (parity with the CPU path, refusals, the hostile corpus through the GPU path, packing of
#    device-resident patches) and the device preprocessing tests;
# 2. a kimi-k2.5 server with --gpu-decode on, then off: 4 x 512² JPEGs per request from one client process of 8
#    threads over IPC, and 1 x 448² at concurrency 1, with the server's CPU seconds per image;
# 3. `bench encoder` at 512² x 32 (what those requests batch to): the encoder's own img/s in the same run.
#   MMPROC_COMMIT=<sha> bash scripts/gpu_decode_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
PORT=${PORT:-50181}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=".:/tmp/site"
echo "# gpu_decode_check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit=${MMPROC_COMMIT:-unknown}" | tee "$OUT/decode_tests.log"
timeout 240 python3 -m pytest -q -rs -s -p no:cacheprovider tests/service/test_gpu_decode.py tests/preprocess/test_device.py \
  tests/runner/test_batching.py 2>&1 | tee -a "$OUT/decode_tests.log" | tail -6
cpu() { python3 scripts/tree_cpu_seconds.py "$1"; }
common=(--target 127.0.0.1:$PORT --device cuda:0 --format jpeg --transport ipc --quiet)
# BASELINE=DIR: also a server from an older tree (`git archive COMMIT mmproc service | tar -x -C DIR`), same client.
for mode in on off ${BASELINE:+baseline}; do
  flags=(serve --model kimi-k2.5 --device cuda:0 --dtype bfloat16 --transport auto --grpc-address 127.0.0.1:$PORT
    --http-address "" --ipc-pool-mb 2048 --cache-mb 0)
  if [ "$mode" = baseline ]; then
    (cd "$BASELINE" && PYTHONPATH=/tmp/site exec python3 -m service.cli "${flags[@]}") > "$OUT/server_$mode.log" 2>&1 &
  else
    python3 -m service.process.cli "${flags[@]}" --gpu-decode $mode > "$OUT/server_$mode.log" 2>&1 &
  fi
  server=$!
  for _ in $(seq 300); do python3 -m service.process.cli health --target 127.0.0.1:$PORT >/dev/null 2>&1 && break; sleep 1; done
  python3 -m mmproc.bench.serve "${common[@]}" --images-per-request 4 --resolutions 512x512 --requests 40 --warmup 0 \
    --concurrency 8 > /dev/null 2>&1
  before=$(cpu $server)
  python3 -m mmproc.bench.serve "${common[@]}" --images-per-request 4 --resolutions 512x512 --requests 600 --warmup 16 \
    --concurrency 8 --json "$OUT/serve_${mode}_4x512.json" 2>&1 | grep -E "images/s|latency p50" | sed "s/^/gpu_decode=$mode: /"
  after=$(cpu $server)
  python3 -c "print('gpu_decode=$mode: server CPU per image %.2f ms (%.1f s over 2464 images)' % (($after - $before) / 2464 * 1000, $after - $before))"
  python3 -m mmproc.bench.serve "${common[@]}" --images-per-request 1 --resolutions 448x448 --requests 200 --warmup 30 \
    --concurrency 1 --json "$OUT/serve_${mode}_1x448.json" 2>&1 | grep -E "latency p50" | sed "s/^/gpu_decode=$mode 1x448: /"
  grep -E "JPEG decode on|ERROR|Traceback" "$OUT/server_$mode.log" | head -5
  kill -TERM $server; wait $server
done
python3 -m mmproc.bench.forward --workloads 512x32 --reps 5 --no-baseline 2>&1 | tail -4
