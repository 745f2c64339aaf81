"""JPEGs decoded on the GPU (`gpu_decode`, service/pipeline/decode/gpu.py): the same answers as the CPU path within
a level of the pixels, the same refusals, other images and GPU failures through the decode workers, and hostile
JPEGs costing their own image a 400, never the process its CUDA context. CUDA tests run on the device
(scripts/gpu_decode_check.sh); the CPU ones check the setting's rules."""

from __future__ import annotations

import asyncio
import io
import time

import numpy as np
import pytest
import torch
from PIL import Image
from prometheus_client import CollectorRegistry, Counter

from mmproc.client import EncoderClient
from mmproc.errors import ConfigError, InvalidMediaError
from mmproc.media import MediaLimits, decode_image
from mmproc.preprocess import PreprocessConfig
from service.app.build import build_pipeline
from service.pipeline.decode.gpu import GpuRequest, decode_split, run_batch
from service.pipeline.decode.worker import Prepared, prepare_image
from tests.media.test_gpu_jpeg import _garbled
from tests.support.corpus import build_corpus
from tests.support.media_samples import encode_image, make_image_bytes, random_image
from tests.support.server import serving, test_settings

cuda = pytest.mark.cuda


def test_gpu_decode_on_without_a_cuda_model_refuses_to_start() -> None:
    with pytest.raises(ConfigError, match="gpu_decode=on, but the encoder is not on CUDA"):
        build_pipeline(test_settings(gpu_decode="on"))


def test_a_cpu_model_decodes_every_image_on_the_cpu(tiny_server) -> None:
    paths = tiny_server.service.metrics.decode_paths
    before = paths.labels("cpu")._value.get()
    with EncoderClient(tiny_server.grpc_target) as client:
        client.encode_images([make_image_bytes(64, 64, "JPEG", seed=s) for s in range(3)])
    assert tiny_server.service.pipeline.decode.gpu is None
    assert paths.labels("cpu")._value.get() == before + 3 and paths.labels("gpu")._value.get() == 0


def _photo(width: int, height: int, seed: int, **save) -> bytes:
    """Smooth colour fields, edges and noise, as a phone's JPEG: what chroma upsampling differences show on."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.stack([128 + 100 * np.sin(x / (17 + 13 * c) + y / (29 + 7 * c) + c) for c in range(3)], axis=-1)
    img[(x // 97 + y // 61) % 5 == 0] = (230, 40, 40)
    img += rng.normal(0, 12, img.shape)
    return encode_image(Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)), "JPEG", quality=90, **save)


GPU_KINDS = {
    "4:2:0": _photo(512, 512, 0),
    "4:4:4": _photo(333, 517, 1, subsampling=0),
    "4:2:2": _photo(517, 333, 2, subsampling=1),
    "progressive": _photo(640, 480, 3, progressive=True),
    "grey": encode_image(random_image(300, 200, "L", seed=4), "JPEG"),
    "exif 6": encode_image(random_image(120, 64, seed=5), "JPEG", exif_orientation=6),
    "restarts": _photo(300, 200, 6, restart_marker_blocks=4),
    "resized": _photo(1920, 1080, 7),
}
CPU_KINDS = {"png": make_image_bytes(200, 150, "PNG", seed=8), "cmyk": make_image_bytes(96, 64, "JPEG", mode="CMYK")}


@pytest.fixture(scope="module")
def gpu_and_cpu():
    """Two float32 tiny servers on cuda:0, the same weights: JPEGs decoded on the GPU, and on the CPU."""
    common = dict(device="cuda:0", dtype="float32", transport="serialized", cache_mb=0, http_address="")
    with (
        serving(test_settings(gpu_decode="on", **common)) as gpu,
        serving(test_settings(gpu_decode="off", **common)) as cpu,
    ):
        yield gpu, cpu


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@cuda
def test_gpu_decoded_pixels_are_within_a_few_levels_of_libjpeg(gpu_and_cpu) -> None:
    """nvJPEG with interpolated chroma upsampling against Pillow (libjpeg-turbo): the H200 gave at most 3 levels, in
    rare pixels at strong chroma edges, mean 0.04 (docs/benchmarks/preprocess.md); torchvision's nvJPEG is 120 off."""
    decoder = gpu_and_cpu[0].service.pipeline.decode.gpu.decoder
    stream = torch.cuda.Stream()
    stats = {}
    for name, data in GPU_KINDS.items():
        pixels = decoder.decode([data], stream)[0]
        stream.synchronize()
        stored = Image.open(io.BytesIO(data)).convert("RGB")  # as stored: the decoder does not orient
        diff = np.abs(pixels.cpu().numpy().astype(np.int16) - np.asarray(stored).astype(np.int16))
        stats[name] = (int(diff.max()), round(float(diff.mean()), 5))
    print("max / mean level difference by kind:", stats)
    assert all(worst <= 4 and mean < 0.1 for worst, mean in stats.values()), stats


