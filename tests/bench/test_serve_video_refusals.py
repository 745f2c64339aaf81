"""The video bench on a busy server: refusals retried after the server's back-off and reported by code, apart from
failures."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import mmproc.client
from mmproc.bench import serve_video
from mmproc.bench.report import Progress
from mmproc.errors import InvalidMediaError, ResourceExhaustedError


class _BusyServer:
    """Refuses the first `busy` calls (RESOURCE_EXHAUSTED), rejects video index 3, encodes the rest."""

    calls = 0
    lock = threading.Lock()

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def encode_videos(self, items: list) -> list:
        with self.lock:
            type(self).calls += 1
            busy = type(self).calls <= 4
        if busy:
            raise ResourceExhaustedError("queue full", retry_after_s=0.001, cause="queue_delay")
        if items[0].data == b"bad":
            raise InvalidMediaError("not a video", reason="undecodable", item="video")
        return [SimpleNamespace(num_tokens=10, frame_indices=[0, 1])]

    def close(self) -> None:
        pass


def test_refusals_are_retried_and_reported_by_code(monkeypatch) -> None:
    monkeypatch.setattr(mmproc.client, "EncoderClient", _BusyServer)
    ticks: list[int] = []
    real_tick = Progress.tick
    monkeypatch.setattr(Progress, "tick", lambda self, n=1: (ticks.append(n), real_tick(self, n)))
    args = serve_video._parse(["--workload", "video", "--requests", "8", "--warmup", "0", "--concurrency", "2"])
    run = serve_video.serve(args, [b"v0", b"v1", b"v2", b"bad"])
    assert run["completed"] == 6 and run["failed"] == {"INVALID_ARGUMENT": 2} and run["refused"] == {}
    assert run["retries"] == 4 and len(ticks) == 8  # the bar moves per finished request, refused or not
    args.retries = 0
    _BusyServer.calls = 0
    run = serve_video.serve(args, [b"v0"])
    assert run["refused"] == {"RESOURCE_EXHAUSTED": 4} and run["completed"] == 4 and run["failed"] == {}
    assert "| 4 | 4 RESOURCE_EXHAUSTED (0) | 0 |" in serve_video.markdown(_record(run))


def _record(run: dict) -> dict:
    spec = {"seconds": 1, "width": 2, "height": 2, "fps": 1, "codec": "x", "gop": 1, "mean_kib": 1, "sample_fps": 2}
    ms = dict.fromkeys(("mmproc", "every_frame", "floor", "preprocess"), 1.0)
    cost = {"sampled_frames": 1, "frames_in_streams": 1, "frames_decoded": 1, "ms_per_sampled_frame": ms,
            "mmproc_vs_floor": 1.0, "mmproc_vs_every_frame": 1.0}  # fmt: skip
    return {"workload": spec, "decode": cost, "serve": run}
