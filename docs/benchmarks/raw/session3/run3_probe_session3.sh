#!/usr/bin/env bash
# Session 3 device call 3: the pool-exhaustion test with full output, staging tests, d2h (8 vs 16 threads),
# encoder 448x64, serve bench (transport A/B), IPC read steps with a spinning consumer.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
L=$OUT/run.log
{ date -u; echo "commit ${MMPROC_COMMIT:-unknown}"; nvidia-smi -L; } | tee $L
python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_ipc_gpu.py -k "exhaustion or async" 2>&1 | tail -40 | tee -a $L
python3 -m pytest -q --noconftest -p no:cacheprovider tests/test_serialized_staging.py tests/test_host_copy.py 2>&1 | tail -2 | tee -a $L
python3 -m service.bench.d2h --device cuda:0 --mb 20 --reps 50 --json $OUT/d2h.json 2>&1 | tee -a $L
python3 -m service.bench.d2h --device cuda:0 --mb 20 --reps 50 --torch-threads 16 2>&1 | tail -8 | tee -a $L
python3 -m service.bench.encoder --workloads 448x64 --no-baseline --reps 20 --warmup 5 --json $OUT/encoder.json 2>&1 | tee -a $L
PORT=50151
python3 -m service.cli serve --model kimi-k2.5 --device cuda:0 --dtype bfloat16 --transport auto \
  --grpc-address 127.0.0.1:$PORT --http-address "" --ipc-pool-mb 1024 > "$OUT/server.log" 2>&1 &
server=$!
for _ in $(seq 300); do python3 -m service.cli health --target 127.0.0.1:$PORT >/dev/null 2>&1 && break; sleep 1; done
python3 -m service.bench.ipc_steps --target 127.0.0.1:$PORT --device cuda:0 --requests 200 --spin --json $OUT/ipc_steps_spin.json 2>&1 | tee -a $L
python3 -m service.bench.ipc_steps --target 127.0.0.1:$PORT --device cuda:0 --requests 200 --json $OUT/ipc_steps.json 2>&1 | tail -14 | tee -a $L
python3 -m service.bench.serve --target 127.0.0.1:$PORT --device cuda:0 --images-per-request 4 --resolutions 512x512 --format jpeg \
  --requests 200 --warmup 20 --concurrency 1 --quiet --compare transport --rounds 2 --json $OUT/serve_transport.json 2>&1 | tail -30 | tee -a $L
kill -TERM $server; wait $server
grep -E "IPC|reclaimed|ERROR" "$OUT/server.log" | head -10 | tee -a $L
