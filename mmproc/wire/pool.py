"""The IPC pool's identity on the wire: what a consumer needs to open the pool (the server's Session reply; a
shared batch names it too)."""

from __future__ import annotations

from mmproc.transport.cuda_ipc.pool import PoolIdentity, SliceDescriptor
from mmproc.v1 import encoder_pb2 as pb


def pool_info_pb(identity: PoolIdentity) -> pb.PoolInfo:
    return pb.PoolInfo(
        pool_id=identity.pool_id,
        epoch=identity.epoch,
        device_uuid=identity.device_uuid,
        ipc_handle=identity.ipc_handle,
        pool_bytes=identity.pool_bytes,
        num_word_slots=identity.num_word_slots,
    )


def identity_from_pb(info: pb.PoolInfo) -> PoolIdentity:
    return PoolIdentity(
        pool_id=info.pool_id,
        epoch=info.epoch,
        device_uuid=info.device_uuid,
        ipc_handle=info.ipc_handle,
        pool_bytes=info.pool_bytes,
        num_word_slots=info.num_word_slots,
        data_offset=0,
    )


def descriptor_from_pb(ipc: pb.IpcDescriptor) -> SliceDescriptor:
    """The consumer's view of one IPC descriptor; a server without fan-out sends one ack word only."""
    acks = tuple(ipc.reader_ack_offset_bytes) or (ipc.ack_offset_bytes,)
    return SliceDescriptor(
        lease_id=ipc.lease_id,
        generation=ipc.generation,
        offset=ipc.offset_bytes,
        nbytes=ipc.nbytes,
        ready_offset=ipc.ready_offset_bytes,
        ack_offsets=acks,
    )