@cuda
def test_one_request_mixing_gpu_and_cpu_images_equals_the_cpu_path(gpu_and_cpu) -> None:
    gpu, cpu = gpu_and_cpu
    images = [*GPU_KINDS.values(), *CPU_KINDS.values()]
    names = [*GPU_KINDS, *CPU_KINDS]
    paths = gpu.service.metrics.decode_paths
    before = {p: paths.labels(p)._value.get() for p in ("gpu", "fallback", "cpu")}
    with EncoderClient(gpu.grpc_target) as on_gpu, EncoderClient(cpu.grpc_target) as on_cpu:
        want = on_cpu.encode(images)
        runs = [on_gpu.encode(images) for _ in range(3)]  # the third replays captured CUDA graphs where they fit
    assert paths.labels("gpu")._value.get() - before["gpu"] == 3 * len(GPU_KINDS)
    assert paths.labels("cpu")._value.get() - before["cpu"] == 3 * len(CPU_KINDS)
    assert paths.labels("fallback")._value.get() == before["fallback"]
    for got in runs:
        for name, g, w in zip(names, got, want, strict=True):
            assert (g.num_tokens, g.grid_thw, g.image_size) == (w.num_tokens, w.grid_thw, w.image_size), name
            if name in CPU_KINDS:
                assert torch.equal(g.tensor, w.tensor), name  # decoded by the same workers: the same bits
            else:
                assert _rel(g.tensor, w.tensor) < 2e-2, (name, _rel(g.tensor, w.tensor))
        assert all(torch.equal(a.tensor, b.tensor) for a, b in zip(got, runs[0])), "not deterministic"


@cuda
def test_same_size_images_preprocessed_together_each_get_their_own_answer(gpu_and_cpu) -> None:
    """The decoder preprocesses the images of one upright size in one stack: five 448² photos, and two 333x517 ones,
    the second stored 517x333 with EXIF 6. Each answer is its own image's (the contents differ), as on the CPU."""
    gpu, cpu = gpu_and_cpu
    images = [_photo(448, 448, 10 + i) for i in range(5)]
    images += [_photo(333, 517, 20), _photo(517, 333, 21, exif_orientation=6)]
    with EncoderClient(gpu.grpc_target) as on_gpu, EncoderClient(cpu.grpc_target) as on_cpu:
        got, want = on_gpu.encode(images), on_cpu.encode(images)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert (g.num_tokens, g.grid_thw, g.image_size) == (w.num_tokens, w.grid_thw, w.image_size), i
        assert _rel(g.tensor, w.tensor) < 2e-2, (i, _rel(g.tensor, w.tensor))
    assert got[6].image_size == (333, 517)


@cuda
def test_refusals_keep_their_image_index(gpu_and_cpu) -> None:
    gpu = gpu_and_cpu[0]
    good, png = GPU_KINDS["4:2:0"], make_image_bytes(64, 64, "PNG")
    huge = make_image_bytes(64, 64, "JPEG")
    huge = huge.replace(b"\xff\xc0\x00\x11\x08\x00\x40\x00\x40", b"\xff\xc0\x00\x11\x08\x7f\xff\x7f\xff")  # SOF: 32767²
    cases = [
        ([png[:-30], good], 0, "truncated"),  # a CPU-path image before a GPU one
        ([good, huge], 1, "too_many_pixels"),  # refused on its header, before the GPU
        ([good, huge, png[:-30]], 1, "too_many_pixels"),  # the lowest index wins
        ([png[:-30], huge], 0, "truncated"),
        ([good, _garbled(good)], 1, "undecodable"),  # nvJPEG would decode it: the gate sends it to the workers
    ]
    with EncoderClient(gpu.grpc_target) as client:
        for images, index, reason in cases:
            with pytest.raises(InvalidMediaError) as caught:
                client.encode_images(images)
            assert (caught.value.index, caught.value.reason) == (index, reason), caught.value


