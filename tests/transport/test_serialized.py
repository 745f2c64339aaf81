"""Serialized transport: raw bytes round trip for every dtype, with strict size checks."""

from __future__ import annotations

import pytest
import torch

from mmproc.transport.serialized.staging import bytes_to_tensor, stage_to_host, tensor_bytes_view, tensor_to_bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_is_bit_exact(dtype: torch.dtype) -> None:
    tensor = torch.randn(37, 96, generator=torch.Generator().manual_seed(0)).to(dtype)
    (host,) = stage_to_host([tensor])
    data = tensor_to_bytes(host)
    assert len(data) == tensor.numel() * tensor.element_size()
    back = bytes_to_tensor(data, str(dtype).removeprefix("torch."), (37, 96))
    assert back.dtype == dtype
    assert torch.equal(back.view(torch.uint8), tensor.view(torch.uint8))  # bit for bit, NaN-safe
    back[0, 0] = 1  # the result is writable and owns its memory


def test_non_contiguous_rows_serialize_as_row_major() -> None:
    base = torch.arange(24, dtype=torch.float32).view(4, 6)
    view = base[:, ::2]
    assert bytes_to_tensor(tensor_to_bytes(view), "float32", (4, 3)).tolist() == view.tolist()


def test_bytes_view_is_the_tensors_own_memory() -> None:
    tensor = torch.randn(5, 4).bfloat16()
    view = tensor_bytes_view(tensor)
    assert (view.ndim, view.format, view.nbytes) == (1, "B", 40) and view.tobytes() == tensor_to_bytes(tensor)
    tensor[0, 0] = 7  # no copy: the view sees the tensor's memory
    assert view[:2].tobytes() == tensor[0, :1].view(torch.uint8).numpy().tobytes()
    assert tensor_bytes_view(torch.empty(0, 4)).nbytes == 0


def test_size_mismatch_and_unknown_dtype_are_refused() -> None:
    data = tensor_to_bytes(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="needs"):
        bytes_to_tensor(data, "float32", (2, 4))
    with pytest.raises(ValueError, match="unknown dtype"):
        bytes_to_tensor(data, "float64", (2, 3))
