#!/usr/bin/env bash
# Issue 21 on the GPU host, from the repo root (wheels in .whl/ as in docs/benchmarks/README.md); output in $OUT:
# the Triton split-head attention tests (with the GPU encoder and model tests, sync-debug included), the K2.5 encoder
# bench (default = Triton attention vs the library varlen kernel, baseline, attention table, small-batch latency)
# and the serialized staging bench.
#   MMPROC_COMMIT=<sha> bash scripts/gpu_attention_check.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=".:/tmp/site"
else
  export PYTHONPATH="."
fi
echo "# gpu_attention_check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit=${MMPROC_COMMIT:-unknown}" | tee "$OUT/attention_check.log"
nvidia-smi -L | tee -a "$OUT/attention_check.log"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/attention_check.log"
python3 -m pytest -q -rs --noconftest -p no:cacheprovider -m cuda tests/test_attention_triton.py tests/test_gpu_encoder.py \
  tests/test_model.py 2>&1 | tee "$OUT/attention_tests.log" | tail -5 | tee -a "$OUT/attention_check.log"
python3 -m service.bench.encoder --json "$OUT/encoder.json" --workloads 448x64 1024x16 mixed48 --variants attn=varlen \
  --attention --reps 6 --warmup 2 --latency 448x1 1024x1 256x4 --latency-reps 50 2>&1 | tee "$OUT/encoder.log" \
  | tee -a "$OUT/attention_check.log" | tail -60
python3 -m service.bench.d2h --device cuda:0 --mb 20 --reps 50 --json "$OUT/d2h.json" 2>&1 | tee "$OUT/d2h.log" | tail -15
