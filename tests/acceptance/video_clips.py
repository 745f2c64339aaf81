"""Issue 47's legitimate clips, by hand (not collected; minutes on a CPU): a 60 s 1080p and a 30 s 4K H.264 clip,
made here (a moving gradient, ultrafast, 25 fps), encoded through a real server (tiny K2.5 on the CPU, limits at
their defaults unless given); prints the outcome, the time and the decode workers' RSS: idle, peak, after.

    python -m tests.acceptance.video_clips 1080p [max_patches_per_request=524288]
    python -m tests.acceptance.video_clips 4k       # figures: docs/reliability.md, "Videos"
"""

from __future__ import annotations

import io
import sys
import time

import numpy as np

from mmproc.client import EncoderClient
from tests.support.server import serving, test_settings


def clip(width: int, height: int, seconds: int, fps: int = 25) -> bytes:
    import av

    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], -1).astype(np.uint8)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=fps, options={"preset": "ultrafast", "crf": "30"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(seconds * fps):
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.roll(base, i * 7, axis=1), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buffer.getvalue()


def status_mb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(key):
                return int(line.split()[1]) >> 10
    return 0


def main() -> None:
    which, overrides = sys.argv[1], {k: int(v) for k, v in (a.split("=") for a in sys.argv[2:])}
    data = clip(1920, 1080, 60) if which == "1080p" else clip(3840, 2160, 30)
    with serving(test_settings(model="tiny-k2.5", **overrides)) as server:
        pool = server.service.pipeline.decode_pool
        pids = pool.worker_pids()
        idle = {pid: status_mb(pid, "VmRSS") for pid in pids}
        started = time.monotonic()
        with EncoderClient(server.grpc_target, timeout=600) as client:
            try:
                (video,) = client.encode_videos([data])
                outcome = f"OK: {len(video.frame_indices)} frames, {video.num_tokens} tokens, {video.size}"
            except Exception as exc:  # noqa: BLE001 - printed: the refusal is the figure
                outcome = f"{type(exc).__name__}: {exc}"
        print(f"{which} ({len(data) >> 20} MB): {outcome} in {time.monotonic() - started:.1f} s")
        live = pool.worker_pids()
        peak = {pid: status_mb(pid, "VmHWM") for pid in pids if pid in live}
        print("decode workers' RSS (MB): idle", idle, "peak", peak, "after", {p: status_mb(p, "VmRSS") for p in live})


if __name__ == "__main__":
    main()
