"""`bench serve --http-target` and `--baseline-target`: the server's metrics around each pass (CPU by role, the
encoder's img/s at the batches formed), and an A/B of two servers, against in-process tiny servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmproc.bench import serve
from mmproc.bench.serve_server import side_names
from mmproc.bench.server_metrics import by_label, grew, grew_by, parse, scrape
from tests.support.server import serving

SMALL = ["--resolutions", "48x40,40x48", "--format", "jpeg", "--warmup", "1", "--quiet", "--server-cache", "off"]
ROLES = {"event_loop", "grpc_loop", "runner", "gpu_decode", "decode_workers", "other"}


def http(server) -> str:
    return server.http_url.removeprefix("http://")


@pytest.fixture(scope="module")
def second_server():
    with serving() as server:
        yield server


def test_metrics_text_is_read_into_samples_and_deltas() -> None:
    before = parse('# HELP x\nmmproc_cpu_seconds_total{role="runner"} 1.5\nmmproc_images_encoded_total 4.0\nbad line\n')
    after = parse('mmproc_cpu_seconds_total{role="runner"} 2.0\nmmproc_cpu_seconds_total{role="other"} 1.0\n'
                  "mmproc_images_encoded_total 10.0\n")  # fmt: skip
    assert by_label(after, "mmproc_cpu_seconds_total", "role") == {"runner": 2.0, "other": 1.0}
    assert grew_by(before, after, "mmproc_cpu_seconds_total", "role") == {"runner": 0.5, "other": 1.0}
    assert grew(before, after, "mmproc_images_encoded_total") == 6.0


def test_sides_are_named_by_their_decode_path_when_it_tells_them_apart() -> None:
    gpu, cpu = {"server": {"decode_path": "gpu"}}, {"server": {"decode_path": "cpu"}}
    assert side_names([gpu, cpu], ("target", "baseline")) == ["gpu decode", "cpu decode"]
    assert side_names([cpu, cpu], ("target", "baseline")) == ["target", "baseline"]
    assert side_names([gpu, {"server": None}], ("target", "baseline")) == ["target", "baseline"]


def test_burst_prints_the_encoders_img_s_and_the_servers_cpu(tiny_server, tmp_path: Path, capsys) -> None:
    out = tmp_path / "serve.json"
    argv = ["--target", tiny_server.grpc_target, "--http-target", http(tiny_server), "--requests", "8",
            "--images-per-request", "2", "--concurrency", "2", "--transport", "serialized", "--json", str(out),
            *SMALL]  # fmt: skip
    assert serve.main(argv) == 0
    text = capsys.readouterr().out
    assert "of the encoder's img/s at these batches" in text and "Server CPU" in text and "ms per image" in text
    assert "| server CPU per image (ms) |" in text and "| encoder img/s at these batches |" in text
    (run,) = json.loads(out.read_text())["runs"]
    server = run["server"]
    assert server["images_encoded"] == 16  # exactly the measured images: the warm-up is done before the first read
    assert server["decoded"] == {"gpu": 0.0, "fallback": 0.0, "cpu": 16.0} and server["decode_path"] == "cpu"
    assert server["forwards"] >= 1 and server["encoder_images_per_s"] > 0 and server["e2e_vs_encoder"] > 0
    assert set(server["cpu_s"]) == ROLES and server["cpu_ms_per_image"] > 0
    assert set(server["cores"]) == ROLES


def test_baseline_target_runs_the_load_on_both_servers(tiny_server, second_server, tmp_path: Path, capsys) -> None:
    out = tmp_path / "ab.json"
    before = [scrape(http(s)) for s in (tiny_server, second_server)]
    argv = ["--target", tiny_server.grpc_target, "--http-target", http(tiny_server),
            "--baseline-target", second_server.grpc_target, "--baseline-http-target", http(second_server),
            "--requests", "6", "--concurrency", "2", "--transport", "serialized", "--json", str(out),
            *SMALL]  # fmt: skip
    assert serve.main(argv) == 0
    after = [scrape(http(s)) for s in (tiny_server, second_server)]
    text = capsys.readouterr().out
    record = json.loads(out.read_text())
    assert [r["label"] for r in record["runs"]] == ["target", "baseline"]  # both decode on the CPU
    assert record["baseline_target"] == second_server.grpc_target and record["baseline_server_info"]["model_name"]
    assert "| metric | target | baseline |" in text and f"- baseline `{second_server.grpc_target}`" in text
    for name in ("img/s x", "p50 x", "p99 x", "server CPU per image x"):
        assert name in text.split("**target / baseline**:")[1], name
    ab = record["compare"]
    assert ab["a"] == "target" and ab["b"] == "baseline"
    assert all(ab[k] > 0 for k in ("images_per_s_ratio", "p50_latency_ratio", "p99_latency_ratio",
                                   "server_cpu_per_image_ratio"))  # fmt: skip
    for run, old, new in zip(record["runs"], before, after):  # each side's load went to its own server
        assert run["completed"] == 6 and run["server"]["images_encoded"] == 6
        ok = 'mmproc_requests_total{code="OK",front_end="grpc",method="EncodeImagesStream"}'
        assert grew(old, new, ok) == 6 + 1  # the measured requests and the warm-up


def test_baseline_target_needs_burst_without_compare(tiny_server, capsys) -> None:
    argv = ["--target", tiny_server.grpc_target, "--baseline-target", tiny_server.grpc_target, "--compare", "transport"]
    assert serve.main(argv) == 2
    assert "--baseline-target" in capsys.readouterr().err
