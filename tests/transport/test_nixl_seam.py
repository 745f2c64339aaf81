"""The NIXL transport on the seam, without NIXL installed: its own modules, one table line, its settings; its
messages round-trip; its config refuses a write that could outlive its lease."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mmproc.client.readers import on_another_node
from mmproc.transport.cuda_ipc.node import node_identity
from mmproc.transport.nixl.config import NixlConfig
from mmproc.transport.nixl.messages import Handle, ReadAsk, opened, opened_info, refusal, refused
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.transports import NIXL, TRANSPORTS
from service.app.configs import transport_configs
from tests.support.server import test_settings

REPO = Path(__file__).resolve().parents[2]
OWN = {"mmproc/wire/transports.py", "mmproc/wire/nixl.py", "mmproc/client/nixl.py", "mmproc/client/nixl_reader.py",
       "service/app/settings.py", "service/app/configs.py"}  # fmt: skip


def test_no_file_but_its_own_names_nixl() -> None:
    sources = [p for top in ("mmproc", "service") for p in (REPO / top).rglob("*.py")]
    named = {str(p.relative_to(REPO)) for p in sources if re.search(r"nixl", p.read_text(), re.I)}
    assert named - OWN == {p for p in named if p.startswith("mmproc/transport/nixl/")}


def test_the_table_line_and_its_session() -> None:
    assert [t.name for t in TRANSPORTS] == ["ipc", "nixl", "serialized"]  # auto: IPC on the node, then NIXL
    assert NIXL.wire == pb.TRANSPORT_AUTO and NIXL.session == "mmproc.wire.nixl:session"
    assert NIXL.reader == "mmproc.client.nixl_reader:reader"


def test_settings_turn_it_on_and_keep_it_on_loopback() -> None:
    off = transport_configs(test_settings())["nixl"]
    assert isinstance(off, NixlConfig) and not off.enabled and off.net_devices == "lo"
    on = transport_configs(test_settings(transport="nixl", nixl_port_range="40000-40063"))["nixl"]
    assert on.enabled and on.port_range == "40000-40063"
    with pytest.raises(ValueError, match="below ttl_s"):
        NixlConfig(ttl_s=5, transfer_timeout_s=10)


def test_messages_round_trip_and_refuse_garbage() -> None:
    handle = Handle(epoch=7, lease_id=3, generation=2, offset=4096, nbytes=1 << 20)
    assert Handle.unpack(handle.pack()) == handle
    ask = ReadAsk(1, 7, 3, 2, 4096, 1 << 20, 0xDEAD000, 0, True)
    assert ReadAsk.unpack(ask.pack()) == ask
    assert refusal(refused(9, "freed")) == (9, "freed") and opened_info(opened(7, "agent")) == (7, "agent")
    for bad in (b"", b"A" + b"\0" * 3, handle.pack()):
        with pytest.raises(ValueError):
            ReadAsk.unpack(bad)
    with pytest.raises(ValueError):
        Handle.unpack(b"\0" * 39)


def test_auto_skips_ipc_only_for_a_server_that_says_it_is_on_another_node() -> None:
    assert on_another_node(pb.ServerInfo(node_boot_id="another-boot-id"))
    assert not on_another_node(pb.ServerInfo(node_boot_id=node_identity()[1]))
    assert not on_another_node(pb.ServerInfo()) and not on_another_node(None)  # an older server, or no answer
