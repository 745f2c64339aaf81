#!/usr/bin/env bash
# CUDA graphs for the batches a loaded server forms (issues 16, 21, 24), on the H200, from the repo root with the
# wheels in .whl/; output in $OUT. Eager forwards hold the GIL for every kernel launch (~47 ms of host time for a
# 512² x 32 forward); under load the runner thread then waits on the event loop and the other way round.
# 1. two kimi-k2.5 servers at once: graphs up to GRAPH_PATCHES patches (GRAPHS of them) vs the default (4096 / 8),
#    and a `bench serve` A/B between them (A B B A): 4 x 512² from one process of 8 threads over IPC, then 1 x 448²;
# 2. overload (scripts/gpu_overload_check.sh) with the graphs at 448² (asyncio, then uvloop) and 1024² (asyncio).
set -uo pipefail
OUT=${OUT:-/tmp/out}
PORT=${PORT:-50191}
GRAPHS=${GRAPHS:-24}
GRAPH_PATCHES=${GRAPH_PATCHES:-65536}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=".:/tmp/site"
echo "# gpu_graphs_check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit=${MMPROC_COMMIT:-unknown}" | tee "$OUT/graphs.log"
graph_flags=(--cuda-graphs "$GRAPHS" --cuda-graph-max-patches "$GRAPH_PATCHES")
flags=(--model kimi-k2.5 --device cuda:0 --dtype bfloat16 --transport auto --ipc-pool-mb 2048 --cache-mb 0)
python3 -m service.app.cli serve "${flags[@]}" "${graph_flags[@]}" --grpc-address 127.0.0.1:$PORT \
  --http-address 127.0.0.1:$((PORT + 1)) > "$OUT/server_graphs.log" 2>&1 &
graphs=$!
python3 -m service.app.cli serve "${flags[@]}" --grpc-address 127.0.0.1:$((PORT + 2)) \
  --http-address 127.0.0.1:$((PORT + 3)) > "$OUT/server_default.log" 2>&1 &
default=$!
trap 'kill -TERM $graphs $default 2>/dev/null; wait' EXIT
for port in $PORT $((PORT + 2)); do
  for _ in $(seq 300); do python3 -m service.app.cli health --target 127.0.0.1:$port >/dev/null 2>&1 && break; sleep 1; done
done
common=(--device cuda:0 --format jpeg --transport ipc --server-cache off --quiet)
ab=(--target 127.0.0.1:$PORT --http-target 127.0.0.1:$((PORT + 1)) --baseline-target 127.0.0.1:$((PORT + 2))
  --baseline-http-target 127.0.0.1:$((PORT + 3)))
for port in $PORT $((PORT + 2)); do  # first requests (captures after two sightings, nvJPEG, IPC sessions): not measured
  python3 -m mmproc.bench.serve --target 127.0.0.1:$port "${common[@]}" --images-per-request 4 --resolutions 512x512 \
    --requests 200 --warmup 0 --concurrency 8 > /dev/null 2>&1
done
echo "## graphs ($GRAPHS up to $GRAPH_PATCHES patches) vs default: 4 x 512², one process of 8 threads, IPC" | tee -a "$OUT/graphs.log"
python3 -m mmproc.bench.serve "${ab[@]}" "${common[@]}" --images-per-request 4 --resolutions 512x512 --requests 600 \
  --warmup 16 --concurrency 8 --rounds 2 --json "$OUT/graphs_4x512.json" 2>&1 | tee -a "$OUT/graphs.log"
echo "## graphs vs default: 1 x 448², concurrency 1" | tee -a "$OUT/graphs.log"
python3 -m mmproc.bench.serve "${ab[@]}" "${common[@]}" --images-per-request 1 --resolutions 448x448 --requests 200 \
  --warmup 30 --concurrency 1 --rounds 2 --json "$OUT/graphs_1x448.json" 2>&1 | tee -a "$OUT/graphs.log"
grep -E "graph|ERROR|Traceback" "$OUT/server_graphs.log" | head -20 | tee -a "$OUT/graphs.log"
kill -TERM $graphs $default 2>/dev/null; wait
trap - EXIT
for run in "asyncio 448x448" "uvloop 448x448" "asyncio 1024x1024"; do
  set -- $run
  OUT="$OUT/overload_$1_$2" SERVER_ARGS="${graph_flags[*]} --event-loop $1" RES="$2" CLIENTS=6 DURATION=30 \
    timeout 200 bash scripts/gpu_overload_check.sh > /dev/null 2>&1
  echo "## overload, graphs, $1, $2" | tee -a "$OUT/graphs.log"
  grep -hv "^mmproc_" "$OUT/overload_$1_$2"/overload_*.txt | tee -a "$OUT/graphs.log"
done
