#!/usr/bin/env bash
# Issue 48 on the GPU host, from the repo root: the NIXL transport with GPU memory on both ends, on one node.
#   NIXL_WHEEL=shared/wheels/nixl_cu13-1.5.1-cp312-cp312-manylinux_2_28_x86_64.whl bash scripts/gpu_xnode_check.sh
# (the nixl-cu13 1.5.1 wheel for the host's Python, installed when nixl_cu13 is not importable: the host reaches no
# index; `pip download --no-deps nixl-cu13==1.5.1 --python-version 3.12 --only-binary=:all:` fetches it). Writes $OUT/xnode.log and
# $OUT/xnode-20mb.json. Steps: (1) a server on cuda:0 registers its NIXL pool in GPU memory (the start-up line says
# "GPU pool"); (2) a consumer process on cuda:0 reads into its GPU arena: bytes equal to serialized; (3) `mmproc
# bench serve` NIXL vs serialized, 20 MB replies (the tiny preset in float32 caps an image near 1 MB: 20 images of
# 896x896; with MODEL_PATH set, 4 images of 1344x1344 of that checkpoint in bf16), consumer on cuda:0,
# reply->ready p50 (goal: <= 2 ms). UCX picks its transports (cuda_ipc / cuda_copy on one node). Exit status: non-zero on failure.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
LOG="$OUT/xnode.log"
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-all}"
say "# gpu_xnode_check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)"
nvidia-smi -L 2>&1 | tee -a "$LOG"
if ! python3 -c "import nixl_cu13" 2>/dev/null; then
  python3 -m pip install --quiet --no-index --no-deps "${NIXL_WHEEL:?set NIXL_WHEEL to the nixl-cu13 wheel}" 2>&1 | tee -a "$LOG"
fi
python3 -c "import nixl_cu13; print('nixl', nixl_cu13.__file__)" 2>&1 | tee -a "$LOG" || exit 1

if [ -n "${MODEL_PATH:-}" ]; then model=(--model-path "$MODEL_PATH"); shape=(--images-per-request 4 --resolutions 1344x1344)
else model=(--dtype float32); shape=(--images-per-request 20 --resolutions 896x896); fi
python3 -m service.app.cli serve --device cuda:0 "${model[@]}" --nixl --nixl-net-devices all --cache-mb 0 \
  --grpc-address 127.0.0.1:50781 --http-address 127.0.0.1:8781 >"$OUT/xnode-server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 120); do curl -sf 127.0.0.1:8781/readyz >/dev/null 2>&1 && break; sleep 1; done
say "## (1) start-up"
grep "transports:" "$OUT/xnode-server.log" | tee -a "$LOG"
grep -q "NIXL active: .* GPU pool" "$OUT/xnode-server.log"; reg_rc=$?
say "GPU memory registered: $([ $reg_rc = 0 ] && echo yes || echo NO)"

say "## (2) GPU-to-GPU read, consumer on cuda:0"
python3 -m tests.support.nixl_consumer compare 127.0.0.1:50781 cuda:0 2>&1 | grep -v "NIXL INFO" | tee -a "$LOG"
grep -q '"equal": true.*"arena": "cuda:0"' "$LOG"; read_rc=$?

say "## (3) bench: NIXL vs serialized, 20 MB replies (${shape[*]}), consumer on cuda:0"
for consume in view copy; do
  python3 -m service.app.cli bench serve --target 127.0.0.1:50781 --http-target 127.0.0.1:8781 --transport nixl \
    --compare transport --device cuda:0 --consume $consume "${shape[@]}" \
    --requests 64 --warmup 8 --concurrency 1 --server-cache off --quiet --json "$OUT/xnode-20mb-$consume.json" \
    2>&1 | grep -v "NIXL INFO" | tee -a "$LOG"
done
python3 - "$OUT/xnode-20mb-view.json" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
runs = {r["label"]: r for r in json.load(open(sys.argv[1]))["runs"]}
p50 = runs["nixl"]["stages_ms"]["reply_to_ready"]["p50"]
print(f"reply->ready p50, GPU-resident 20 MB, consume=view: {p50:.3f} ms (goal <= 2 ms)")
PY
bench_rc=${PIPESTATUS[0]}
say "rc: registered=$reg_rc read=$read_rc bench=$bench_rc"
exit $(( reg_rc || read_rc || bench_rc ))
