"""Video results <-> protobuf and JSON, over the image replies (mmproc/wire): a chunk is an Embedding."""

from __future__ import annotations

import base64
import hashlib

from mmproc.transport.serialized.staging import DTYPE_NAMES
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.results import EncodedImage, embedding_header
from mmproc.wire.transports import Table
from service.pipeline.videos import EncodedVideo, VideoItem


def video_items(request: pb.EncodeVideosRequest) -> list[VideoItem]:
    return [
        VideoItem(
            video.data,
            fps=video.fps if video.HasField("fps") else None,
            num_frames=video.num_frames if video.HasField("num_frames") else None,
        )
        for video in request.videos
    ]


def all_chunks(videos: list[EncodedVideo]) -> list[EncodedImage]:
    return [chunk for video in videos for chunk in video.chunks]


def _chunk_headers(videos: list[EncodedVideo], headers: list[pb.Embedding]) -> pb.EncodeVideosResponse:
    reply = pb.EncodeVideosResponse()
    at = 0
    for video in videos:
        out = reply.videos.add(
            index=video.index,
            num_tokens=video.num_tokens,
            frame_indices=list(video.indices),
            fps=video.fps,
            width=video.size[0],
            height=video.size[1],
        )
        for frames, stamp in zip(video.frames, video.timestamps, strict=True):
            header = headers[at]
            header.grid_t = frames
            out.chunks.add(embedding=header, timestamp_s=stamp)
            at += 1
    return reply


def serialized_video_reply(
    request_id: str, videos: list[EncodedVideo], payloads: list[bytes]
) -> pb.EncodeVideosResponse:
    headers = []
    for chunk, data in zip(all_chunks(videos), payloads, strict=True):
        header = embedding_header(chunk)
        header.data = data
        headers.append(header)
    reply = _chunk_headers(videos, headers)
    reply.request_id, reply.transport = request_id, pb.TRANSPORT_SERIALIZED
    return reply


def in_memory_video_reply(
    transports: Table, request_id: str, videos: list[EncodedVideo]
) -> pb.EncodeVideosResponse | None:
    """The reply of chunks that lie in a transport's memory, or None when their bytes travel in the reply."""
    images = transports.reply(request_id, all_chunks(videos))
    if images is None:
        return None
    reply = _chunk_headers(videos, list(images.embeddings))
    reply.request_id, reply.transport = request_id, images.transport
    return reply


def video_json(video: EncodedVideo, payloads: list[bytes], with_data: bool) -> dict[str, object]:
    chunks = []
    for chunk, frames, stamp, data in zip(video.chunks, video.frames, video.timestamps, payloads, strict=True):
        item: dict[str, object] = {
            "index": chunk.index,
            "timestamp_s": stamp,
            "num_tokens": chunk.num_tokens,
            "grid_thw": [frames, *chunk.grid_hw],
            "shape": list(chunk.embedding.shape),
            "dtype": DTYPE_NAMES[chunk.embedding.dtype],
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        if with_data:
            item["data"] = base64.b64encode(data).decode("ascii")
        chunks.append(item)
    return {
        "index": video.index,
        "num_tokens": video.num_tokens,
        "frame_indices": list(video.indices),
        "fps": video.fps,
        "size": list(video.size),
        "chunks": chunks,
    }
