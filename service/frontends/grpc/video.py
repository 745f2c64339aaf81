"""The gRPC EncodeVideos method, mixed into `grpc_server.GrpcServicer` (same deadline rule, transports and
error mapping as EncodeImages)."""

from __future__ import annotations

import time
import uuid

import grpc

from mmproc.errors import InvalidRequestError, Reason
from mmproc.priority import PRIORITY_HEADER, is_batch
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.results import payload_bytes
from service.frontends.grpc.observe import call_metadata
from service.frontends.replies_video import all_chunks, in_memory_video_reply, serialized_video_reply, video_items
from service.pipeline.videos import VideoPipeline


def video_pipeline(pipeline) -> VideoPipeline:
    """The pipeline's video path; INVALID_ARGUMENT for a model that takes no video."""
    videos = getattr(pipeline, "videos", None)
    if videos is None:
        raise InvalidRequestError(f"model {pipeline.encoder.config.name} takes no video", reason=Reason.BAD_REQUEST)
    return videos


class VideoServicerMixin:
    async def EncodeVideos(
        self, request: pb.EncodeVideosRequest, context: grpc.aio.ServicerContext
    ) -> pb.EncodeVideosResponse | None:
        try:
            request_id = request.request_id or uuid.uuid4().hex[:16]
            remaining = context.time_remaining()
            deadline = time.monotonic() + (self._default_deadline_s if remaining is None else remaining)
            pipeline = self._pipeline
            via = pipeline.transports.via(request.transport, "", request.consumer.session_id)
            pipeline.check_door(sheddable=is_batch(call_metadata(context, PRIORITY_HEADER)))
            videos = await self._at_home(
                video_pipeline(pipeline).encode(
                    video_items(request),
                    request_id,
                    deadline,
                    via=via,
                    readers=request.readers if request.HasField("readers") else 1,
                )
            )
            chunks = all_chunks(videos)
            in_memory = in_memory_video_reply(pipeline.transports, request_id, videos)
            if in_memory is not None:
                return in_memory
            size = payload_bytes(chunks)
            if size > self._info.max_message_bytes - 64 * 1024:  # before staging: nothing copied for a refusal
                raise InvalidRequestError(
                    f"reply of {size} bytes exceeds the {self._info.max_message_bytes}-byte message cap; "
                    "send fewer videos per request, sample fewer frames or use the IPC transport",
                    reason=Reason.TOO_MANY_FRAMES,
                )
            payloads = await self._serialize(chunks, deadline)
            return serialized_video_reply(request_id, videos, payloads)
        except Exception as exc:  # every failure leaves through the one mapping
            self._fail(context, request, exc)
            return None
