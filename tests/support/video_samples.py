"""Small videos made on the fly with PyAV (tests skip without it): real encoders, real containers."""

from __future__ import annotations

import io
import os
import tempfile
from fractions import Fraction

import numpy as np

# codec name -> (container format, encoder) that PyAV's wheel writes
ENCODERS = {
    "h264": "libx264",
    "hevc": "libx265",
    "vp9": "libvpx-vp9",
    "av1": "libsvtav1",
    "vp8": "libvpx",
    "mpeg4": "mpeg4",
    "mjpeg": "mjpeg",
}
os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its banner to stderr otherwise
FORMATS = {"mp4": "mp4", "mov": "mov", "mkv": "matroska", "webm": "webm"}


def frame_pixels(index: int, width: int, height: int, seed: int = 0) -> np.ndarray:
    """(height, width, 3) uint8: smooth colour gradients that move with the frame number (cheap to encode, yet
    every frame differs, so a wrong frame index shows in the pixels)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    t = index * 0.35 + seed
    r = 127.5 + 127.5 * np.sin(x / 9.0 + t)
    g = 127.5 + 127.5 * np.sin(y / 7.0 - 1.3 * t)
    b = 127.5 + 127.5 * np.sin((x + y) / 13.0 + 0.7 * t + seed)
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


def make_video_bytes(
    width: int = 64,
    height: int = 48,
    frames: int = 10,
    fps: int = 10,
    *,
    codec: str = "h264",
    container: str = "mp4",
    gop: int | None = None,
    seed: int = 0,
    audio: bool = False,
    video: bool = True,
    constant: bool = False,
    faststart: bool = False,
) -> bytes:
    """An encoded video of `frames` frames at `fps`. gop: keyframe interval (None: the encoder's default);
    constant: every frame flat grey (compresses to almost nothing: a decoder bomb's raw material)."""
    import av

    buffer = io.BytesIO()
    if faststart:  # the index (moov) before the frames: FFmpeg rewrites the file, which needs a real one
        with tempfile.TemporaryDirectory() as tmp:
            path = f"{tmp}/clip"
            with open(path, "wb") as file:
                file.write(make_video_bytes(width, height, frames, fps, codec=codec, container=container, gop=gop))
            with av.open(path) as source, av.open(f"{path}.out", "w", format=FORMATS[container],
                                                  options={"movflags": "faststart"}) as out:  # fmt: skip
                stream = out.add_stream_from_template(source.streams.video[0])
                for packet in source.demux(source.streams.video[0]):
                    if packet.size:
                        packet.stream = stream
                        out.mux(packet)
            with open(f"{path}.out", "rb") as file:
                return file.read()
    with av.open(buffer, mode="w", format=FORMATS[container]) as out:
        stream = None
        if video:
            stream = out.add_stream(ENCODERS[codec], rate=fps)
            stream.width, stream.height = width, height
            stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
            options = {"preset": "ultrafast"} if codec in ("h264", "hevc") else {}
            if codec == "hevc":
                options["x265-params"] = "log-level=error"
            if codec == "av1":
                options = {"preset": "12"}
            if gop is not None:
                stream.codec_context.gop_size = gop
            stream.options = options
        sound = out.add_stream("aac", rate=16000) if audio else None
        for i in range(frames if video else 0):
            pixels = np.full((height, width, 3), 128, np.uint8) if constant else frame_pixels(i, width, height, seed)
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts = i
            frame.time_base = Fraction(1, fps)
            for packet in stream.encode(frame):
                out.mux(packet)
        if stream is not None:
            for packet in stream.encode():
                out.mux(packet)
        if sound is not None:
            samples = int(16000 * max(1, frames) / fps)
            tone = (0.2 * np.sin(np.arange(samples) / 5.0)).astype(np.float32)[None, :]
            frame = av.AudioFrame.from_ndarray(tone, format="fltp", layout="mono")
            frame.sample_rate = 16000
            for packet in sound.encode(frame):
                out.mux(packet)
            for packet in sound.encode():
                out.mux(packet)
    return buffer.getvalue()
