"""Video bytes -> the sampled RGB frames, with every refusal decided before a frame is decoded (PyAV = FFmpeg).

Cheapest first: size, container magic (one demuxer), the header, the packet index, the sampling plan, then a
decode bounded in CPU time that seeks and skips what nobody sampled; the order and the refusals: docs/media.md.
Frame i is the i-th in presentation order, converted with `to_ndarray(format="rgb24")`, as the reference does.
"""

from __future__ import annotations

import io
import time
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from mmproc.errors import InvalidMediaError, InvalidRequestError, Reason
from mmproc.media.video_limits import CONTAINERS, VideoLimits

_MATROSKA_MAGIC = b"\x1a\x45\xdf\xa3"
_BMFF_BOXES = (b"ftyp", b"moov", b"mdat", b"wide", b"free", b"skip")  # first box of an MP4 / QuickTime file


def sniff_container(data: bytes) -> str | None:
    """ "mp4" (ISO BMFF: MP4, MOV), "matroska" (MKV, WebM) or None, from the first bytes."""
    if data[:4] == _MATROSKA_MAGIC:
        return "matroska"
    if len(data) >= 8 and data[4:8] in _BMFF_BOXES:
        return "mp4"
    return None


@dataclass(frozen=True)
class VideoSampling:
    """How to sample: `fps` frames per second (None: the rules' default) or exactly `num_frames` frames."""

    fps: float | None = None
    num_frames: int | None = None


@dataclass(frozen=True)
class VideoIndex:
    """What the header and the packets say, before decoding. pts: every frame's presentation time in
    presentation order (frame i = pts[i]), in `time_base` units, or None when some packet has no timestamp."""

    container: str
    codec: str
    width: int
    height: int
    fps: float  # the stream's average rate: the reference's `VideoMetadata.fps`
    num_frames: int
    duration_s: float
    pts: tuple[int, ...] | None
    keyframe_pts: tuple[int, ...]
    time_base: Fraction


@dataclass(frozen=True)
class DecodedVideo:
    """The sampled frames. frames: (T, H, W, 3) uint8 RGB; indices: their frame numbers; timestamps: index / fps
    in seconds (the reference's `VideoMetadata.timestamps`); decoded_frames: frames the decoder produced."""

    frames: np.ndarray
    indices: tuple[int, ...]
    timestamps: tuple[float, ...]
    index: VideoIndex
    decoded_frames: int


