"""Kimi K2.5 video, exactly as transformers 5.23 does it: `Kimi_K25VideoProcessor` (frames sampled and decoded by
transformers' own PyAV reader) and `get_video_features` of a tiny K2.5 written by `save_pretrained`, against
mmproc's decoder, preprocessing, tower and prompt framing, on videos the test encodes. Skipped without
transformers, torchvision (the video processor imports it) or PyAV; .ci/run gives it its own venv (~15 s of tests).
"""

from __future__ import annotations

import json
import types
from functools import partial

import pytest
import torch

from mmproc.batching import pack_images, split_by_image
from mmproc.media.video import VideoSampling, decode_video
from mmproc.media.video_limits import VideoLimits
from mmproc.models import load_encoder
from mmproc.preprocess.video import preprocess_video, video_num_tokens
from mmproc.preprocess.video_config import load_video_rules
from mmproc.prompt import video_prompt
from tests.acceptance.test_transformers_k25 import TEXT_HIDDEN, hf_checkpoint  # noqa: F401 - the module's fixture
from tests.support.video_samples import make_video_bytes

transformers = pytest.importorskip("transformers", minversion="5.23")
pytest.importorskip("torchvision")
pytest.importorskip("av")
from transformers.models.kimi_k25.processing_kimi_k25 import Kimi_K25Processor  # noqa: E402
from transformers.video_utils import load_video  # noqa: E402

# Small budgets so that the tiny videos are resized and padded: 64 patches per frame, 12 on a side.
VIDEO_PREPROCESSOR = {"max_patches": 64, "size": {"max_height": 12, "max_width": 12}, "fps": 2}
VIDEOS = {
    # name: (width, height, frames, fps, codec, container, gop)
    "two chunks, 4 + 3 frames": (64, 48, 37, 10, "h264", "mp4", 8),
    "last chunk of one frame": (100, 60, 25, 10, "h264", "mp4", None),  # 5 frames: 4 + 1 (no time embedding)
    "resized by the patch budget": (320, 240, 30, 12, "hevc", "mp4", 6),
    "resized by the side limit, 3 fps": (400, 70, 16, 8, "h264", "mov", 4),
}


@pytest.fixture(scope="module")
def video_checkpoint(hf_checkpoint):  # noqa: F811 - the imported fixture
    path, model = hf_checkpoint
    (path / "video_preprocessor_config.json").write_text(
        json.dumps({"video_processor_type": "Kimi_K25VideoProcessor", **VIDEO_PREPROCESSOR})
    )
    processor = transformers.Kimi_K25VideoProcessor(**VIDEO_PREPROCESSOR)
    return path, model, processor


def _reference(processor, path, fps=None):
    """transformers end to end: its PyAV reader with the processor's own sampling rule, then the processor."""
    sample = partial(processor.sample_frames, fps=fps) if fps else processor.sample_frames
    frames, metadata = load_video(str(path), backend="pyav", sample_indices_fn=lambda metadata, **_: sample(metadata))
    out = processor(videos=[frames], video_metadata=[metadata], do_sample_frames=False, return_metadata=True)
    return out, metadata


def _reference_video_features(model, pixels, grid_thw):
    """`get_video_features` of one chunk, less its final split. transformers 5.23 has two bugs on t > 1 there:
    the split sizes count t * h * w / 4 rows where the pooled output has h * w / 4 (split raises), and the
    temporal merge index cannot hold chunks of different t in one call (torch.cat raises on a short last
    chunk). Chunks are separate attention segments, so one call per chunk is the same model."""
    inner = model.model
    pooled = inner.vision_tower(pixels, grid_thw=grid_thw).pooler_output  # (h*w/4, 4, D): frames averaged
    return inner.mm_projector(pooled).squeeze(1)


@pytest.mark.parametrize("name", list(VIDEOS))
@torch.inference_mode()
def test_video_matches_kimi_k25_video_processor_and_get_video_features(video_checkpoint, tmp_path, name) -> None:
    path, model, processor = video_checkpoint
    width, height, frames, fps, codec, container, gop = VIDEOS[name]
    data = make_video_bytes(width, height, frames, fps, codec=codec, container=container, gop=gop, seed=len(name))
    file = tmp_path / f"clip.{container}"
    file.write_bytes(data)
    sample_fps = 3.0 if "3 fps" in name else None
    want, metadata = _reference(processor, file, sample_fps)

    rules = load_video_rules(path)
    decoded = decode_video(data, VideoLimits(), VideoSampling(fps=sample_fps), rules.fps)
    assert list(decoded.indices) == [int(i) for i in metadata.frames_indices]  # the same frames sampled
    video = preprocess_video(decoded.frames, decoded.indices, decoded.index.fps, rules)

    grids = [list(chunk.grid_thw) for chunk in video.chunks]
    assert grids == want["video_grid_thw"].tolist()
    assert len(video.chunks) == want["num_chunks_per_video"][0]
    pixels = torch.cat([chunk.patches for chunk in video.chunks])
    assert pixels.shape == want["pixel_values_videos"].shape
    assert torch.equal(pixels, want["pixel_values_videos"])  # decode, resize, pad, normalize: bit for bit

    num_frames = len(decoded.indices)
    reference_tokens = (
        -(-num_frames // 4) * (processor.get_num_of_video_patches(num_frames, height, width) // num_frames) // 4
    )
    assert video.num_tokens == video_num_tokens(num_frames, width, height, rules) == reference_tokens

    encoder = load_encoder(path)
    ours = split_by_image(encoder(pack_images(video.chunks)), [c.num_tokens for c in video.chunks])
    ref, start = [], 0
    for grid in want["video_grid_thw"]:
        rows = int(grid.prod())
        ref.append(_reference_video_features(model, want["pixel_values_videos"][start : start + rows], grid[None]))
        start += rows
    for got, expected in zip(ours, ref, strict=True):
        assert got.shape == expected.shape
        assert float((got.double() - expected.double()).norm() / expected.double().norm()) < 1e-3

    # The prompt an engine builds: the reference's per-chunk timestamps and placeholder counts.
    fake = types.SimpleNamespace(video_processor=processor, video_token="<|kimi_k25_video_placeholder|>")
    want_text = Kimi_K25Processor.replace_video_token(fake, {**want, "video_metadata": [metadata]}, 0)
    assert video_prompt("kimi_k25", video.timestamps, [c.num_tokens for c in video.chunks]) == want_text
