#!/usr/bin/env bash
# Issue 19 on the GPU host, from the repo root: `bench encoder` measures MFU against the H200's own peak (and
# none on an unknown GPU), defaults to bf16 on CUDA, prints readable lines, and writes a plot when matplotlib is
# there; `bench rope` still runs with its progress bar code path (--quiet and not).
#   bash scripts/gpu_bench_report_check.sh   -> $OUT/bench_report.log, $OUT/encoder.json, $OUT/encoder.png
# Exit status: non-zero if any step failed.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
LOG="$OUT/bench_report.log"
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"

say "# gpu_bench_report_check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)"
nvidia-smi -L 2>&1 | tee -a "$LOG"
plot=()
if python3 -c "import matplotlib" 2>/dev/null; then plot=(--plot "$OUT/encoder.png"); else say "(no matplotlib: no plot)"; fi

say "## bench encoder (defaults: bf16, the device's peak)"
python3 -m mmproc.bench.forward --workloads 448x16 mixed8 --reps 5 --warmup 2 --json "$OUT/encoder.json" "${plot[@]}" \
  2>&1 | tee -a "$LOG"
enc_rc=${PIPESTATUS[0]}
python3 - "$OUT/encoder.json" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
record = json.load(open(sys.argv[1]))
gpu, peak = record["gpu"], record["peak_tflops"]
print(f"gpu={gpu!r} dtype={record['dtype']} peak={peak} note={record['peak_note']!r}")
assert record["dtype"] == "bfloat16", "bf16 is what serve uses on CUDA"
ours = [r for r in record["results"] if r["impl"] == "mmproc"]
if "H200" in gpu:
    assert peak == 790.0 and all(r["mfu"] and 0.05 < r["mfu"] < 1 for r in ours), "MFU against the H200 peak"
else:
    assert peak is None and all(r["mfu"] is None for r in ours), "no MFU against another chip's peak"
print("encoder record OK:", [(r["workload"], round(r["images_per_s"], 1), r["mfu"]) for r in ours])
PY
check_rc=${PIPESTATUS[0]}
say "## bench rope --quiet (tokens 1024 4096)"
python3 -m benchmarks.rope_kernels --tokens 1024 4096 --quiet 2>&1 | tail -12 | tee -a "$LOG"
rope_rc=${PIPESTATUS[0]}
say "# encoder rc=$enc_rc record check rc=$check_rc rope rc=$rope_rc"
[ "$enc_rc" -eq 0 ] && [ "$check_rc" -eq 0 ] && [ "$rope_rc" -eq 0 ]