@cuda
def test_hostile_corpus_through_the_gpu_path_costs_only_its_image(gpu_and_cpu) -> None:
    """Every JPEG of the corpus alone through the GPU server: the CPU server's outcome, refusal reason included
    (nvJPEG decodes garbled files libjpeg refuses: the gate sends those to the workers). Afterwards the CUDA
    context still serves a good request with the same embedding as before."""
    gpu, cpu = gpu_and_cpu
    good = GPU_KINDS["4:2:0"]
    outcomes: dict[str, tuple[str, str]] = {}
    with EncoderClient(gpu.grpc_target) as on_gpu, EncoderClient(cpu.grpc_target) as on_cpu:
        before = on_gpu.encode_images([good])[0]
        for case in build_corpus():
            if not case.data.startswith(b"\xff\xd8"):
                continue
            outcomes[case.name] = (_outcome(on_gpu, case.data), _outcome(on_cpu, case.data))
        after = on_gpu.encode_images([good])[0]
    torch.cuda.synchronize()
    assert torch.equal(before, after)
    assert len(outcomes) > 30
    assert {name: o for name, o in outcomes.items() if o[0] != o[1]} == {}


def _outcome(client: EncoderClient, data: bytes) -> str:
    try:
        client.encode_images([data])
    except InvalidMediaError as exc:
        return str(exc.reason)
    return "ok"


def test_decode_image_agrees_on_the_gpu_kinds() -> None:
    """The fixtures above are what they say: each GPU kind decodes on the CPU at its stated orientation."""
    assert decode_image(GPU_KINDS["exif 6"], MediaLimits()).image.size == (64, 120)
    assert Image.open(io.BytesIO(CPU_KINDS["cmyk"])).mode == "CMYK"


def test_a_failed_gpu_batch_falls_back_to_the_workers(caplog) -> None:
    """A GPU decoder that raises (out of device memory, say) costs its images a trip to the workers, not a 500."""

    def broken(images, gated):
        raise RuntimeError("CUDA out of memory")

    class BrokenGpu:
        async def decode(self, images, deadline):
            return run_batch([GpuRequest(images, deadline)], MediaLimits(), broken)[0]

    async def cpu_path(images, deadline):
        return [prepare_image(data, MediaLimits(), PreprocessConfig.kimi_k25(), normalize=False) for data in images]

    paths = Counter("decoded", "", ["path"], registry=CollectorRegistry())
    images = [GPU_KINDS["4:2:0"], CPU_KINDS["png"]]
    got = asyncio.run(decode_split(BrokenGpu(), images, cpu_path, None, paths))
    assert [p.image.grid_hw for p in got] == [cpu.image.grid_hw for cpu in asyncio.run(cpu_path(images, None))]
    assert paths.labels("fallback")._value.get() == 1 and paths.labels("cpu")._value.get() == 1
    assert [r.levelname for r in caplog.records if "GPU JPEG decode failed" in r.getMessage()] == ["WARNING"]


def test_requests_queued_together_are_decoded_in_one_batch_each_in_its_own_order() -> None:
    """The JPEGs of every request in the batch (before each one's first refused image, and only of requests still in
    time) go to the device in one call; each request gets back its own verdicts."""
    calls: list[int] = []

    def decode(images, gated):
        calls.append(len(images))
        return [Prepared(prepare_image(data, MediaLimits(), PreprocessConfig.kimi_k25()).image, 0.0, 0.0)
                for data in images]  # fmt: skip

    jpeg, png = GPU_KINDS["grey"], CPU_KINDS["png"]
    requests = [
        GpuRequest([jpeg, png, jpeg], None),
        GpuRequest([jpeg, jpeg[:20], jpeg], None),  # a truncated header: the JPEG after it is not decoded
        GpuRequest([jpeg], time.monotonic() - 1),  # expired: nothing decoded for it
    ]
    first, second, third = run_batch(requests, MediaLimits(), decode)
    assert calls == [3]
    assert sorted(first.decoded) == [0, 2] and first.gated[1] is None  # the PNG: the CPU path's
    assert sorted(second.decoded) == [0] and isinstance(second.gated[1], InvalidMediaError)
    assert third.expired and not third.decoded
