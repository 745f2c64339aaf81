#!/usr/bin/env bash
# The embedding cache on the GPU host (issue 23, docs/cache.md). Run from the repo root with the wheels in .whl/
# (see docs/benchmarks/README.md; add xxhash's cp312 wheel, and blake3's for the blake3 test); output in $OUT:
#   cache_tests.log     the cache's CPU tests, its pool-tier CUDA tests (tests/transport/test_ipc_cache_gpu.py) and the IPC
#                       transport tests whose read path it changed (tests/transport/test_ipc_gpu.py, tests/transport/test_fanout.py)
#   cache_bench.log/.json/.md  a kimi-k2.5-shaped server (random weights, bf16, IPC, 2 GiB pool, cache on), then
#                       `mmproc bench serve --repeat-ratio 0,0.5,0.9 --transport ipc --clients 4` (cache on/off in ABBA
#                       order, then a hit-only pass; 4 client processes, as one Python client tops out near 240 hits/s)
#   server_hits.txt     server-side latency of hits: p50/p99 of the access log's `ms` over IPC requests whose every
#                       image was a hit (the server's own clock: RPC in to reply out)
#   policy.md           `mmproc bench cache` (hash throughput, S3-FIFO vs LRU), CPU only
# Goals (issue 23): at R=0.9 >= 5x the img/s of the cache off; a hit <= 1 ms p50 server-side (IPC).
#   bash scripts/gpu_cache_check.sh          (REQUESTS=200 CLIENTS=4 CONCURRENCY=4 RESOLUTION=1024x768 by default;
#                                            CONCURRENCY is per client process)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
LOG="$OUT/cache_tests.log"
{
  date -u; echo "commit ${MMPROC_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,uuid,driver_version --format=csv
  python3 -c "import torch, xxhash; print('torch', torch.__version__, 'xxhash', xxhash.VERSION)"
} 2>&1 | tee "$LOG"
python3 -c "import xxhash" 2>/dev/null || { echo "xxhash is missing: put its cp312 wheel in .whl/" | tee -a "$LOG"; exit 1; }

tests_rc=0
if [ -z "${SKIP_TESTS:-}" ]; then  # SKIP_TESTS=1: the bench alone (the tests ran on this commit already)
  python3 -m pytest -q -rs -p no:cacheprovider tests/transport/test_leases_shared.py tests/service/pipeline/test_embedding_cache.py \
    tests/service/pipeline/test_cache_service.py tests/client/test_ipc_leases.py tests/transport/test_ipc_cache_gpu.py tests/transport/test_ipc_gpu.py \
    tests/transport/test_fanout.py 2>&1 | tee -a "$LOG"
  tests_rc=${PIPESTATUS[0]}
fi

PORT=${PORT:-50161}
python3 -m service.app.cli serve --model kimi-k2.5 --device cuda:0 --dtype bfloat16 --transport ipc \
  --grpc-address 127.0.0.1:$PORT --http-address "" --ipc-pool-mb 2048 --cache-ipc-mb 1024 --log-json \
  > "$OUT/cache_server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server' EXIT
for _ in $(seq 300); do python3 -m service.app.cli health --target 127.0.0.1:$PORT >/dev/null 2>&1 && break; sleep 1; done
python3 -m service.app.cli health --target 127.0.0.1:$PORT || { echo "server never became SERVING"; exit 1; }

python3 -m service.app.cli bench serve --target 127.0.0.1:$PORT --device cuda:0 --transport ipc \
  --repeat-ratio 0,0.5,0.9 --requests "${REQUESTS:-200}" --clients "${CLIENTS:-4}" --concurrency "${CONCURRENCY:-4}" \
  --images-per-request 1 --resolutions "${RESOLUTION:-1024x768}" --format jpeg --warmup 8 --rounds 2 --quiet \
  --json "$OUT/cache_bench.json" --markdown "$OUT/cache_bench.md" 2>&1 | tee "$OUT/cache_bench.log"
bench_rc=${PIPESTATUS[0]}

python3 - "$OUT/cache_server.log" > "$OUT/server_hits.txt" <<'EOF'
import json, sys
import numpy as np
hits, misses = [], []
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    entry = json.loads(line)
    if entry.get("logger") != "mmproc.access" or entry.get("method") != "EncodeImages" or entry.get("code") != "OK":
        continue
    statuses = str(entry.get("cache", "")).split(",")
    if statuses == ["hit"] * len(statuses) and entry.get("transport") == "ipc":
        hits.append(entry["ms"])
    elif "miss" in statuses:
        misses.append(entry["ms"])
for name, ms in (("all-hit IPC requests", hits), ("requests with a miss", misses)):
    if ms:
        p50, p99 = np.percentile(ms, [50, 99])
        print(f"{name}: n={len(ms)} server-side p50 {p50:.3f} ms p99 {p99:.3f} ms")
    else:
        print(f"{name}: none logged")
EOF
cat "$OUT/server_hits.txt"
grep -E '"level": "(WARNING|ERROR)"' "$OUT/cache_server.log" | head -20
[ -n "${SKIP_TESTS:-}" ] || python3 -m service.app.cli bench cache --json "$OUT/policy.json" > "$OUT/policy.md" 2>&1
echo "# tests rc=$tests_rc bench rc=$bench_rc"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
