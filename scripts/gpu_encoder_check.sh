#!/usr/bin/env bash
# Encoder check on the GPU host, from the repo root: RoPE check (tests + bench), GPU encoder and fused add+LayerNorm
# tests, encoder bench.
#   bash scripts/gpu_encoder_check.sh [bench flags...]
#     -> $OUT/rope_check.log, $OUT/rope.json, $OUT/encoder_check.log, $OUT/encoder.json   (OUT defaults to /tmp/out)
# Exit status: non-zero if any step failed.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
LOG="$OUT/encoder_check.log"
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }
export PYTHONUNBUFFERED=1

say "# gpu_encoder_check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)"
nvidia-smi -L 2>&1 | tee -a "$LOG"

bash scripts/gpu_rope_check.sh >/dev/null 2>&1
rope_rc=$?
say "## rope check rc=$rope_rc (full log: $OUT/rope_check.log)"
grep -E "passed|failed|error| 4096 " "$OUT/rope_check.log" | tee -a "$LOG"

export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
say "## pytest tests/model/test_gpu.py tests/model/test_add_norm_triton.py tests/model/test_moonvit.py -m cuda"
python3 -m pytest -q -rs -p no:cacheprovider -m cuda tests/model/test_gpu.py tests/model/test_add_norm_triton.py \
  tests/model/test_moonvit.py 2>&1 \
  | tee -a "$LOG"
tests_rc=$?

say "## python3 -m mmproc.bench.forward --json $OUT/encoder.json $*"
python3 -m mmproc.bench.forward --json "$OUT/encoder.json" "$@" 2>&1 | tee -a "$LOG"
bench_rc=$?
say "# rope rc=$rope_rc tests rc=$tests_rc bench rc=$bench_rc"
[ "$rope_rc" -eq 0 ] && [ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
