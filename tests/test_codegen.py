"""The checked-in generated protobuf code must match what `python -m service.app.codegen` makes now."""

from __future__ import annotations

from pathlib import Path

from service.app.codegen import ROOT, generate


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    fresh = {p.name: p.read_text() for p in generate(tmp_path)}
    checked_in = ROOT / "mmproc" / "v1"
    assert sorted(fresh) == sorted(p.name for p in checked_in.glob("*.py*")), "generated file set changed"
    for name, text in fresh.items():
        assert (checked_in / name).read_text() == text, (
            f"mmproc/v1/{name} is stale: run `python -m service.app.codegen`"
        )
