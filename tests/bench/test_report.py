"""What the benchmarks show a person: a progress bar only on a terminal, tables as tables, `--plot` PNGs
(matplotlib, the [plot] extra; skipped cleanly without it), MFU only against the peak of the device used."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import decode_isolation as decode
from mmproc.bench import forward as encoder_bench
from mmproc.bench import serve
from mmproc.bench.peaks import device_peak
from mmproc.bench.report import Progress, save_plot, table

TINY_ENCODER = ["--device", "cpu", "--preset", "tiny", "--workloads", "56x2", "--reps", "1", "--warmup", "0"]
SMALL_SERVE = ["--resolutions", "48x40", "--format", "png", "--warmup", "1", "--quiet"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def assert_png(path: Path) -> None:
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "PNG" and image.width > 200 and image.height > 100
        lo, hi = image.convert("L").getextrema()
        assert hi - lo > 100  # something is drawn, not a blank canvas


def test_the_bar_draws_on_a_terminal_only_and_lines_do_not_tear_it(capsys) -> None:
    term = Terminal()
    with Progress(3, "work", unit="step", stream=term) as bar:
        bar.tick()
        bar.print("a result line")
        bar.tick(2)
    drawn = term.getvalue()
    assert "work [" in drawn and "3/3" in drawn and drawn.endswith("\n")
    assert "\r\033[K" in drawn  # cleared before the result line went to stdout
    assert capsys.readouterr().out == "a result line\n"
    pipe = io.StringIO()  # not a terminal: a log or a pipe gets nothing
    with Progress(3, "work", stream=pipe) as bar:
        bar.tick(3)
    assert pipe.getvalue() == ""
    with Progress(3, "work", stream=term, enabled=False) as bar:  # --quiet
        before = term.getvalue()
        bar.tick(3)
    assert term.getvalue() == before


def test_tables_align_numbers_right_and_show_missing_values_as_a_dash() -> None:
    text = table(("name", "img/s", "MFU"), [("448x64", 481.25, None), ("mixed48", 12.0, 0.61)])
    header, rule, first, second = text.split("\n")
    assert header.split() == ["name", "img/s", "MFU"] and set(rule.replace(" ", "")) == {"-"}
    assert first.split() == ["448x64", "481.25", "-"] and second.endswith("0.61")
    assert first.index("481.25") + len("481.25") == second.index("12.00") + len("12.00")  # right-aligned


def test_no_mfu_on_the_cpu() -> None:
    peak, note = device_peak(torch.device("cpu"), torch.float32)
    assert peak is None and "no MFU" in note


def test_encoder_on_cpu_uses_the_servers_dtype_and_reports_no_mfu(tmp_path, capsys) -> None:
    out = tmp_path / "encoder.json"
    assert encoder_bench.main([*TINY_ENCODER, "--no-baseline", "--quiet", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record["dtype"] == "float32"  # what `mmproc serve --device cpu` runs, not bf16
    assert record["peak_tflops"] is None and all(r["mfu"] is None for r in record["results"])
    assert "no MFU" in printed and "790" not in printed  # never an H200 peak for a CPU run
    assert "{'" not in printed and "('" not in printed  # readable lines, no Python reprs
    given = tmp_path / "given.json"
    assert encoder_bench.main([*TINY_ENCODER, "--no-baseline", "--quiet", "--peak", "2", "--json", str(given)]) == 0
    assert json.loads(given.read_text())["results"][0]["mfu"] > 0


def test_encoder_plot_is_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "encoder.png"
    assert encoder_bench.main([*TINY_ENCODER, "--quiet", "--peak", "1", "--plot", str(plot)]) == 0
    assert_png(plot)


def test_serve_plot_of_an_ab_run_is_a_png_and_the_json_stays_small(tiny_server, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    plot, out = tmp_path / "serve.png", tmp_path / "serve.json"
    argv = ["--target", tiny_server.grpc_target, "--compare", "transport", "--requests", "4", "--concurrency", "1",
            "--plot", str(plot), "--json", str(out), *SMALL_SERVE]  # fmt: skip
    assert serve.main(argv) == 0
    assert_png(plot)
    assert all("requests" not in run for run in json.loads(out.read_text())["runs"])  # no --json-raw asked


def test_decode_prints_a_table_and_plots(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "decode.png"
    assert decode.main(["--sizes", "32", "--repeat", "1", "--workers", "1", "--quiet", "--plot", str(plot)]) == 0
    printed = capsys.readouterr()
    assert "process/thread" in printed.out and "replacing the process workers" in printed.out
    assert "worker died" not in printed.err  # the deliberate replacement is not reported as a crash
    assert_png(plot)


def test_without_matplotlib_plot_is_skipped_in_one_line(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the [plot] extra were not installed
    plot = tmp_path / "x.png"
    assert save_plot(plot, lambda plt: None) is False
    assert "pip install matplotlib" in capsys.readouterr().err and not plot.exists()
    assert encoder_bench.main([*TINY_ENCODER, "--no-baseline", "--quiet", "--plot", str(plot)]) == 0
    assert not plot.exists()


@pytest.mark.parametrize("argv", [["--workloads", "bogus"], ["--workloads", "448x0"], ["--latency", "mixed"]])
def test_a_bad_workload_is_a_usage_error_not_a_traceback(argv, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        encoder_bench.main(["--device", "cpu", "--preset", "tiny", *argv])
    assert exit_.value.code == 2 and "is not a workload" in capsys.readouterr().err
