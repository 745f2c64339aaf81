"""Hand-off of embeddings to the consumer: serialized raw bytes (here) or a CUDA IPC pool (ipc)."""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

# Imported on first use: these need torch, and the settings take their defaults from torch-free modules of this
# package (pool_config).
_HOME = {name: "host_copy" if name in ("concat_bytes", "new_bytes") else "serialized" for name in __all__}


def __getattr__(name: str) -> object:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"mmproc.transport.{_HOME[name]}"), name)
