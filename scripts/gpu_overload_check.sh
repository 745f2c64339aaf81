#!/usr/bin/env bash
# Overload on the GPU host (issue 24): a full-size kimi-k2.5 server (random weights, bf16, CUDA) and
# `mmproc bench serve --mode open` in its own process: closed-loop capacity C, then 30 s of open-loop load at
# 3 x C (gRPC with a 2 s deadline from the Python client and a raw stub, plus HTTP), then recovery.
# Run from the repo root with the wheels in .whl/ (see docs/benchmarks/README.md); output goes to $OUT.
#   OVERLOAD=3 DURATION=30 RES=448x448 bash scripts/gpu_overload_check.sh
#   RES="1024x1024 448x448" ...: one server, one run per size in turn (files named overload_<size>.*)
#   SERVER_ARGS="--flag value ..." (more server flags, e.g. --event-loop asyncio)
#   BENCH_ARGS="--flag value ..." (more `bench serve` flags, e.g. --batch-fraction 0.5)
#   PYSPY=1: py-spy (a wheel in .whl/) samples the threads holding the GIL for 20 s of the overload phase
#   (overload_<size>_gil.txt, raw folded stacks) and every thread for the same 20 s (overload_<size>_all.txt)
# The load comes from CLIENTS client processes (default 4; one Python process could not take in the replies at
# 448², docs/benchmarks/overload.md); the report's last line is the server's event-loop lag under the load.
set -uo pipefail
OUT=${OUT:-/tmp/out}
PORT=${PORT:-50171}
HTTP_PORT=${HTTP_PORT:-8171}
RES=${RES:-448x448}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
{ date -u; echo "commit ${MMPROC_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } | tee "$OUT/overload_env.txt"
python3 -m service.app.cli serve --model kimi-k2.5 --device cuda:0 --dtype bfloat16 --transport auto \
  --grpc-address 127.0.0.1:$PORT --http-address 127.0.0.1:$HTTP_PORT --drain-delay-s 0 ${SERVER_ARGS:-} > "$OUT/overload_server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server' EXIT
for _ in $(seq 300); do python3 -m service.app.cli health --target 127.0.0.1:$PORT >/dev/null 2>&1 && break; sleep 1; done
python3 -m service.app.cli health --target 127.0.0.1:$PORT || { echo "server never became SERVING"; tail -30 "$OUT/overload_server.log"; exit 1; }
metrics() {  # every mmproc counter and histogram sum/count (stage times, refusals by reason), no buckets
  python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$HTTP_PORT/metrics').read().decode())" \
    | grep -E "^mmproc_" | grep -v "_bucket{" | grep -v " 0.0$"
}
for res in $RES; do
  metrics > "$OUT/overload_${res}_metrics_before.txt"
  if [ "${PYSPY:-0}" = 1 ]; then  # the capacity phase takes ~10 s: sample 15-35 s in, inside the overload
    (sleep 15; py-spy record --nonblocking --gil --threads -r 100 -d 20 -f raw -o "$OUT/overload_${res}_gil.txt" -p $server \
       > "$OUT/overload_${res}_pyspy.log" 2>&1) &
    (sleep 15; py-spy record --nonblocking --threads --idle -r 50 -d 20 -f raw -o "$OUT/overload_${res}_all.txt" -p $server \
       >> "$OUT/overload_${res}_pyspy.log" 2>&1) &
  fi
  python3 -m mmproc.bench.serve --mode open --overload "${OVERLOAD:-3}" --duration "${DURATION:-30}" \
    --target 127.0.0.1:$PORT --http-target 127.0.0.1:$HTTP_PORT --resolutions "$res" --concurrency 8 --clients "${CLIENTS:-4}" \
    --capacity-seconds 10 --recovery-seconds 8 --server-log "$OUT/overload_server.log" --quiet ${BENCH_ARGS:-} \
    --json "$OUT/overload_$res.json" 2>&1 | tee "$OUT/overload_$res.txt"
  metrics > "$OUT/overload_${res}_metrics.txt"
done
grep -cE " ERROR |Traceback" "$OUT/overload_server.log" | sed 's/^/ERROR or Traceback lines: /' | tee -a "$OUT/overload_$res.txt"
