"""Hostile (and a few good) videos, each with the outcomes it may have; part of the hostile corpus
(`tests.support.corpus.build_video_corpus`). Built with PyAV's encoders, then damaged by hand; ~3 s to build.

Most cases meet the default `VideoLimits`; those whose honest version would cost CI too much to encode (a
decoder bomb of 10 minutes of 1080p) carry smaller limits and the same shape of attack.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from mmproc.media.video_limits import VideoLimits
from tests.support.video_samples import make_video_bytes

OK = "ok"
DAMAGED = frozenset({"truncated", "undecodable", "empty"})


@dataclass(frozen=True)
class VideoCase:
    name: str
    data: bytes
    expect: frozenset[str]
    limits: VideoLimits = field(default_factory=VideoLimits)


def _case(name: str, data: bytes, *expect: str | frozenset[str], limits: VideoLimits | None = None) -> VideoCase:
    outcomes: set[str] = set()
    for item in expect:
        outcomes |= {item} if isinstance(item, str) else set(item)
    return VideoCase(name, data, frozenset(outcomes), limits or VideoLimits())


def set_mp4_duration(data: bytes, seconds: float) -> bytes:
    """The file with its movie (mvhd) and media (mdhd) headers, version 0, claiming `seconds`: a lying header."""
    out = bytearray(data)
    for box in (b"mvhd", b"mdhd"):  # version(1) flags(3) created(4) modified(4) timescale(4) duration(4)
        at = data.index(box) + 4
        (timescale,) = struct.unpack(">I", data[at + 12 : at + 16])
        out[at + 16 : at + 20] = struct.pack(">I", min(0xFFFFFFFF, int(seconds * timescale)))
    return bytes(out)


def set_mkv_duration(data: bytes, seconds: float) -> bytes:
    """The Matroska file with its Segment Info Duration (ID 0x4489, float, in ms at the default scale) lying."""
    at = data.index(b"\x44\x89") + 2
    width = data[at] & 0x0F  # one-byte size: 0x84 or 0x88
    value = struct.pack(">f" if width == 4 else ">d", seconds * 1000)
    return data[: at + 1] + value + data[at + 1 + width :]


def strip_clusters(mkv: bytes) -> bytes:
    """A Matroska file cut before its first Cluster: tracks declared, no frame (a zero-length stream)."""
    return mkv[: mkv.index(b"\x1f\x43\xb6\x75")]


def valid_controls() -> list[VideoCase]:
    return [
        _case("video/ok/h264-mp4", make_video_bytes(64, 48, 25, 10), OK),
        _case("video/ok/hevc-mov", make_video_bytes(64, 48, 12, 6, codec="hevc", container="mov"), OK),
        _case("video/ok/vp9-webm", make_video_bytes(64, 48, 12, 6, codec="vp9", container="webm"), OK),
        _case("video/ok/vp8-webm", make_video_bytes(64, 48, 12, 6, codec="vp8", container="webm"), OK),
        _case("video/ok/av1-mkv", make_video_bytes(64, 48, 12, 6, codec="av1", container="mkv"), OK),
        _case("video/ok/with-audio", make_video_bytes(64, 48, 12, 6, audio=True), OK),
    ]


def hostile() -> list[VideoCase]:
    mp4 = make_video_bytes(64, 48, 40, 10, gop=5)
    faststart = make_video_bytes(64, 48, 40, 10, gop=5, container="mov", faststart=True)
    mkv = make_video_bytes(64, 48, 40, 10, gop=5, container="mkv")
    cases = [
        _case("video/empty", b"", "empty"),
        _case("video/not-a-video", b"hello, world" * 10, "unsupported_format"),
        _case("video/avi-magic", b"RIFF\x00\x00\x00\x00AVI LIST" + bytes(64), "unsupported_format"),
        _case("video/jpeg-as-video", b"\xff\xd8\xff\xe0" + bytes(64), "unsupported_format"),
        _case("video/bmff-header-only", mp4[:32], DAMAGED),
        _case("video/zero-length-stream", strip_clusters(mkv), DAMAGED),
        _case("video/audio-only", make_video_bytes(video=False, audio=True), "no_video_stream"),
        _case("video/mpeg4-codec", make_video_bytes(codec="mpeg4"), "unsupported_codec"),
        _case("video/mjpeg-codec", make_video_bytes(codec="mjpeg", container="mkv"), "unsupported_codec"),
        _case("video/huge-resolution", make_video_bytes(4096, 2304, 2, 10, constant=True), "too_many_pixels"),
        _case("video/frame-rate-1000", make_video_bytes(32, 32, 20, 1000), "frame_rate"),
        _case("video/too-long", make_video_bytes(32, 32, 700, 1, constant=True), "video_too_long"),
        # FFmpeg takes an MP4's durations from its sample table, which the packets follow: lying mvhd/mdhd change
        # nothing. Matroska's Segment duration is believed, so a long claim is refused before decoding.
        _case("video/mp4-header-claims-10h", set_mp4_duration(mp4, 36_000), OK),
        _case("video/mp4-header-claims-0.1s", set_mp4_duration(mp4, 0.1), OK),
        _case("video/mkv-header-claims-10h", set_mkv_duration(mkv, 36_000), "video_too_long"),
        _case("video/mkv-header-claims-0.1s", set_mkv_duration(mkv, 0.1), OK),  # the packets are checked too
        _case(
            "video/decoder-bomb-1080p",  # 11 kB of flat 1080p frames, sampled from keyframes 250 apart
            make_video_bytes(1920, 1080, 120, 60, constant=True),
            "decode_cost",
            limits=VideoLimits(max_decode_megapixels=100),
        ),
        _case("video/too-many-sampled-frames", mp4, "too_many_frames", limits=VideoLimits(max_sampled_frames=4)),
        _case("video/decode-time", mp4, "decode_time", limits=VideoLimits(decode_cpu_s=1e-9)),
    ]
    for name, data in (("mp4", mp4), ("mov-faststart", faststart), ("mkv", mkv)):
        for fraction in (0.3, 0.6, 0.9):
            cut = data[: int(len(data) * fraction)]
            # Matroska has no frame count: the last few frames missing pass as a slightly shorter video.
            lenient = (OK,) if name == "mkv" and fraction > 0.8 else ()
            cases.append(_case(f"video/truncated/{name}-{int(fraction * 100)}", cut, DAMAGED, *lenient))
        flipped = bytearray(data)
        for at in range(len(data) // 3, len(data), len(data) // 7):
            flipped[at] ^= 0x5A
        cases.append(_case(f"video/bit-flips/{name}", bytes(flipped), DAMAGED, OK))
    return cases


def build_video_corpus() -> tuple[VideoCase, ...]:
    cases = tuple(valid_controls() + hostile())
    assert len({c.name for c in cases}) == len(cases), "case names must be unique"
    return cases


def mkv_claims_size(mkv: bytes, width: int, height: int) -> bytes:
    """The Matroska track's PixelWidth / PixelHeight (2-byte values) set to a size the frames do not have: the
    container lies, the bitstream does not (issue 47: a 1 KB VP8 claiming 64x48 with 16383x8000 keyframes)."""
    at_w, at_h = mkv.index(b"\xb0\x82"), mkv.index(b"\xba\x82")
    out = bytearray(mkv)
    out[at_w + 2 : at_w + 4], out[at_h + 2 : at_h + 4] = width.to_bytes(2, "big"), height.to_bytes(2, "big")
    return bytes(out)
