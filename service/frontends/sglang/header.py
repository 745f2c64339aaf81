"""Frame 0 of a push: the `EmbeddingData` header SGLang 0.5.23 reads with its allow-listed unpickler.

SGLang's receiver (srt/disaggregation/encoder/receiver.py) loads the frame with `safe_pickle_loads`, which only
admits named globals, among them `sglang.srt.disaggregation.encoder.receiver.EmbeddingData`,
`sglang.srt.multimodal.modality.Modality` and torch's dtypes. mmproc does not import SGLang, so the pickle is
written opcode by opcode (protocol 2): the class by name, an empty instance (`__new__`, no `__init__`), then its
`__dict__`, the state SGLang's own `copy_without_embedding()` pickles. tests/engines/test_sglang_epd.py loads it
with SGLang's unpickler.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

EMBEDDING_DATA = ("sglang.srt.disaggregation.encoder.receiver", "EmbeddingData")
MODALITY = ("sglang.srt.multimodal.modality", "Modality")
MODALITY_VALUES = {"IMAGE": 1, "VIDEO": 2, "AUDIO": 3}  # enum.auto() order of SGLang's Modality


@dataclass(frozen=True)
class PartHeader:
    """What one part (one /encode call) says about its rows; `grids` are [t, h, w] in patches before the merge."""

    req_id: str
    num_parts: int
    part_idx: int
    modality: str = "IMAGE"
    grids: Sequence[Sequence[int]] = ()
    shape: Sequence[int] = ()  # (rows, hidden) of frame 1
    dtype: torch.dtype | None = None
    original_image_sizes: Sequence[Sequence[int]] | None = None  # [[w, h], ...] (K3's framing needs them)
    error_msg: str | None = None
    error_code: int | None = None


def _global(module_name: tuple[str, str]) -> bytes:
    module, name = module_name
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _plain(value: object) -> bytes:
    """A plain value (str, int, float, None, nested lists, a torch dtype) as protocol-2 opcodes without PROTO/STOP.

    Memo puts are left in: nothing here reads them back, and an index a later value reuses just overwrites it."""
    return pickle.dumps(value, protocol=2)[2:-1]


def _modality(name: str) -> bytes:
    # Modality(1): the class, a 1-tuple of its value, REDUCE
    return _global(MODALITY) + _plain(MODALITY_VALUES[name]) + b"\x85" + b"R"


def encode_header(header: PartHeader, send_time: float | None = None) -> bytes:
    """The pickled EmbeddingData for `header` (protocol 2); an error header has no grid, shape or dtype."""
    state: list[tuple[str, bytes]] = [
        ("req_id", _plain(header.req_id)),
        ("num_parts", _plain(header.num_parts)),
        ("part_idx", _plain(header.part_idx)),
        ("grid_dim", _plain([list(map(int, g)) for g in header.grids] if header.grids else None)),
        ("modality", _modality(header.modality)),
        ("embedding", _plain(None)),
        ("send_time", _plain(time.time() if send_time is None else send_time)),
        ("dtype", _plain(header.dtype)),
        ("shape", _plain(list(map(int, header.shape)) if header.shape else None)),
        ("error_msg", _plain(header.error_msg)),
        ("error_code", _plain(None if header.error_code is None else int(header.error_code))),
    ]
    if header.original_image_sizes is not None:
        sizes = [[int(w), int(h)] for w, h in header.original_image_sizes]
        state.append(("original_image_sizes", _plain(sizes)))
    items = b"".join(_plain(key) + value for key, value in state)
    # PROTO 2, cls, (), NEWOBJ, {}, MARK, k v ..., SETITEMS, BUILD, STOP
    return b"\x80\x02" + _global(EMBEDDING_DATA) + b")\x81" + b"}(" + items + b"u" + b"b."
