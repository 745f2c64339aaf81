"""A NIXL consumer in a process of its own (tests/transport/test_nixl.py): one JSON line per event on stdout,
commands on stdin. Modes: compare, hold, restart, hostile, slow, auto, keys."""

from __future__ import annotations

import json
import sys
import time

import torch

from mmproc.client import EncoderClient
from mmproc.client.nixl import ReadRefusedError
from mmproc.client.nixl_reader import NixlReader
from mmproc.transport.nixl.messages import Handle, ReadAsk
from tests.support.media_samples import make_image_bytes

SIZES = [(64, 48), (96, 80), (33, 129), (200, 150)]


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


def images(count: int = len(SIZES)) -> list[bytes]:
    return [make_image_bytes(w, h, fmt="PNG", seed=i) for i, (w, h) in enumerate(SIZES[:count])]


def nixl_client(target: str, device: str = "cpu") -> tuple[EncoderClient, NixlReader]:
    client = EncoderClient(target, transport="nixl", device=device)
    reader = client._reader
    assert isinstance(reader, NixlReader), f"no NIXL reader: {type(reader).__name__}"
    return client, reader


def refused(reader: NixlReader, ask: ReadAsk) -> str:
    """Send `ask` up the session and wait for its answer: the refusal's reason, or 'read' if it was served."""
    session = reader.session
    session.send(ask)
    try:
        session._wait([ask.tag], time.monotonic() + 10)
    except ReadRefusedError as exc:
        return str(exc)
    return "read"


def compare(target: str, device: str = "cpu") -> None:
    """NIXL's embeddings against serialized ones, on `device` (cuda:N: read into GPU memory)."""
    with EncoderClient(target, transport="serialized", device=device) as plain:
        want = plain.encode_images(images())
    client, reader = nixl_client(target, device)
    got = client.encode_images(images())
    arena = reader.session.arena
    equal = all(g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w) for g, w in zip(got, want, strict=True))
    say(equal=equal, fallbacks=reader.fallbacks, shapes=[list(g.shape) for g in got], dtype=str(got[0].dtype),
        arena=str(arena.device), device=str(got[0].device))  # fmt: skip
    client.close()


def hold(target: str) -> None:
    """Get a reply and ask for its read without ever progressing the agent (the bytes never land), then wait to
    be killed."""
    client, reader = nixl_client(target)
    reply = reader.request(images(), (), "hold", 30)
    handles = [Handle.unpack(e.handle) for e in reply.embeddings]
    session = reader.session
    first, last = handles[0], handles[-1]
    session.send(ReadAsk(99, first.epoch, first.lease_id, first.generation, first.offset,
                         last.offset + last.nbytes - first.offset, session.arena.data_ptr(), 0, False))  # fmt: skip
    say(held=reply.transport_name, leases=len({h.lease_id for h in handles}))
    time.sleep(3600)


def restart(target: str) -> None:
    client, reader = nixl_client(target)
    reply = reader.request(images(1), (), "old", 30)
    old = Handle.unpack(reply.embeddings[0].handle)
    say(transport=reply.transport_name)
    new_target = sys.stdin.readline().strip()  # the test restarted the server
    client2, reader2 = nixl_client(new_target)
    reader2.session.open()
    ask = ReadAsk(7, old.epoch, old.lease_id, old.generation, old.offset, old.nbytes, reader2.session.arena.data_ptr(), 0,
                  False)  # fmt: skip
    say(answer=refused(reader2, ask))
    client2.close()


def hostile(target: str) -> None:
    """Client B asks for client A's lease (another session's), and for its own beyond its end."""
    _, a = nixl_client(target)
    _, b = nixl_client(target)
    reply_a = a.request(images(2), (), "a", 30)
    reply_b = b.request(images(2), (), "b", 30)
    ha, hb = Handle.unpack(reply_a.embeddings[0].handle), Handle.unpack(reply_b.embeddings[0].handle)
    arena = b.session.arena.data_ptr()
    theirs = refused(b, ReadAsk(11, ha.epoch, ha.lease_id, ha.generation, ha.offset, ha.nbytes, arena, 0, False))
    beyond = refused(b, ReadAsk(12, hb.epoch, hb.lease_id, hb.generation, hb.offset, 1 << 30, arena, 0, False))
    stale = refused(b, ReadAsk(13, hb.epoch, hb.lease_id, hb.generation + 1, hb.offset, hb.nbytes, arena, 0, False))
    with a.session.read(reply_a, 30) as views:
        a_ok = views is not None and len(views) == 2
    say(theirs=theirs, beyond=beyond, stale=stale, a_ok=a_ok)


def slow(target: str, seconds: str) -> None:
    """Take a reply, read it only after `seconds` (the server's TTL may pass meanwhile)."""
    client, reader = nixl_client(target)
    reply = reader.request(images(2), (), "slow", 30)
    say(waiting=True)
    time.sleep(float(seconds))
    try:
        with reader.session.read(reply, 30) as views:
            say(read=views is not None)
    except ReadRefusedError as exc:
        say(refused=str(exc))
    client.close()


def keys(target: str) -> None:
    """Keep results under keys, then fetch them over NIXL (the server copies them into a lease)."""
    names = ["a", "b", "c"]
    with EncoderClient(target, transport="serialized") as plain:
        plain.keep(images(3), names)
        want = [e.tensor for e in plain.fetch(names)]
    client, reader = nixl_client(target)
    got = [e.tensor for e in client.fetch(names)]
    say(equal=all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), fallbacks=reader.fallbacks)
    client.close()


def auto(target: str) -> None:
    with EncoderClient(target, transport="auto") as client:
        say(reader=type(client._reader).__name__, got=len(client.encode_images(images(1))))


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    {
        "compare": compare,
        "hold": hold,
        "restart": restart,
        "hostile": hostile,
        "slow": slow,
        "auto": auto,
        "keys": keys,
    }[mode](*args)
