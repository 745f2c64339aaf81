"""The consumer API an LLM worker imports.

    from mmproc.client import EncoderClient
    from mmproc.errors import InvalidMediaError
    with EncoderClient("127.0.0.1:50051", device="cuda:0") as client:
        embeddings = client.encode_images([jpeg_bytes, png_bytes])  # list[Tensor (tokens_i, hidden)]

`AsyncEncoderClient` is the same for asyncio code. Server errors come back typed: InvalidMediaError
(a ValueError with .index, .reason, .http_status == 400; its subclass InvalidRequestError when the request itself is
at fault: too many images, bad keys or readers, ...), ResourceExhaustedError, UnavailableError,
DeadlineExceededError, InternalError. Serialized replies are received as a stream of chunks, so replies
larger than one gRPC message still arrive.

Several servers: pass a list of targets (calls rotate over them) or one name that resolves to several
addresses, e.g. "dns:///mmproc-pool:50051" (gRPC's round_robin policy spreads calls over all of them).
UNAVAILABLE is retried — on the next target — with exponential backoff and jitter within the call's
timeout; INVALID_ARGUMENT never is. See `mmproc.client.retry.RetryPolicy` (`retry=NO_RETRY` turns it off).

Videos (Kimi K2.5): `client.encode_videos([mp4_bytes, VideoInput(webm_bytes, fps=1.0)])` -> `VideoEmbedding`s, one
tensor per chunk of frames with its grid and timestamp (mmproc.client.video).

Tensor-parallel engines: rank 0 calls `encode_images_shared(images, readers=tp)`, broadcasts
`shared.to_bytes()`, and every rank reads with `read_shared(shared, rank)` (see mmproc.client.shared_embeddings).
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
