"""mmproc as SGLang 0.5.23's disaggregated encoder, against SGLang's own code (tests/engines/sglang_side.py says what
runs and what stands in). A live `mmproc serve --sglang-address ...` on a tiny preset (random weights) encodes for
SGLang's real tokenizer-side dispatch; SGLang's scheduler wait loop, on two TP ranks (gloo), receives the rows over
ZMQ and its Kimi processors build the prompt. Checked: the rows SGLang assembles are bit-equal to what mmproc's own
client gets for the same images, the prompt ids and image spans are those of mmproc's framing, and the 400 /
timeout / dead-receiver paths end with the right status. Skipped where sglang is not installed (.ci/run builds its venv: tests/engines/requirements-sglang-cpu.txt).
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import io
import multiprocessing
import os
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

if os.environ.get("MMPROC_REQUIRE_SGLANG") != "1" and importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang 0.5.23 is not installed here", allow_module_level=True)
STUBS = str(Path(__file__).resolve().parent / "sglang_stubs")
if importlib.util.find_spec("torchvision") is None and STUBS not in sys.path:
    # import-only torchvision (sglang_side.py says why), only where sglang runs; the ranks inherit sys.path
    sys.path.insert(0, STUBS)
import sglang.srt.disaggregation.encoder.receiver  # noqa: E402, F401  (a broken install fails here, never skips)
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from mmproc.client import EncoderClient  # noqa: E402
from mmproc.prompt import framing  # noqa: E402
from tests.engines import sglang_side  # noqa: E402
from tests.support.common import free_port  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)

PRESETS = {"kimi_k25": "tiny-k2.5", "kimi_k3": "tiny-k3", "kimi_vl": "tiny"}
SIZES = [(100, 80), (300, 200), (64, 200)]  # padded, resized, tall
PUSH_TIMEOUT_S, REGISTER_WAIT_S = 1.0, 3.0


def png(width: int, height: int, seed: int) -> bytes:
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=g).numpy()
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


IMAGES = [png(w, h, i) for i, (w, h) in enumerate(SIZES)]
URIS = ["data:image/png;base64," + base64.b64encode(b).decode() for b in IMAGES]
WORDS = sglang_side.vocab(SIZES)


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Mmproc:
    """`mmproc serve` in a subprocess, with the SGLang front end on its own port."""

    def __init__(self, family: str, *extra: str) -> None:
        self.grpc, self.http, self.port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [
            "--model", PRESETS[family], "--grpc-address", f"127.0.0.1:{self.grpc}",
            "--http-address", f"127.0.0.1:{self.http}", "--sglang-address", f"127.0.0.1:{self.port}",
            "--sglang-push-timeout-s", str(PUSH_TIMEOUT_S), "--sglang-register-wait-s", str(REGISTER_WAIT_S), *extra,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen([sys.executable, "-m", "service.app.cli", "serve", *args], cwd=REPO, env=env)
        deadline = time.monotonic() + 120
        while not self._healthy():
            assert self.proc.poll() is None and time.monotonic() < deadline, "mmproc serve did not come up"
            time.sleep(0.3)

    def _healthy(self) -> bool:
        try:
            return http_get(self.url + "/health", 0.5)[0] == 200
        except OSError:
            return False

    def own_rows(self, images: list[bytes]):
        with EncoderClient(f"127.0.0.1:{self.grpc}", timeout=30) as client:
            return client.encode(images)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


class Ranks:
    """SGLang's scheduler-side receivers on `world` TP ranks (sglang_side.rank_main), fed like the scheduler."""

    def __init__(self, family: str, encoder_urls: list[str], world: int, tmp: Path) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        init = str(tmp / "gloo-init")
        self.procs = [
            ctx.Process(target=sglang_side.rank_main,
                        args=(r, world, init, family, WORDS, encoder_urls, self.inbox, self.outbox), daemon=True)
            for r in range(world)
        ]  # fmt: skip
        for p in self.procs:
            p.start()
        assert self.result("ready", 300) == []

    def send(self, message: tuple) -> None:
        self.inbox.put(message)

    def result(self, rid: str, timeout: float = 120) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            got, per_rank = self.outbox.get(timeout=max(0.1, deadline - time.monotonic()))
            if got == rid:
                return per_rank

    def stop(self) -> None:
        self.send(("stop",))
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.kill()


