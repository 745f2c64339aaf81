"""The delivery step: where a request's embeddings go, chosen once per request. Serialized: within the reply byte
budget; another transport: its producer's destination, falling back to serialized or refused, as configured."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import torch

from mmproc.errors import DeadlineExceededError, ResourceExhaustedError
from mmproc.transport.producer import Destination, Producer
from mmproc.transport.serialized.destination import SerializedDestination
from mmproc.transport.serialized.pinned_messages import PinnedMessages
from mmproc.types import PreprocessedImage
from mmproc.wire.results import SERIALIZED, EncodedImage
from mmproc.wire.transports import Via
from service.observe.metrics import Metrics
from service.pipeline.reply_budget import ReplyBudget, ReplyBudgetConfig, ReplyHold

logger = logging.getLogger(__name__)


class Delivery:
    """The pipeline's transport seam; `producers`: the transports started besides serialized."""

    def __init__(
        self, hidden: int, dtype: torch.dtype, metrics: Metrics, replies: ReplyBudgetConfig | None = None
    ) -> None:
        self.hidden = hidden
        self.dtype = dtype
        self._metrics = metrics
        replies = replies or ReplyBudgetConfig()
        self.replies = ReplyBudget(replies)
        metrics.reply_bytes_in_flight.set_function(lambda: self.replies.in_flight)
        self.pinned = PinnedMessages(replies.pinned_bytes) if replies.pinned_bytes else None
        metrics.track_pinned_replies(self.pinned)
        self.producers: dict[str, Producer] = {}
        self.fallback = True
        self.fallbacks = 0

    def attach(self, producer: Producer, *, fallback: bool) -> None:
        """Serve requests for `producer.transport` (fallback: serialized rather than RESOURCE_EXHAUSTED)."""
        self.producers[producer.transport] = producer
        self.fallback = fallback

    @property
    def transports(self) -> list[str]:
        """The transports this server serves now, serialized last."""
        return [*self.producers, SERIALIZED]

    def close(self) -> None:
        if self.pinned is not None:
            self.pinned.close()
        for producer in self.producers.values():
            producer.close()

    async def destination(self, via: Via, rows: int, deadline: float | None, readers: int) -> Destination:
        """A destination of `rows` rows as `via` asks, or serialized for a transport this server does not serve."""
        producer = self.producers.get(via.transport) if via.session is not None else None
        if producer is None or via.session is None:
            return SerializedDestination()
        destination = await producer.destination(via.session, rows, deadline, readers)
        if destination is None:
            self._full(via.transport, rows * self.hidden * self.dtype.itemsize)
            return SerializedDestination()
        return destination

    def _full(self, transport: str, nbytes: int) -> None:
        """`transport` found no room in time: count the fallback, or refuse (RESOURCE_EXHAUSTED)."""
        if not self.fallback:
            raise ResourceExhaustedError(f"{transport} pool full: no {nbytes}-byte slice freed in time")
        self.fallbacks += 1
        self._metrics.ipc_fallbacks.inc()
        if self.fallbacks == 1:
            logger.warning("%s pool full past the wait: replying serialized (counted in fallbacks; logged once)",
                           transport)  # fmt: skip

    async def reply_bytes(self, nbytes: int, deadline: float | None, images: int) -> ReplyHold:
        """Budget for a serialized reply, taken before staging; past the deadline, DeadlineExceededError (its
        `images` then count as dropped at delivery)."""
        try:
            return await self.replies.acquire(nbytes, deadline)
        except (DeadlineExceededError, asyncio.CancelledError):
            self._metrics.dropped_images.labels("delivery").inc(images)  # as forward_step.count_dropped
            raise


def delivered(
    destination: Destination, prepared: Sequence[PreprocessedImage], embeddings: Sequence[torch.Tensor]
) -> list[EncodedImage]:
    """Each image's result, with the handle its destination gave it (None: serialized)."""
    handles = destination.deliver([p.num_tokens for p in prepared])
    return [
        EncodedImage(i, p.grid_hw, p.num_tokens, e, p.image_size, handle=h)
        for i, (p, e, h) in enumerate(zip(prepared, embeddings, handles, strict=True))
    ]