def sample_indices(num_frames: int, video_fps: float, target_fps: float | None, count: int | None) -> list[int]:
    """transformers' `default_sample_indices_fn`: n = max(1, int(num_frames / video_fps * fps)) frames (or
    `count`), frame k * num_frames // n for k < n. Raises TOO_MANY_FRAMES when n exceeds the frames there are."""
    n = count if count is not None else max(1, int(num_frames / video_fps * target_fps))
    if n > num_frames:
        raise InvalidMediaError(
            f"sampling asks for {n} frames of a video that has {num_frames}", reason=Reason.TOO_MANY_FRAMES
        )
    return [k * num_frames // n for k in range(n)]


def _open(data: bytes, container: str):  # -> av.container.InputContainer
    import av  # optional dependency (the `video` extra): images never need it

    # Metadata that is not UTF-8 must not fail the open: PyAV < 19 needs to be told, 19 dropped the argument.
    lenient = {"metadata_errors": "ignore"} if int(av.__version__.split(".")[0]) < 19 else {}
    try:
        return av.open(io.BytesIO(data), mode="r", format=CONTAINERS[container], **lenient)
    except (av.FFmpegError, UnicodeDecodeError) as exc:
        raise InvalidMediaError(f"not a readable {container} file: {exc}", reason=Reason.UNDECODABLE) from None


def index_video(data: bytes, limits: VideoLimits) -> VideoIndex:
    """Steps 1-4: the checks that need no decoding, and the packet index the sampler plans with."""
    if not data:
        raise InvalidMediaError("empty video", reason=Reason.EMPTY)
    if len(data) > limits.max_video_bytes:
        raise InvalidMediaError(
            f"video is {len(data)} bytes, the limit is {limits.max_video_bytes}", reason=Reason.TOO_LARGE
        )
    container = sniff_container(data)
    if container is None or container not in limits.allowed_containers:
        raise InvalidMediaError(
            f"not an allowed video container (allowed: {sorted(limits.allowed_containers)})",
            reason=Reason.UNSUPPORTED_FORMAT,
        )
    with _open(data, container) as handle:
        return _index(handle, container, limits)


def _index(handle, container: str, limits: VideoLimits) -> VideoIndex:
    import av

    if not handle.streams.video:
        raise InvalidMediaError("the file has no video stream", reason=Reason.NO_VIDEO_STREAM)
    stream = handle.streams.video[0]
    samples = sum(s.frames for s in handle.streams if s.frames)  # every track's, from the container's tables
    if samples > limits.max_stream_frames:
        raise InvalidMediaError(
            f"the file's tracks hold {samples} samples, over {limits.max_stream_frames}", reason=Reason.VIDEO_TOO_LONG
        )
    _discard_others(handle, stream)
    codec = stream.codec_context.codec.canonical_name  # the format's name ("av1"), not the decoder's (libdav1d)
    if codec not in limits.allowed_codecs:
        raise InvalidMediaError(
            f"video codec {codec!r} is not allowed (allowed: {sorted(limits.allowed_codecs)})",
            reason=Reason.UNSUPPORTED_CODEC,
        )
    width, height = stream.codec_context.width, stream.codec_context.height
    if width < 1 or height < 1:
        raise InvalidMediaError(f"video frames are {width}x{height}", reason=Reason.TOO_SMALL)
    if width * height > limits.max_pixels:
        raise InvalidMediaError(
            f"video frames are {width}x{height}, over the limit of {limits.max_pixels} pixels",
            reason=Reason.TOO_MANY_PIXELS,
        )
    rate = stream.average_rate or stream.guessed_rate
    if rate is not None and float(rate) > limits.max_fps:
        raise InvalidMediaError(f"frame rate {float(rate):.3f} is over {limits.max_fps}", reason=Reason.FRAME_RATE)
    time_base = stream.time_base or Fraction(1, 1000)
    header_s = max(
        handle.duration / 1e6 if handle.duration else 0.0,
        float(stream.duration * time_base) if stream.duration else 0.0,
    )
    if header_s > limits.max_duration_s:
        raise InvalidMediaError(
            f"the header says {header_s:.1f} s, the limit is {limits.max_duration_s} s", reason=Reason.VIDEO_TOO_LONG
        )
    pts: list[int] = []
    keys: list[int] = []
    missing = False
    try:
        for packet in handle.demux(stream):
            if packet.size == 0:
                continue  # the demuxer's flush packet
            stamp = packet.pts if packet.pts is not None else packet.dts
            missing |= stamp is None
            pts.append(0 if stamp is None else stamp)
            if packet.is_keyframe and stamp is not None:
                keys.append(stamp)
            if len(pts) > limits.max_stream_frames:
                raise InvalidMediaError(
                    f"more than {limits.max_stream_frames} frames in the stream", reason=Reason.VIDEO_TOO_LONG
                )
    except av.FFmpegError as exc:
        raise _damaged("the container", exc) from None
    if not pts:
        raise InvalidMediaError("the video stream has no frames", reason=Reason.EMPTY)
    if stream.frames and len(pts) < stream.frames:  # MP4's sample table counts the frames the file should hold
        raise InvalidMediaError(
            f"the file holds {len(pts)} of the {stream.frames} frames its index lists", reason=Reason.TRUNCATED
        )
    pts.sort()
    span_s = float((pts[-1] - pts[0]) * time_base)
    if rate is None:  # no rate in the header: the packets' own
        rate = Fraction(len(pts) - 1, 1) / Fraction(span_s).limit_denominator(1 << 20) if span_s > 0 else Fraction(1)
        if float(rate) > limits.max_fps:
            raise InvalidMediaError(f"frame rate {float(rate):.3f} is over {limits.max_fps}", reason=Reason.FRAME_RATE)
    packets_s = span_s + 1 / float(rate)
    if len(handle.streams) == 1 and header_s > packets_s + max(0.5, 0.05 * header_s):
        # The header's duration is this stream's alone, and the frames stop well short of it.
        raise InvalidMediaError(
            f"the frames end at {packets_s:.2f} s of the {header_s:.2f} s the header declares", reason=Reason.TRUNCATED
        )
    duration_s = max(header_s, packets_s)
    if duration_s > limits.max_duration_s:
        raise InvalidMediaError(
            f"the stream lasts {duration_s:.1f} s, the limit is {limits.max_duration_s} s", reason=Reason.VIDEO_TOO_LONG
        )
    return VideoIndex(
        container=container,
        codec=codec,
        width=width,
        height=height,
        fps=float(rate),
        num_frames=len(pts),
        duration_s=duration_s,
        pts=None if missing else tuple(pts),
        keyframe_pts=tuple(sorted(set(keys))),
        time_base=time_base,
    )


def _discard_others(handle, keep) -> None:
    """Every track but `keep` dropped by the demuxer (AVDISCARD_ALL), not parsed into packets (PyAV >= 16)."""
    import av

    discard = getattr(getattr(av.stream, "Discard", None), "all", None)
    for other in handle.streams:
        if other is not keep and discard is not None:
            other.discard = discard


def _damaged(what: str, exc: Exception) -> InvalidMediaError:
    """FFmpeg's error while reading: ENOMEM (PyAV's MemoryError) is a file that needs more room than a worker has,
    not a cut one."""
    if isinstance(exc, MemoryError):
        return InvalidMediaError(f"{what} needs more memory than a decode worker has", reason=Reason.UNDECODABLE)
    return InvalidMediaError(f"{what} is damaged: {exc}", reason=Reason.TRUNCATED)


def plan_decode(index: VideoIndex, wanted: list[int]) -> tuple[list[bool], int]:
    """Per sampled frame whether to seek before it, and the frames decoded at most (non-reference frames may be
    skipped). Seek when a keyframe lies after the decoder's position and at or before the target: decoding from
    there is never more work."""
    if index.pts is None or not index.keyframe_pts:
        return [False] * len(wanted), wanted[-1] + 1  # no timestamps to seek by: decode from the start
    pts, keys = index.pts, index.keyframe_pts
    seeks, decoded, position = [], 0, -1  # position: the last frame decoded
    for target in wanted:
        k = bisect_right(keys, pts[target]) - 1  # the last keyframe at or before the target
        start = bisect_right(pts, keys[k]) - 1 if k >= 0 else 0
        seek = position < 0 or start > position + 1
        seeks.append(seek and start > 0)
        first = start if seek else position + 1
        decoded += max(0, target - first + 1)
        position = max(position, target)
    return seeks, decoded


@dataclass(frozen=True)
class VideoPlan:
    """What to decode, from the index (steps 1-5): the sampled frame numbers and where to seek."""

    index: VideoIndex
    wanted: tuple[int, ...]
    seeks: tuple[bool, ...]
    decoded: int  # frames the plan decodes at most


def plan_video(data: bytes, limits: VideoLimits, sampling: VideoSampling, default_fps: float) -> VideoPlan:
    """Validate (steps 1-5) and plan the decode of the sampled frames. `default_fps`: the rules' sampling rate."""
    index = index_video(data, limits)
    fps = sampling.fps if sampling.fps is not None else default_fps
    if sampling.num_frames is None and not 0 < fps <= limits.max_sample_fps:
        raise InvalidRequestError(
            f"sampling fps {fps} is not in (0, {limits.max_sample_fps}]", reason=Reason.BAD_REQUEST
        )
    wanted = sample_indices(index.num_frames, index.fps, fps, sampling.num_frames)
    if len(wanted) > limits.max_sampled_frames:
        raise InvalidMediaError(
            f"{len(wanted)} sampled frames, the limit is {limits.max_sampled_frames} per video",
            reason=Reason.TOO_MANY_FRAMES,
        )
    seeks, decoded = plan_decode(index, wanted)
    plan = VideoPlan(index, tuple(wanted), tuple(seeks), decoded)
    check_decode_cost(plan, index.width, index.height, limits)
    return plan


def check_decode_cost(plan: VideoPlan, width: int, height: int, limits: VideoLimits) -> None:
    """DECODE_COST when the plan's frames at `width` x `height` (the container's, then the first decoded frame's)
    pass `max_decode_megapixels`; TOO_MANY_PIXELS when a frame passes `max_pixels`."""
    if width * height > limits.max_pixels:
        raise InvalidMediaError(
            f"video frames are {width}x{height}, over the limit of {limits.max_pixels} pixels",
            reason=Reason.TOO_MANY_PIXELS,
        )
    megapixels = plan.decoded * width * height / 1e6
    if megapixels > limits.max_decode_megapixels:
        raise InvalidMediaError(
            f"sampling needs {plan.decoded} frames of {width}x{height} decoded ({megapixels:.0f} MP), "
            f"the limit is {limits.max_decode_megapixels:.0f} MP",
            reason=Reason.DECODE_COST,
        )


def decode_video(data: bytes, limits: VideoLimits, sampling: VideoSampling, default_fps: float) -> DecodedVideo:
    """Validate (steps 1-5), then decode the sampled frames only, all kept (tests, references); the workers
    stream them instead (`iter_frames`)."""
    plan = plan_video(data, limits, sampling, default_fps)
    count = [0]
    frames = list(iter_frames(data, plan, limits, count))
    return DecodedVideo(
        frames=np.stack(frames),
        indices=plan.wanted,
        timestamps=tuple(i / plan.index.fps for i in plan.wanted),
        index=plan.index,
        decoded_frames=count[0],
    )


def iter_frames(
    data: bytes, plan: VideoPlan, limits: VideoLimits, count: list[int] | None = None
) -> Iterator[np.ndarray]:
    """The sampled frames, one (H, W, 3) uint8 RGB array at a time, in order. The first decoded frame's size
    (the bitstream's, which a container can misstate) is checked against `max_pixels` and the decode budget
    before any other is decoded; a later frame of another size is refused (no resolution changes mid-stream).
    `count[0]` counts the frames the decoder produced."""
    with _open(data, plan.index.container) as handle:
        _discard_others(handle, handle.streams.video[0])
        size = None
        for frame in _decode(handle, plan.index, list(plan.wanted), list(plan.seeks), limits, count or [0]):
            if size is None:
                size = (frame.width, frame.height)
                check_decode_cost(plan, *size, limits)
            elif (frame.width, frame.height) != size:
                raise InvalidMediaError(
                    f"a frame is {frame.width}x{frame.height}, the first was {size[0]}x{size[1]}",
                    reason=Reason.UNDECODABLE,
                )
            yield frame.to_ndarray(format="rgb24")


def _decode(handle, index: VideoIndex, wanted: list[int], seeks: list[bool], limits: VideoLimits, count: list[int]):
    """The sampled frames as PyAV frames, one at a time (nothing converted or kept here).

    With timestamps and one decoder thread, a packet that is not a sampled frame is decoded with
    skip_frame=NONREF: a frame no other frame refers to (most B-frames) is then not decoded at all, which the
    sampled frames never notice (measured in docs/benchmarks/video.md)."""
    import av

    stream = handle.streams.video[0]
    codec = stream.codec_context
    codec.thread_count = limits.decode_threads
    skip = index.pts is not None and limits.decode_threads == 1
    sampled_pts = {index.pts[i] for i in wanted} if skip else set()

    def frames():
        for packet in handle.demux(stream):
            if skip:
                codec.skip_frame = "DEFAULT" if packet.pts in sampled_pts or packet.pts is None else "NONREF"
            yield from codec.decode(packet)  # the flush packet (size 0) at the end drains the decoder

    deadline = time.thread_time() + limits.decode_cpu_s
    ordinal = -1  # frame number of the last one decoded (counted when there are no pts)
    decoded = frames()
    try:
        for target, seek in zip(wanted, seeks, strict=True):
            if seek:
                handle.seek(index.pts[target], stream=stream, backward=True, any_frame=False)  # flushes the decoder
                decoded = frames()
            while True:
                frame = next(decoded, None)
                if frame is None:
                    raise InvalidMediaError(
                        f"the stream ends before frame {target} of {index.num_frames}", reason=Reason.TRUNCATED
                    )
                ordinal += 1
                count[0] += 1
                if time.thread_time() > deadline:
                    raise InvalidMediaError(
                        f"decoding used more than {limits.decode_cpu_s} s of CPU time", reason=Reason.DECODE_TIME
                    )
                if index.pts is None:
                    hit = ordinal == target
                else:
                    stamp = frame.pts if frame.pts is not None else frame.dts
                    if seek and stamp is not None and stamp > index.pts[target]:
                        # The demuxer seeked past the target (an index without that keyframe): start over.
                        handle.seek(0, stream=stream, backward=True, any_frame=False)
                        decoded, seek = frames(), False
                        continue
                    hit = stamp is not None and stamp >= index.pts[target]
                seek = False
                if hit:
                    yield frame
                    break
    except av.FFmpegError as exc:
        raise _damaged("the video stream", exc) from None
