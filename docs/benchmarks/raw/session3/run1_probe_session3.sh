#!/usr/bin/env bash
# One-off probe (session 3): encoder back-to-back figures, IPC read steps (sleeping / busy consumer), copy probe.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
date -u; echo "commit ${MMPROC_COMMIT:-unknown}"; nvidia-smi -L; nproc
python3 scripts/probe_copy.py 2>&1 | tee $OUT/probe_copy.log
python3 -m pytest -q -p no:cacheprovider tests/test_ipc_gpu.py -k async 2>&1 | tail -5
python3 -m service.bench.encoder --workloads 448x64 mixed48 --reps 10 --warmup 3 --json $OUT/encoder.json 2>&1 | tee $OUT/encoder.log
PORT=50151
python3 -m service.cli serve --model kimi-k2.5 --device cuda:0 --dtype bfloat16 --transport auto \
  --grpc-address 127.0.0.1:$PORT --http-address "" --ipc-pool-mb 1024 > "$OUT/server.log" 2>&1 &
server=$!
for _ in $(seq 300); do python3 -m service.cli health --target 127.0.0.1:$PORT >/dev/null 2>&1 && break; sleep 1; done
python3 -m service.bench.ipc_steps --target 127.0.0.1:$PORT --device cuda:0 --requests 200 --json $OUT/ipc_steps.json 2>&1 | tee $OUT/ipc_steps.log
python3 -m service.bench.ipc_steps --target 127.0.0.1:$PORT --device cuda:0 --requests 200 --busy-wait --json $OUT/ipc_steps_busy.json 2>&1 | tee -a $OUT/ipc_steps.log
kill -TERM $server; wait $server
