"""ServerInfo as the JSON that `GET /v1/info` prints: numbers as numbers and each preprocessing rule as the JSON
value it is. (protobuf's JSON mapping writes 64-bit integers as strings, and the rules travel as JSON text in a
map<string, string> so that gRPC clients need no schema for them.)"""

from __future__ import annotations

import json

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.dtypes import PB_TO_NAME

_INT64 = frozenset({FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64})


def server_info_json(info: Message) -> dict[str, object]:
    """The ServerInfo message -> plain JSON object (field names as in the proto)."""
    data = _numbers(info, MessageToDict(info, preserving_proto_field_name=True))
    rules = data.get("preprocess", {}).get("rules")
    if isinstance(rules, dict):
        data["preprocess"]["rules"] = {key: json.loads(value) for key, value in rules.items()}
    return data


def _numbers(message: Message, data: dict[str, object]) -> dict[str, object]:
    """64-bit integer fields of `message` (nested and repeated ones too) as ints in its dict form `data`."""
    for field in message.DESCRIPTOR.fields:
        if field.name not in data:
            continue
        if field.message_type is not None and not field.message_type.GetOptions().map_entry:
            value = getattr(message, field.name)
            if isinstance(value, Message):
                data[field.name] = _numbers(value, data[field.name])  # type: ignore[arg-type]
            else:  # a repeated field of messages
                data[field.name] = [_numbers(m, d) for m, d in zip(value, data[field.name])]  # type: ignore[arg-type]
        elif field.enum_type is not None and field.enum_type.name == "DType":  # "float32", as /v1/encode says
            value = data[field.name]
            names = [PB_TO_NAME.get(getattr(pb.DType, v), v) for v in (value if isinstance(value, list) else [value])]
            data[field.name] = names if isinstance(value, list) else names[0]
        elif field.cpp_type in _INT64:
            value = data[field.name]
            data[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)  # type: ignore[arg-type]
    return data
