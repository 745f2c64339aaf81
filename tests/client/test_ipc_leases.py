"""A reply whose images lie in several leases (embedding-cache hits next to fresh encodes): the consumer waits on
and acks every lease's own words, once each. (The device side runs in tests/transport/test_ipc_cache_gpu.py.)"""

from __future__ import annotations

from mmproc.client.ipc import request_leases
from mmproc.v1 import encoder_pb2 as pb


def embedding(lease_id: int, generation: int, slot: int, offset: int) -> pb.Embedding:
    ipc = pb.IpcDescriptor(lease_id=lease_id, generation=generation, offset_bytes=offset, nbytes=512,
                           ready_offset_bytes=16 * slot, ack_offset_bytes=16 * slot + 8, readers=1,
                           reader_ack_offset_bytes=[16 * slot + 8])  # fmt: skip
    return pb.Embedding(ipc=ipc)


def test_every_lease_of_a_mixed_reply_is_waited_on_and_acked_once() -> None:
    # images 0 and 2: hits, each in a lease of its own on a cached slice; 1 and 3: this request's one fresh lease
    reply = [embedding(7, 3, 5, 4096), embedding(9, 1, 2, 8192), embedding(8, 4, 6, 4096), embedding(9, 1, 2, 8704)]
    leases, ids = request_leases(reply)
    assert ids == [7, 8, 9]
    assert [(d.lease_id, d.generation, d.ready_offset, d.ack_offsets) for d in leases] == [
        (7, 3, 80, (88,)),
        (9, 1, 32, (40,)),
        (8, 4, 96, (104,)),
    ]


def test_a_one_lease_reply_still_names_one_lease() -> None:
    leases, ids = request_leases([embedding(4, 2, 1, 0), embedding(4, 2, 1, 512)])
    assert ids == [4] and len(leases) == 1 and leases[0].offset == 0
