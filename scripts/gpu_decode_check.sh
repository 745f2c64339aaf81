#!/usr/bin/env bash
# GPU JPEG decode (issue 16) on the H200, from the repo root with the wheels in .whl/ (nvidia-nvimgcodec-cu13
# and nvidia-nvjpeg beside the service's; docs/benchmarks/README.md); output in $OUT.
# 1. the GPU-decode tests (parity with the CPU path, refusals, the hostile corpus through the GPU path, packing of
#    device-resident patches) and the device preprocessing tests;
# 2. two kimi-k2.5 servers at once, --gpu-decode on and off (embedding cache off), and `bench serve` A/Bs between
#    them (--baseline-target, A B B A): 4 x 512² JPEGs per request from one client process of 8 threads over IPC,
#    then 1 x 448² at concurrency 1. Each prints img/s and latency per side, the server's CPU per image and cores by
#    role (mmproc_cpu_seconds_total), the encoder's img/s at the batches formed (its forward stage) and the ratios;
# 3. the async client: one process, one event loop, 8 concurrent requests of 4 x 512² over IPC, against `on`;
# 4. each server's process-tree CPU over steps 2-3 beside its mmproc_cpu_seconds_total (all roles), and the `on`
#    server's threads by name with their CPU (what `other` holds);
# 5. BASELINE=DIR: a server from an older tree (`git archive COMMIT mmproc service | tar -x -C DIR`), the same
#    4 x 512² load, its CPU per image from the process tree (an older server has no CPU-by-role metric);
# 6. `bench encoder` at 512² x 32 (what those requests batch to): the encoder's own img/s on the device (on CUDA
#    the forward stage of step 2 is the runner's host time, not the device's).
#   MMPROC_COMMIT=<sha> bash scripts/gpu_decode_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
PORT=${PORT:-50181}  # on: PORT (gRPC) and PORT+1 (HTTP); off: PORT+2 and PORT+3; BASELINE: PORT+4
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=".:/tmp/site"
echo "# gpu_decode_check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit=${MMPROC_COMMIT:-unknown}" | tee "$OUT/decode_tests.log"
timeout 240 python3 -m pytest -q -rs -s -p no:cacheprovider tests/service/pipeline/test_gpu_decode.py tests/preprocess/test_device.py \
  tests/runner/test_batching.py 2>&1 | tee -a "$OUT/decode_tests.log" | tail -6

servers=()
stop_servers() {  # ${a[@]+...}: an empty array under `set -u` on any bash
  for s in ${servers[@]+"${servers[@]}"}; do kill -TERM "$s" 2>/dev/null; done
  for s in ${servers[@]+"${servers[@]}"}; do wait "$s"; done
  servers=()
}
trap stop_servers EXIT
healthy() {  # GRPC_PORT LOG
  for _ in $(seq 300); do python3 -m service.app.cli health --target 127.0.0.1:$1 >/dev/null 2>&1 && return 0; sleep 1; done
  echo "the server on :$1 never became SERVING:"; tail -20 "$2"; return 1
}
flags=(--model kimi-k2.5 --device cuda:0 --dtype bfloat16 --transport auto --ipc-pool-mb 2048 --cache-mb 0)
python3 -m service.app.cli serve "${flags[@]}" --grpc-address 127.0.0.1:$PORT --http-address 127.0.0.1:$((PORT + 1)) \
  --gpu-decode on > "$OUT/server_on.log" 2>&1 &
on=$!
python3 -m service.app.cli serve "${flags[@]}" --grpc-address 127.0.0.1:$((PORT + 2)) \
  --http-address 127.0.0.1:$((PORT + 3)) --gpu-decode off > "$OUT/server_off.log" 2>&1 &
off=$!
servers=($on $off)
healthy $PORT "$OUT/server_on.log" && healthy $((PORT + 2)) "$OUT/server_off.log" || exit 1

cat > /tmp/cpu_check.py <<'PY'
"""`before NAME PID HTTP_PORT` saves a server's process-tree CPU and mmproc_cpu_seconds_total; `after ...` prints
both deltas (the tree also holds the forkserver; the metric splits by role), `after ... threads` the threads too."""
import collections, json, os, sys
sys.path.insert(0, "scripts")
from tree_cpu_seconds import tree_cpu_seconds
from mmproc.bench.server_metrics import by_label, scrape
step, name, pid, http = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
now = {"tree": tree_cpu_seconds(pid), **by_label(scrape(f"127.0.0.1:{http}"), "mmproc_cpu_seconds_total", "role")}
path = f"/tmp/cpu_{name}.json"
if step == "before":
    json.dump(now, open(path, "w"))
    sys.exit()
