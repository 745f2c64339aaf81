"""The consumer API an LLM worker imports.

    from mmproc.client import EncoderClient
    from mmproc.errors import InvalidMediaError
    with EncoderClient("127.0.0.1:50051", device="cuda:0") as client:
        embeddings = client.encode_images([jpeg_bytes, png_bytes])  # list[Tensor (tokens_i, hidden)]

`AsyncEncoderClient` is the same for asyncio. Errors are typed (mmproc.errors): InvalidMediaError (a ValueError
with .index, .reason; InvalidRequestError when the request itself is at fault), ResourceExhaustedError,
UnavailableError, DeadlineExceededError, InternalError.

Several servers: a list of targets, or one name resolving to several ("dns:///mmproc-pool:50051"). UNAVAILABLE is
retried on the next target with backoff within the call's timeout (`RetryPolicy`; `retry=NO_RETRY` turns it off).
Videos: `encode_videos`; tensor-parallel engines: `encode_images_shared` and `read_shared`.
"""

from mmproc.client.aio import AsyncEncoderClient
from mmproc.client.blocking import EncoderClient
from mmproc.client.results import ImageEmbedding
from mmproc.client.retry import NO_RETRY, RetryPolicy
from mmproc.client.rpc import error_from_rpc
from mmproc.client.shared_embeddings import SharedEmbeddings
from mmproc.client.video import VideoChunkEmbedding, VideoEmbedding, VideoInput

__all__ = [
    "NO_RETRY",
    "AsyncEncoderClient",
    "EncoderClient",
    "ImageEmbedding",
    "RetryPolicy",
    "SharedEmbeddings",
    "VideoChunkEmbedding",
    "VideoEmbedding",
    "VideoInput",
    "error_from_rpc",
]
