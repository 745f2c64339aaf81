"""Seeded benchmark videos (PyAV): the same bytes for the same (seed, index, spec) in every process; drifting colour,
sliding blocks and grain, so x264 spends bits as on camera footage."""

from __future__ import annotations

import io
from dataclasses import dataclass
from fractions import Fraction

import numpy as np


@dataclass(frozen=True)
class VideoSpec:
    seconds: float = 10.0
    width: int = 1280
    height: int = 720
    fps: int = 30
    codec: str = "libx264"  # PyAV encoder name
    container: str = "mp4"
    gop: int = 60  # keyframe interval in frames (2 s at 30 fps)

    @property
    def frames(self) -> int:
        return max(1, round(self.seconds * self.fps))


def make_video(spec: VideoSpec, seed: int, index: int) -> bytes:
    import av

    rng = np.random.default_rng(np.random.SeedSequence([seed, index]))
    h, w = spec.height, spec.width
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    phase = rng.uniform(0, 6.28, 3).astype(np.float32)
    blocks = rng.integers(0, 255, (6, 3)).astype(np.uint8)
    grain = rng.normal(0, 3, (h, w, 1)).astype(np.float32)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=spec.container) as out:
        stream = out.add_stream(spec.codec, rate=spec.fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.codec_context.gop_size = spec.gop
        stream.options = {"preset": "veryfast"} if spec.codec in ("libx264", "libx265") else {}
        for i in range(spec.frames):
            t = i / spec.fps
            field = np.stack(
                [np.sin(x / 97 + t + phase[0]), np.sin(y / 61 - 0.7 * t + phase[1]), np.sin((x + y) / 143 + phase[2])],
                axis=-1,
            )
            pixels = np.clip(127.5 + 100 * field + grain, 0, 255).astype(np.uint8)
            for k, colour in enumerate(blocks):
                bx = int((k * 211 + 60 * t * (k + 1)) % max(1, w - 80))
                by = int((k * 97 + 25 * t) % max(1, h - 80))
                pixels[by : by + 80, bx : bx + 80] = colour
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, spec.fps)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buffer.getvalue()
