"""Hand-off of embeddings to the consumer: serialized raw bytes (here) or a CUDA IPC pool (ipc)."""

from mmproc.transport.serialized import (
    DTYPE_NAMES,
    bytes_to_tensor,
    stage_to_host,
    tensor_bytes_view,
    tensor_nbytes,
    tensor_to_bytes,
)

__all__ = ["DTYPE_NAMES", "bytes_to_tensor", "stage_to_host", "tensor_bytes_view", "tensor_nbytes", "tensor_to_bytes"]