was = json.load(open(path))
d = {key: value - was.get(key, 0.0) for key, value in now.items()}
roles = [k for k in d if k != "tree"]
print(f"gpu_decode={name}: over steps 2-3, process tree {d['tree']:.1f} s, mmproc_cpu_seconds_total "
      f"{sum(d[r] for r in roles):.1f} s (" + ", ".join(f"{r} {d[r]:.1f}" for r in roles) + ")")
if len(sys.argv) > 5:  # the live threads by name, CPU since start (Python's own threads show the interpreter's name)
    cpu, count = collections.Counter(), collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu[comm] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        count[comm] += 1
    print(f"gpu_decode={name}: live threads by name (count, CPU s since start): "
          + ", ".join(f"{n} x{count[n]} {s:.1f}" for n, s in cpu.most_common(14)))
PY
common=(--device cuda:0 --format jpeg --transport ipc --server-cache off --quiet)
ab=(--target 127.0.0.1:$PORT --http-target 127.0.0.1:$((PORT + 1)) --baseline-target 127.0.0.1:$((PORT + 2))
  --baseline-http-target 127.0.0.1:$((PORT + 3)))
for port in $PORT $((PORT + 2)); do  # first requests of each server (CUDA graphs, nvJPEG, IPC sessions), not measured
  python3 -m mmproc.bench.serve --target 127.0.0.1:$port "${common[@]}" --images-per-request 4 --resolutions 512x512 \
    --requests 40 --warmup 0 --concurrency 8 > /dev/null 2>&1
done
python3 /tmp/cpu_check.py before on $on $((PORT + 1))
python3 /tmp/cpu_check.py before off $off $((PORT + 3))
echo "## A/B, gpu decode on vs off: 4 x 512² JPEGs per request, one client process of 8 threads, IPC"
python3 -m mmproc.bench.serve "${ab[@]}" "${common[@]}" --images-per-request 4 --resolutions 512x512 --requests 600 \
  --warmup 16 --concurrency 8 --rounds 2 --json "$OUT/ab_4x512.json" 2>&1
echo "## A/B, gpu decode on vs off: 1 x 448², concurrency 1"
python3 -m mmproc.bench.serve "${ab[@]}" "${common[@]}" --images-per-request 1 --resolutions 448x448 --requests 200 \
  --warmup 30 --concurrency 1 --rounds 2 --json "$OUT/ab_1x448.json" 2>&1
echo "## async client (gpu decode on): one process, one event loop, 8 concurrent requests of 4 x 512², IPC"
python3 -m mmproc.bench.serve --target 127.0.0.1:$PORT --http-target 127.0.0.1:$((PORT + 1)) "${common[@]}" \
  --client async --images-per-request 4 --resolutions 512x512 --requests 600 --warmup 16 --concurrency 8 \
  --json "$OUT/async_4x512.json" 2>&1

echo "## mmproc_cpu_seconds_total against the process tree"
python3 /tmp/cpu_check.py after on $on $((PORT + 1)) threads
python3 /tmp/cpu_check.py after off $off $((PORT + 3))
for mode in on off; do grep -E "JPEG decode on|ERROR|Traceback" "$OUT/server_$mode.log" | head -5; done
stop_servers

if [ -n "${BASELINE:-}" ]; then
  echo "## BASELINE=$BASELINE: an older tree's server, 4 x 512², one client process of 8 threads, IPC"
  (cd "$BASELINE" && PYTHONPATH=/tmp/site exec python3 -m service.cli serve "${flags[@]}" \
    --grpc-address 127.0.0.1:$((PORT + 4)) --http-address "") > "$OUT/server_baseline.log" 2>&1 &
  servers=($!)
  if healthy $((PORT + 4)) "$OUT/server_baseline.log"; then
    base=(--target 127.0.0.1:$((PORT + 4)) --device cuda:0 --format jpeg --transport ipc --quiet)
    python3 -m mmproc.bench.serve "${base[@]}" --images-per-request 4 --resolutions 512x512 --requests 40 --warmup 0 \
      --concurrency 8 > /dev/null 2>&1
    before=$(python3 scripts/tree_cpu_seconds.py "${servers[0]}")
    python3 -m mmproc.bench.serve "${base[@]}" --images-per-request 4 --resolutions 512x512 --requests 600 --warmup 16 \
      --concurrency 8 --json "$OUT/baseline_4x512.json" 2>&1 | grep -E "images/s|latency p50" | sed "s/^/baseline: /"
    after=$(python3 scripts/tree_cpu_seconds.py "${servers[0]}")
    python3 -c "print('baseline: server CPU per image %.2f ms (%.1f s over 2464 images)' % (($after - $before) / 2464 * 1000, $after - $before))"
  fi
  grep -E "JPEG decode on|ERROR|Traceback" "$OUT/server_baseline.log" | head -5
  stop_servers
fi
python3 -m mmproc.bench.forward --workloads 512x32 --reps 5 --no-baseline 2>&1 | tail -4
