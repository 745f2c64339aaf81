"""Hand-off of embeddings to the consumer: serialized raw bytes (here) or a CUDA IPC pool (ipc)."""

from mmproc.transport.host_copy import concat_bytes, new_bytes
from mmproc.transport.serialized import (
    DTYPE_NAMES,
    StagedTensor,
    bytes_to_tensor,
    stage_to_host,
    start_staging,
    tensor_bytes_view,
    tensor_nbytes,
    tensor_to_bytes,
)

__all__ = [
    "DTYPE_NAMES",
    "StagedTensor",
    "bytes_to_tensor",
    "concat_bytes",
    "new_bytes",
    "stage_to_host",
    "start_staging",
    "tensor_bytes_view",
    "tensor_nbytes",
    "tensor_to_bytes",
]
