#!/usr/bin/env bash
# Issue 22, video on the H200: `mmproc serve --model kimi-k2.5` on cuda:0 (bf16), then `bench serve --workload video`
# (10 s of 1280x720 at 30 fps per request, sampled at 2 fps: 20 frames, 5 chunks) over IPC and serialized, with the
# CPU decode cost per sampled frame against FFmpeg's decode floor. From the repo root with the wheels in .whl/ (the
# `av` wheel among them: `pip download av --no-deps -d .whl`, see docs/benchmarks/README.md); output in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
PORT=${PORT:-50181}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
{
  date -u; echo "commit ${MMPROC_COMMIT:-unknown}"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, av; print('torch', torch.__version__, 'av', av.__version__, av.library_versions['libavcodec'])"
} 2>&1 | tee "$OUT/video_env.log"
python3 -c "import av" || { echo "PyAV missing: put its wheel in .whl/"; exit 1; }
python3 -m pytest -q -p no:cacheprovider tests/media/test_video.py tests/model/test_video.py 2>&1 | tail -3 | tee "$OUT/video_tests.log"
python3 -m service.app.cli serve --model kimi-k2.5 --device cuda:0 --dtype bfloat16 --transport auto \
  --grpc-address 127.0.0.1:$PORT --http-address "" --ipc-pool-mb 2048 > "$OUT/video_server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server' EXIT
for _ in $(seq 300); do python3 -m service.app.cli health --target 127.0.0.1:$PORT >/dev/null 2>&1 && break; sleep 1; done
python3 -m service.app.cli health --target 127.0.0.1:$PORT || { echo "server never became SERVING"; tail -30 "$OUT/video_server.log"; exit 1; }
common=(--workload video --target 127.0.0.1:$PORT --device cuda:0 --video-seconds 10 --video-resolution 1280x720
        --video-fps 30 --gop 60 --distinct 4 --warmup 2 --quiet)
for transport in ipc serialized; do
  for concurrency in 1 4; do
    python3 -m service.app.cli bench serve "${common[@]}" --transport $transport --concurrency $concurrency --requests 32 \
      --json "$OUT/video_${transport}_c${concurrency}.json" --decode-reps 1 | tee "$OUT/video_${transport}_c${concurrency}.md"
  done
done
grep -E "kernels|IPC|decode workers|ERROR|Traceback" "$OUT/video_server.log" | head -20
