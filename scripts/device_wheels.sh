#!/usr/bin/env bash
# The wheels the GPU host lacks (Python 3.12, manylinux x86_64), into .whl/ (ignored by git: add `/.whl/` to
# .git/info/exclude). Each scripts/gpu_*.sh installs them with `pip install --no-index --no-deps --target /tmp/site`.
# uvloop and nvImageCodec/nvJPEG make the server's configuration the recorded one (event loop, GPU JPEG decode);
# av is for the video tests. About 40 MiB: move docs/benchmarks/raw out of the checkout for a device call.
set -euo pipefail
cd "$(dirname "$0")/.."
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_34_x86_64)
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl \
  pydantic pydantic-core typing-inspection annotated-types typing-extensions pydantic-settings python-dotenv \
  grpcio-health-checking==1.84.0 grpcio-status==1.84.0 grpcio-reflection==1.84.0 googleapis-common-protos \
  fastapi starlette anyio sniffio idna annotated-doc uvicorn h11 click prometheus-client opentelemetry-api \
  importlib-metadata zipp xxhash uvloop nvidia-nvimgcodec-cu13 nvidia-nvjpeg av
ls .whl | wc -l