@pytest.fixture(scope="module", params=sorted(PRESETS))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def mmproc(family):
    server = Mmproc(family)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tokenizer_side(mmproc):
    server_args, receiver = sglang_side.tokenizer_receiver("zmq_to_scheduler", [mmproc.url])
    return server_args, receiver


@pytest.fixture(scope="module")
def ranks(family, mmproc, tmp_path_factory):
    ranks = Ranks(family, [mmproc.url], 2, tmp_path_factory.mktemp("tp"))
    yield ranks
    ranks.stop()


def prompts(family: str, own) -> tuple[str, str]:
    """(the prompt SGLang gets: one unexpanded pad per image, K3 without framing; the expanded prompt mmproc's
    framing gives) for images `own` (mmproc's results)."""
    frame = framing(family)
    sent, expanded = ["describe"], ["describe"]
    for result in own:
        w, h = result.image_size
        one = frame.placeholder if family == "kimi_k3" else frame.header(w, h) + frame.placeholder + frame.image_footer
        sent += [one, "and"]
        expanded += [frame.image_text(result.num_tokens, w, h), "and"]
    return " ".join(sent), " ".join(expanded)


def check_outcome(outcome: dict, family: str, own, tok) -> None:
    sent, expanded = prompts(family, own)
    ids = tok.encode(expanded)
    assert outcome["input_ids"] == ids
    pad = WORDS.index("<|media_pad|>")
    starts = [i for i, t in enumerate(ids) if t == pad and (i == 0 or ids[i - 1] != pad)]
    assert outcome["offsets"] == [[(s, s + r.num_tokens - 1)] for s, r in zip(starts, own)]
    assert outcome["features"] == [None] * len(own)  # precomputed rows: SGLang's vision tower is never called
    for got, mine in zip(outcome["rows"], own):
        assert got.dtype == mine.tensor.dtype and torch.equal(got, mine.tensor)  # bit for bit


@pytest.mark.parametrize("picks", [[0], [0, 1, 2]], ids=["one-image", "three-images"])
def test_scheduler_ranks_assemble_mmprocs_rows(family, mmproc, tokenizer_side, ranks, picks) -> None:
    """zmq_to_scheduler (SGLang's default): two TP ranks register, each gets its own copy of the rows."""
    _, receiver = tokenizer_side
    own = mmproc.own_rows([IMAGES[i] for i in picks])
    rid = f"{family}-{len(picks)}"
    request = sglang_side.generate_request(rid, [URIS[i] for i in picks])
    errors: list = []
    ready = receiver.send_encode_request(request, on_dispatch_error=errors.append)
    tok = sglang_side.tokenizer(WORDS)
    sent, _ = prompts(family, own)
    ranks.send(("req", rid, tok.encode(sent), request.num_items_assigned, request.encoder_urls))
    ready.set()
    per_rank = ranks.result(rid)
    assert not errors
    assert len(per_rank) == 2
    for outcome in per_rank:
        assert outcome["ok"], outcome
        check_outcome(outcome, family, own, tok)


def test_tokenizer_receiver_assembles_mmprocs_rows(family, mmproc) -> None:
    """zmq_to_tokenizer (K3's default at TP>1): /encode names prefill_host:embedding_port."""
    server_args, receiver = sglang_side.tokenizer_receiver("zmq_to_tokenizer", [mmproc.url])
    proc = sglang_side.processor(family, server_args, WORDS)
    own = mmproc.own_rows(IMAGES[:2])
    tok = sglang_side.tokenizer(WORDS)
    sent, _ = prompts(family, own)
    request = sglang_side.generate_request(f"tok-{family}", URIS[:2])
    mm_inputs = asyncio.run(receiver.recv_mm_data(request_obj=request, mm_processor=proc, prompt=tok.encode(sent)))
    assert mm_inputs is not None
    check_outcome(sglang_side.outcome_of(mm_inputs), family, own, tok)


