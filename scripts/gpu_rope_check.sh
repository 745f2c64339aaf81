#!/usr/bin/env bash
# Fused RoPE check on the GPU host, from the repo root: parity tests, then the benchmark (with the block sweep).
#   bash scripts/gpu_rope_check.sh          -> $OUT/rope_check.log, $OUT/rope.json   (OUT defaults to /tmp/out)
# Exit status: non-zero if the tests or the benchmark failed.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
LOG="$OUT/rope_check.log"
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }

say "# gpu_rope_check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)"
nvidia-smi -L 2>&1 | tee -a "$LOG"
python3 - 2>&1 <<'PY' | tee -a "$LOG"
import importlib, platform
print("python", platform.python_version())
for name in ("torch", "triton", "pytest", "safetensors", "PIL"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as exc:
        print(name, "MISSING:", exc)
PY

# mmproc.models's package __init__ imports the weight loader (safetensors), which these tests never use. If the host
# lacks it, put a stub on the path for this run only (it raises if anything actually tries to load weights).
if ! python3 -c "import safetensors" 2>/dev/null; then
  STUB="$(mktemp -d)"
  mkdir -p "$STUB/safetensors"
  printf 'def safe_open(*args, **kwargs):\n    raise ImportError("safetensors stub (gpu_rope_check.sh)")\n' \
    >"$STUB/safetensors/__init__.py"
  export PYTHONPATH="$STUB${PYTHONPATH:+:$PYTHONPATH}"
  say "# safetensors missing: using a stub at $STUB for import only"
fi
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"

# The root conftest imports nothing of the service (pydantic etc. may be absent on this host); this file skips
# its own CUDA/Triton tests.
say "## pytest tests/model/test_rope_triton.py"
python3 -m pytest -q -rs -p no:cacheprovider tests/model/test_rope_triton.py 2>&1 | tee -a "$LOG"
tests_rc=$?
say "## python3 -m benchmarks.rope_kernels --sweep --json $OUT/rope.json"
python3 -m benchmarks.rope_kernels --sweep --json "$OUT/rope.json" 2>&1 | tee -a "$LOG"
bench_rc=$?
say "# tests rc=$tests_rc bench rc=$bench_rc"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
