"""Embedding dtypes on the wire: the proto's DType for each name of mmproc.transport.DTYPE_NAMES (the one table)."""

from __future__ import annotations

import torch

from mmproc.transport.serialized.staging import DTYPE_NAMES
from mmproc.v1 import encoder_pb2 as pb

NAME_TO_PB: dict[str, int] = {name: pb.DType.Value(f"DTYPE_{name.upper()}") for name in DTYPE_NAMES.values()}
PB_TO_NAME: dict[int, str] = {code: name for name, code in NAME_TO_PB.items()}
PB_TO_DTYPE: dict[int, torch.dtype] = {NAME_TO_PB[name]: dtype for dtype, name in DTYPE_NAMES.items()}