def test_bad_media_fails_the_request_with_400(family, mmproc, tokenizer_side, ranks) -> None:
    """Bad media: /encode answers 400, the ranks' registrations still 200, so SGLang aborts the request with 400."""
    _, receiver = tokenizer_side
    rid = f"bad-{family}"
    request = sglang_side.generate_request(rid, [URIS[0], base64.b64encode(b"not an image").decode()])
    errors: list = []
    ready = receiver.send_encode_request(request, on_dispatch_error=errors.append)
    ranks.send(("req", rid, [0], request.num_items_assigned, request.encoder_urls))
    ready.set()
    deadline = time.monotonic() + 30
    while not errors:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert errors[0].error_code == 400 and "mm_items[1]" in errors[0].error_msg
    ranks.send(("dispatch_error", rid, errors[0].error_msg, errors[0].error_code))
    for outcome in ranks.result(rid):
        assert outcome == {"ok": False, "error_msg": errors[0].error_msg, "error_code": 400}


def test_ranks_that_register_too_late_get_504(family, mmproc, tokenizer_side, ranks) -> None:
    """The ranks register after mmproc's register wait: /encode answers 504 (the late registrations 200), and
    SGLang aborts with 504 rather than waiting for its own receive timeout."""
    _, receiver = tokenizer_side
    rid = f"late-{family}"
    request = sglang_side.generate_request(rid, URIS[:1])
    errors: list = []
    started = time.monotonic()
    ready = receiver.send_encode_request(request, on_dispatch_error=errors.append)
    ready.set()  # the scheduler has not seen the request yet
    while not errors:
        assert time.monotonic() - started < REGISTER_WAIT_S + 30
        time.sleep(0.05)
    assert errors[0].error_code == 504 and time.monotonic() - started >= REGISTER_WAIT_S
    ranks.send(("req", rid, [0], request.num_items_assigned, request.encoder_urls))
    ranks.send(("dispatch_error", rid, errors[0].error_msg, errors[0].error_code))
    for outcome in ranks.result(rid):
        assert not outcome["ok"] and outcome["error_code"] == 504


def test_a_dead_receiver_costs_a_timeout_and_a_counted_failure(family, mmproc, tokenizer_side) -> None:
    """zmq_to_tokenizer to a port nobody listens on: /encode answers 502 after the push timeout, /health answers
    meanwhile, the failure is counted, and the next request is served."""
    _, receiver = tokenizer_side
    mm_data = receiver._extract_url_data(sglang_side.generate_request("dead", URIS[:1]))
    health: list[float] = []

    def probe() -> None:
        time.sleep(PUSH_TIMEOUT_S / 2)
        started = time.monotonic()
        assert http_get(mmproc.url + "/health")[0] == 200
        health.append(time.monotonic() - started)

    prober = threading.Thread(target=probe)
    prober.start()
    started = time.monotonic()
    error = asyncio.run(receiver.encode(f"dead-{family}", mm_data, free_port(), "encode", encode_urls=[mmproc.url]))
    elapsed = time.monotonic() - started
    prober.join()
    assert error is not None and error.error_code == 502, error
    assert PUSH_TIMEOUT_S <= elapsed < PUSH_TIMEOUT_S + 10
    assert health and health[0] < 2.0
    metrics = http_get(f"http://127.0.0.1:{mmproc.http}/metrics")[1].decode()
    assert 'mmproc_sglang_pushes_total{outcome="failed"}' in metrics
    server_args, tok_receiver = sglang_side.tokenizer_receiver("zmq_to_tokenizer", [mmproc.url])
    proc = sglang_side.processor(family, server_args, WORDS)
    own = mmproc.own_rows(IMAGES[:1])
    sent, _ = prompts(family, own)
    request = sglang_side.generate_request(f"after-dead-{family}", URIS[:1])
    tok = sglang_side.tokenizer(WORDS)
    mm_inputs = asyncio.run(tok_receiver.recv_mm_data(request_obj=request, mm_processor=proc, prompt=tok.encode(sent)))
    check_outcome(sglang_side.outcome_of(mm_inputs), family, own, tok)


def test_images_split_over_two_encoders(family, mmproc, ranks) -> None:
    """Two --encoder-urls (the same mmproc under two names): SGLang splits the images into two parts, each its own
    /encode and push, and the ranks assemble them in order."""
    urls = [mmproc.url, mmproc.url.replace("127.0.0.1", "localhost")]
    _, receiver = sglang_side.tokenizer_receiver("zmq_to_scheduler", urls)
    own = mmproc.own_rows(IMAGES)
    rid = f"split-{family}"
    request = sglang_side.generate_request(rid, URIS)
    errors: list = []
    ready = receiver.send_encode_request(request, on_dispatch_error=errors.append)
    assert sorted(request.num_items_assigned[next(iter(request.num_items_assigned))]) == [1, 2]
    tok = sglang_side.tokenizer(WORDS)
    ranks.send(("req", rid, tok.encode(prompts(family, own)[0]), request.num_items_assigned, request.encoder_urls))
    ready.set()
    for outcome in ranks.result(rid):
        assert outcome["ok"], outcome
        check_outcome(outcome, family, own, tok)
    assert not errors


