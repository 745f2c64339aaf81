"""`bench serve --client async`: one event loop per client process drives `--concurrency` requests through one
AsyncEncoderClient, with the same statistics as the threaded client (in-process tiny server, serialized)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmproc.bench import serve

SMALL = ["--resolutions", "48x40,40x48", "--format", "png", "--warmup", "2", "--quiet", "--server-cache", "off"]


@pytest.mark.parametrize("clients", [1, 2])
def test_async_client_completes_every_request(tiny_server, tmp_path: Path, clients: int) -> None:
    out = tmp_path / "async.json"
    argv = ["--target", tiny_server.grpc_target, "--http-target", tiny_server.http_url.removeprefix("http://"),
            "--client", "async", "--clients", str(clients), "--requests", "7", "--images-per-request", "3",
            "--concurrency", "3", "--transport", "serialized", "--json", str(out), "--json-raw", *SMALL]  # fmt: skip
    assert serve.main(argv) == 0
    record = json.loads(out.read_text())
    assert record["workload"]["client"] == "async" and record["workload"]["clients"] == clients
    (run,) = record["runs"]
    assert run["completed"] == 7 and run["failed"] == 0 and run["not_sent"] == 0 and run["errors"] == {}
    assert sorted(r["index"] for r in run["requests"]) == list(range(7))  # every request once
    assert run["images_per_s"] == pytest.approx(3 * run["throughput_rps"])
    assert run["latency_ms"]["count"] == 7 and run["embedding_mb_per_s"] > 0
    assert run["server"]["images_encoded"] == 21  # what the server encoded in the pass: the measured images


def test_async_client_is_refused_where_it_cannot_run(tiny_server, capsys) -> None:
    for extra in (["--mode", "rate", "--rate", "5"], ["--consume", "view"]):
        assert serve.main(["--target", tiny_server.grpc_target, "--client", "async", *extra]) == 2
        assert "--client async" in capsys.readouterr().err
