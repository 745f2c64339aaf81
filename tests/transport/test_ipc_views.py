"""The consumer's views into an opened pool and the copy `encode_images` makes of them, on CPU memory standing in
for the mapped pool (the real pool: tests/transport/test_ipc_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from mmproc.client.ipc import clone_views
from mmproc.errors import InternalError
from mmproc.transport.cuda_ipc.consumer import TypedViews

HIDDEN = 8


def pool_with_images(rows: list[int], dtype: torch.dtype = torch.bfloat16, start: int = 256):
    """A flat uint8 'pool' with images of `rows` x HIDDEN written back to back from byte `start`, as the server
    lays out one request's lease; returns the memory, the images and their (offset, nbytes)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    memory = torch.zeros(start + sum(rows) * HIDDEN * itemsize + 512, dtype=torch.uint8)
    images, places, offset = [], [], start
    for i, n in enumerate(rows):
        image = (torch.arange(n * HIDDEN, dtype=torch.float32).view(n, HIDDEN) + 1000 * i).to(dtype)
        nbytes = image.numel() * itemsize
        memory[offset : offset + nbytes] = image.view(-1).view(torch.uint8)
        images.append(image)
        places.append((offset, nbytes))
        offset += nbytes
    return memory, images, places


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_views_read_each_image_in_place(dtype: torch.dtype) -> None:
    memory, images, places = pool_with_images([3, 1, 5], dtype)
    views = TypedViews(memory)
    got = [views.view(off, n, dtype, tuple(img.shape)) for (off, n), img in zip(places, images)]
    for view, image in zip(got, images):
        assert view.dtype == dtype and view.is_contiguous() and torch.equal(view, image)
    memory[places[1][0] : places[1][0] + places[1][1]] = 0  # zero copy: the view sees the pool change
    assert not got[1].any()


def test_views_refuse_descriptors_that_do_not_fit() -> None:
    memory, images, places = pool_with_images([2])
    views = TypedViews(memory)
    (offset, nbytes), shape = places[0], tuple(images[0].shape)
    with pytest.raises(InternalError, match="does not hold"):
        views.view(offset + 1, nbytes, torch.bfloat16, shape)  # not aligned to the dtype
    with pytest.raises(InternalError, match="does not hold"):
        views.view(offset, nbytes - 2, torch.bfloat16, shape)  # nbytes disagrees with the shape
    with pytest.raises(RuntimeError, match="out of bounds|storage"):
        views.view(memory.numel() - 16, 32, torch.bfloat16, (2, HIDDEN))  # past the end of the pool


def test_clone_of_back_to_back_views_is_one_copy_with_the_same_values() -> None:
    memory, images, places = pool_with_images([3, 1, 5])
    views = TypedViews(memory)
    got = clone_views([views.view(off, n, torch.bfloat16, tuple(img.shape)) for (off, n), img in zip(places, images)])
    assert [tuple(t.shape) for t in got] == [(3, HIDDEN), (1, HIDDEN), (5, HIDDEN)]
    assert all(torch.equal(t, image) for t, image in zip(got, images))
    assert len({t.untyped_storage().data_ptr() for t in got}) == 1  # one new tensor, split per image
    memory.zero_()  # a copy: the pool can be reused at once
    assert all(torch.equal(t, image) for t, image in zip(got, images))


def test_clone_of_scattered_views_copies_each() -> None:
    memory, images, places = pool_with_images([2, 2])
    views = TypedViews(memory)
    first = views.view(*places[0], torch.bfloat16, (2, HIDDEN))
    second = views.view(*places[1], torch.bfloat16, (2, HIDDEN))
    got = clone_views([second, first])  # not in pool order: not one span
    assert torch.equal(got[0], images[1]) and torch.equal(got[1], images[0])
    assert got[0].untyped_storage().data_ptr() != got[1].untyped_storage().data_ptr()
    single = clone_views([first])
    assert torch.equal(single[0], images[0]) and single[0].data_ptr() != first.data_ptr()


def test_clone_of_separate_tensors_that_lie_back_to_back_copies_each() -> None:
    # A serialized fallback gives separate tensors; an allocator may place them back to back in memory. They are
    # not one mapping: copying their span would read past the first one's storage.
    memory = bytearray(torch.arange(64, dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes())
    first = torch.frombuffer(memoryview(memory)[:64], dtype=torch.bfloat16).view(4, HIDDEN)
    second = torch.frombuffer(memoryview(memory)[64:], dtype=torch.bfloat16).view(4, HIDDEN)
    assert second.data_ptr() == first.data_ptr() + first.nbytes  # adjacent, yet two storages
    got = clone_views([first, second])
    assert torch.equal(got[0], first) and torch.equal(got[1], second)
