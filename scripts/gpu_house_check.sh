#!/usr/bin/env bash
# The house issue's GPU check, from the repo root, with the wheels of scripts/device_wheels.sh in .whl/ and the tree
# before it in .probe/old (`git archive e5c0f43 mmproc service | tar -x -C .probe/old`); output in $OUT.
#   PART=tests bash scripts/gpu_house_check.sh   every CUDA test of the tree, `bench encoder` (K2.5) on both trees, and
#                                                the Qwen3.6-35B-A3B tower's MFU and single-image latency (issue 45)
#   PART=serve bash scripts/gpu_house_check.sh   `bench serve` against a K2.5 server of each tree (IPC and serialized)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
NEW=$(pwd)
OLD=$(pwd)/.probe/old
echo "# gpu_house_check PART=${PART:-tests} $(date -u +%Y-%m-%dT%H:%M:%SZ) commit=${MMPROC_COMMIT:-unknown}"
nvidia-smi -L
if [ "${PART:-tests}" = tests ]; then
  PYTHONPATH="$NEW:/tmp/site" timeout 330 python3 -m pytest -q -rs -p no:cacheprovider -m cuda tests \
    > "$OUT/gpu_tests.log" 2>&1
  tail -25 "$OUT/gpu_tests.log"
  for tree in "$NEW" "$OLD"; do
    echo "## bench encoder, tree $tree"
    (cd "$tree" && PYTHONPATH="$tree:/tmp/site" timeout 120 python3 -m mmproc.bench.forward --preset kimi-k2.5 \
      --workloads 448x64 1024x16 mixed48 --no-baseline --quiet) 2>&1 | tee -a "$OUT/encoder.log" | grep -v "^$"
  done
  echo "## bench encoder, qwen3.6-35b-a3b"
  PYTHONPATH="$NEW:/tmp/site" timeout 150 python3 -m mmproc.bench.forward --preset qwen3.6-35b-a3b \
    --workloads 448x64 1024x16 mixed48 --latency 448x1 --quiet --json "$OUT/qwen36_encoder.json" 2>&1 \
    | tee "$OUT/qwen36_encoder.log" | grep -v "^$"
else
  PORT=50181
  for tree in "$NEW" "$OLD" "$NEW"; do
    cli=service.app.cli; [ -d "$tree/service/app" ] || cli=service.process.cli  # the old tree's layout
    (cd "$tree" && PYTHONPATH="$tree:/tmp/site" exec python3 -m $cli serve --model kimi-k2.5 --device cuda:0 --dtype bfloat16 \
      --transport auto --grpc-address 127.0.0.1:$PORT --http-address "" --ipc-pool-mb 2048 --cache-mb 0 \
      > "$OUT/server_$(basename "$tree").log" 2>&1) &
    server=$!
    for _ in $(seq 240); do
      PYTHONPATH="$NEW:/tmp/site" python3 -m service.app.cli health --target 127.0.0.1:$PORT >/dev/null 2>&1 && break
      sleep 1
    done
    for transport in ipc serialized; do
      echo "## bench serve, server tree $tree, transport $transport"
      PYTHONPATH="$NEW:/tmp/site" timeout 90 python3 -m mmproc.bench.serve --target 127.0.0.1:$PORT --device cuda:0 \
        --images-per-request 4 --resolutions 512x512 --format jpeg --requests 300 --warmup 20 --concurrency 8 \
        --transport $transport --quiet 2>&1 | tee -a "$OUT/serve.log" | grep -E "images/s|latency|ready"
    done
    kill -TERM $server; wait $server
    PORT=$((PORT + 1))
  done
fi
