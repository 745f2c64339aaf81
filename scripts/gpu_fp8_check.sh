#!/usr/bin/env bash
# FP8 vision towers on the GPU host (issue 50, docs/benchmarks/fp8.md). Run from the repo root with the wheels in .whl/
# (see docs/benchmarks/README.md); output in $OUT (default /tmp/out):
#   fp8_tests.log        the fp8 tests, CUDA ones included (real kernels against their emulation, an fp8 server)
#   fp8_linear.log/.json one block's linears alone: bf16 matmul, FP8 scaled matmul, the activation quantizer
#   encoder_fp8_k25.log/.json, encoder_fp8_k3.log/.json
#                        `bench encoder --fp8`: bf16 and fp8 in one run at 448x64, 1024x16, mixed48 (random weights)
#   accuracy.log/.json   `bench accuracy`: fp8 and bf16 against float32, kimi-k2.5 and kimi-k3, 2 images per kind
# Goals (issue 50): fp8 >= 1.4x bf16 img/s at 448x64, >= 1.25x at 1024x16 and mixed48; worst image cos >= 0.995, mean
# token cos >= 0.999 against float32. About 5 minutes on an H100 (each step bounded by `timeout`).
#   bash scripts/gpu_fp8_check.sh            (REPS=10 WARMUP=3 by default)
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
REPS=${REPS:-10}
WARMUP=${WARMUP:-3}
LOG="$OUT/fp8_tests.log"
{
  date -u; echo "commit ${MMPROC_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,uuid,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__,
  'capability', torch.cuda.get_device_capability())"
} 2>&1 | tee "$LOG"

timeout 180 python3 -m pytest -q -rs -p no:cacheprovider tests/model/test_fp8.py tests/model/test_quantize.py \
  tests/service/app/test_quantization_setting.py 2>&1 | tee -a "$LOG"
tests_rc=${PIPESTATUS[0]}

timeout 120 python3 -m benchmarks.fp8_linear --json "$OUT/fp8_linear.json" 2>&1 | tee "$OUT/fp8_linear.log"
linear_rc=${PIPESTATUS[0]}

bench_rc=0
for preset in kimi-k2.5 kimi-k3; do
  tag=${preset#kimi-}; tag=${tag/./}
  timeout 150 python3 -m mmproc.bench.forward --preset "$preset" --workloads 448x64 1024x16 mixed48 --fp8 --no-baseline \
    --reps "$REPS" --warmup "$WARMUP" --quiet --json "$OUT/encoder_fp8_$tag.json" 2>&1 | tee "$OUT/encoder_fp8_$tag.log"
  rc=${PIPESTATUS[0]}; [ "$rc" -eq 0 ] || bench_rc=$rc
done

timeout 120 python3 -m mmproc.bench.accuracy --presets kimi-k2.5 kimi-k3 --per-kind 2 --json "$OUT/accuracy.json" 2>&1 \
  | tee "$OUT/accuracy.log"
accuracy_rc=${PIPESTATUS[0]}

echo "# tests rc=$tests_rc fp8_linear rc=$linear_rc encoder rc=$bench_rc accuracy rc=$accuracy_rc" | tee -a "$LOG"
grep -h "x the default\|floor" "$OUT"/encoder_fp8_*.log "$OUT/accuracy.log" | tee -a "$LOG"
[ "$tests_rc" -eq 0 ] && [ "$linear_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$accuracy_rc" -eq 0 ]
