"""Videos from the Python client: `VideoEmbedding`s, over CUDA IPC (one lease per request) or serialized."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mmproc.client.ipc import IpcClient, clone_views
from mmproc.client.rpc import embedding_from_bytes
from mmproc.prompt import timestamp_text
from mmproc.v1 import encoder_pb2 as pb


@dataclass(frozen=True)
class VideoChunkEmbedding:
    """One chunk: tensor (num_tokens, hidden) on the client's device; grid_thw (frames, h, w) in patches;
    timestamp_s: its first frame's time (the prompt's HH:MM:SS.mmm, `timestamp_text`)."""

    tensor: torch.Tensor
    num_tokens: int
    grid_thw: tuple[int, int, int]
    timestamp_s: float

    @property
    def timestamp(self) -> str:
        return timestamp_text(self.timestamp_s)


@dataclass(frozen=True)
class VideoEmbedding:
    """One video: its chunks in order, token count, sampled frame numbers, fps and frame (width, height)."""

    chunks: tuple[VideoChunkEmbedding, ...]
    num_tokens: int
    frame_indices: tuple[int, ...]
    fps: float
    size: tuple[int, int]


@dataclass(frozen=True)
class VideoInput:
    """A video with sampling overrides; a plain `bytes` item means the server's defaults."""

    data: bytes
    fps: float | None = None
    num_frames: int | None = None


def make_video_request(
    videos: Sequence[bytes | VideoInput], request_id: str | None, transport: int = pb.TRANSPORT_SERIALIZED
) -> pb.EncodeVideosRequest:
    request = pb.EncodeVideosRequest(request_id=request_id or uuid.uuid4().hex[:16], transport=transport)
    for video in videos:
        item = video if isinstance(video, VideoInput) else VideoInput(bytes(video))
        message = request.videos.add(data=item.data)
        if item.fps is not None:
            message.fps = item.fps
        if item.num_frames is not None:
            message.num_frames = item.num_frames
    return request


def from_reply(reply: pb.EncodeVideosResponse, tensors: list[torch.Tensor]) -> list[VideoEmbedding]:
    out, at = [], 0
    for video in reply.videos:
        chunks = []
        for chunk in video.chunks:
            emb = chunk.embedding
            grid = (emb.grid_t or 1, emb.grid_h, emb.grid_w)
            chunks.append(VideoChunkEmbedding(tensors[at], emb.num_tokens, grid, chunk.timestamp_s))
            at += 1
        out.append(
            VideoEmbedding(
                tuple(chunks), video.num_tokens, tuple(video.frame_indices), video.fps, (video.width, video.height)
            )
        )
    return out


def chunk_headers(reply: pb.EncodeVideosResponse) -> list[pb.Embedding]:
    return [chunk.embedding for video in reply.videos for chunk in video.chunks]


def read_serialized(reply: pb.EncodeVideosResponse, device: torch.device) -> list[VideoEmbedding]:
    return from_reply(reply, [embedding_from_bytes(emb, device) for emb in chunk_headers(reply)])


def encode_over_ipc(
    ipc: IpcClient, request: pb.EncodeVideosRequest, device: torch.device, timeout: float
) -> list[VideoEmbedding] | None:
    """One EncodeVideos call into the server's pool; None without a session or a mapping (then serialized)."""
    session = ipc._session()
    if session is None:
        return None
    request.transport = pb.TRANSPORT_IPC
    request.consumer.CopyFrom(pb.ConsumerInfo(session_id=session, device_uuid=ipc._uuid))
    reply = ipc._stub.EncodeVideos(request, timeout=timeout)
    if reply.transport != pb.TRANSPORT_IPC:  # the pool was full: the server replied with bytes
        return read_serialized(reply, device)
    with ipc.read(pb.EncodeImagesResponse(embeddings=chunk_headers(reply)), timeout) as views:
        return None if views is None else from_reply(reply, clone_views(views))
