#!/usr/bin/env bash
# Session 3 device call 4: pool-exhaustion test with the client's stderr, encoder GPU tests + 448x64 bench,
# d2h (torch's default threads), IPC read steps (cold + hot) with a sleeping consumer.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
L=$OUT/run.log
{ date -u; echo "commit ${MMPROC_COMMIT:-unknown}"; nvidia-smi -L; } | tee $L
python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_ipc_gpu.py -k "exhaustion" 2>&1 | tail -60 | tee -a $L
python3 -m pytest -q --noconftest -p no:cacheprovider -m cuda tests/test_gpu_encoder.py tests/test_model.py 2>&1 | tail -2 | tee -a $L
python3 -m service.bench.encoder --workloads 448x64 mixed48 --reps 10 --warmup 3 --json $OUT/encoder.json 2>&1 | tee -a $L
python3 -m service.bench.d2h --device cuda:0 --mb 20 --reps 50 --json $OUT/d2h.json 2>&1 | tail -9 | tee -a $L
PORT=50151
python3 -m service.cli serve --model kimi-k2.5 --device cuda:0 --dtype bfloat16 --transport auto \
  --grpc-address 127.0.0.1:$PORT --http-address "" --ipc-pool-mb 1024 > "$OUT/server.log" 2>&1 &
server=$!
for _ in $(seq 300); do python3 -m service.cli health --target 127.0.0.1:$PORT >/dev/null 2>&1 && break; sleep 1; done
python3 -m service.bench.ipc_steps --target 127.0.0.1:$PORT --device cuda:0 --requests 200 --json $OUT/ipc_steps.json 2>&1 | tee -a $L
kill -TERM $server; wait $server
