"""The fan-out bench's JSON record: the environment it ran in, and the table + record written out."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence

import torch

from mmproc.bench.provenance import git_commit


def _environment(argv: Sequence[str] | None) -> dict:
    gpus = []
    if torch.cuda.is_available():
        from mmproc.transport.cuda_ipc.runtime import device_uuid

        gpus = [{"index": i, "name": torch.cuda.get_device_name(i), "uuid": device_uuid(i)}
                for i in range(torch.cuda.device_count())]  # fmt: skip
    return {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "argv": list(argv or sys.argv[1:]),
            "python": sys.version.split()[0], "torch": torch.__version__, "gpus": gpus,
            "commit": git_commit()}  # fmt: skip


def _emit(text: str, record: dict, args: argparse.Namespace) -> None:
    print(text, end="")
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
