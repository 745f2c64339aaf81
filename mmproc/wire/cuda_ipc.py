"""The CUDA IPC transport on the wire: its server start-up, slice descriptors and the pool's identity."""

from __future__ import annotations

from mmproc.transport.cuda_ipc import runtime
from mmproc.transport.cuda_ipc.config import PoolConfig
from mmproc.transport.cuda_ipc.destination import NAME, IpcProducer, PoolSlice

__all__ = ["NAME", "describe", "descriptor_from_pb", "identity_from_pb", "pool_info_pb", "start_producer"]
from mmproc.transport.cuda_ipc.pool import IpcPool, PoolIdentity, SliceDescriptor
from mmproc.transport.cuda_ipc.probe import probe_pool
from mmproc.transport.producer import StartContext
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


def describe(header: pb.Embedding, handle: PoolSlice) -> None:
    """One result's slice in its reply header."""
    desc, pool = handle.descriptor, handle.pool
    header.ipc.CopyFrom(
        pb.IpcDescriptor(
            pool_id=pool.pool_id,
            epoch=pool.epoch,
            device_uuid=pool.device_uuid,
            lease_id=desc.lease_id,
            generation=desc.generation,
            offset_bytes=desc.offset,
            nbytes=desc.nbytes,
            ready_offset_bytes=desc.ready_offset,
            ack_offset_bytes=desc.ack_offset,
            readers=desc.readers,
            reader_ack_offset_bytes=desc.ack_offsets,
        )
    )


def start_producer(context: StartContext) -> IpcProducer | str:
    """The pool on the encoder's GPU, probed from a child process; or why IPC cannot work here."""
    if context.device.type != "cuda":
        return "the encoder runs on the CPU"
    reason = runtime.ipc_unavailable_reason()
    if reason is not None:
        return reason
    config = context.configs[NAME]
    assert isinstance(config, PoolConfig)
    pool = IpcPool(context.device, config)
    reason = probe_pool(pool)
    if reason is not None:
        pool.close()
        return f"probe failed: {reason}"
    return IpcProducer(pool, context.hidden, context.dtype)