def test_bad_media_on_the_tokenizer_path_is_sglangs_503(family, mmproc) -> None:
    """zmq_to_tokenizer: SGLang 0.5.23 turns any encoder failure into no embeddings, which its tokenizer manager
    refuses with 503 (it does not run the vision tower itself in --language-only mode)."""
    from sglang.srt.managers.tokenizer_manager import _reject_missing_dispatched_encoder_embedding

    server_args, receiver = sglang_side.tokenizer_receiver("zmq_to_tokenizer", [mmproc.url])
    proc = sglang_side.processor(family, server_args, WORDS)
    request = sglang_side.generate_request(f"tok-bad-{family}", [base64.b64encode(b"not an image").decode()])
    request.need_wait_for_mm_inputs = True
    mm_inputs = asyncio.run(receiver.recv_mm_data(request_obj=request, mm_processor=proc, prompt=[0]))
    assert mm_inputs is None
    with pytest.raises(Exception) as refused:
        _reject_missing_dispatched_encoder_embedding(request, mm_inputs)
    assert refused.value.status_code == 503


def documented_command(program: str) -> list[str]:
    """The command line of docs/engines.md's SGLang section that starts with `program`, as argv."""
    text = (REPO / "docs" / "engines.md").read_text()
    section = text[text.index("## SGLang: mmproc as its disaggregated encoder") :]
    lines = section.replace("\\\n", " ").splitlines()
    line = next(line for line in lines if line.startswith(program))
    return shlex.split(line)[len(shlex.split(program)) :]


def test_the_documented_commands_parse() -> None:
    """docs/engines.md's two command lines, parsed by SGLang's own ServerArgs flags and mmproc's settings."""
    import argparse

    from sglang.srt.server_args import ServerArgs, resolve_encoder_transfer_backend

    from service.app.cli import _add_serve_flags, _settings

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(documented_command("python -m sglang.launch_server"))
    assert args.language_only and args.encoder_transfer_backend == "zmq_to_scheduler"
    assert args.encoder_urls and all(url.startswith("http://") for url in args.encoder_urls)
    # `auto`: zmq_to_scheduler, but zmq_to_tokenizer for K3 at TP > 1 (both served)
    assert resolve_encoder_transfer_backend("auto", "KimiK25ForConditionalGeneration", 8) == "zmq_to_scheduler"
    assert resolve_encoder_transfer_backend("auto", "KimiK3ForConditionalGeneration", 8) == "zmq_to_tokenizer"
    parser = argparse.ArgumentParser()
    _add_serve_flags(parser)
    settings = _settings(parser.parse_args(documented_command("mmproc serve")))
    port = args.encoder_urls[0].rpartition(":")[2]
    assert settings.sglang_address.endswith(f":{port}")


def test_bfloat16_rows_arrive_bit_for_bit() -> None:
    """bfloat16, the GPU default: the header names it and SGLang reads the rows back unchanged (K2.5, tokenizer path)."""
    server = Mmproc("kimi_k25", "--dtype", "bfloat16")
    try:
        server_args, receiver = sglang_side.tokenizer_receiver("zmq_to_tokenizer", [server.url])
        proc = sglang_side.processor("kimi_k25", server_args, WORDS)
        own = server.own_rows(IMAGES[:2])
        assert own[0].tensor.dtype == torch.bfloat16
        tok = sglang_side.tokenizer(WORDS)
        request = sglang_side.generate_request("bf16", URIS[:2])
        prompt = tok.encode(prompts("kimi_k25", own)[0])
        mm_inputs = asyncio.run(receiver.recv_mm_data(request_obj=request, mm_processor=proc, prompt=prompt))
        check_outcome(sglang_side.outcome_of(mm_inputs), "kimi_k25", own, tok)
    finally:
        server.stop()
