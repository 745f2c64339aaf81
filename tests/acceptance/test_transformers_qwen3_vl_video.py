"""Qwen3-VL video against transformers 5.23: `Qwen3VLVideoProcessor` (torchvision backend) frame sampling, sizes,
pixels and `Qwen3VLProcessor` timestamps, then `get_video_features` (main output and every DeepStack level) vs
mmproc's rule (mmproc/preprocess/qwen3_vl_video.py) + the tower fed the temporal slices. Decoded frames in, so no
video decoder is needed; skipped without transformers or torchvision (CI: the torch 2.14.1 / torchvision venv)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmproc.batching import pack_images
from mmproc.models import load_encoder
from mmproc.preprocess.qwen3_vl_video import (
    QwenVideoRules,
    frame_prompt,
    frame_timestamps,
    preprocess_video,
    sample_indices,
)

transformers = pytest.importorskip("transformers", minversion="5.23")
pytest.importorskip("torchvision")
from transformers.video_utils import VideoMetadata  # noqa: E402

OUT = 64
# (frames, height, width, fps): resized down, scaled up (a side under 32 px), an odd count of sampled frames
VIDEOS = [(37, 90, 160, 6.0), (20, 24, 300, 10.0), (9, 256, 256, 2.0), (50, 480, 640, 25.0)]


@pytest.fixture(scope="module")
def qwen3_vl(tmp_path_factory):
    torch.manual_seed(2)
    config = transformers.Qwen3VLConfig(
        vision_config=dict(
            hidden_size=144, num_heads=2, intermediate_size=288, out_hidden_size=OUT, depth=3,
            deepstack_visual_indexes=[0, 1],
        ),
        text_config=dict(
            hidden_size=OUT, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, head_dim=32, vocab_size=1000,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 4, 4]},
        ),
    )  # fmt: skip
    model = transformers.Qwen3VLForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.model.visual.named_parameters():
            param.normal_(1.0 if "norm" in name and name.endswith("weight") else 0.0, 0.05)
    path = tmp_path_factory.mktemp("qwen3_vl_video_hf")
    model.save_pretrained(path)
    transformers.Qwen3VLVideoProcessor().save_pretrained(path)
    return path, model


@pytest.mark.parametrize(("count", "height", "width", "fps"), VIDEOS)
@torch.inference_mode()
def test_video_matches_the_video_processor_and_get_video_features(qwen3_vl, count, height, width, fps) -> None:
    path, model = qwen3_vl
    encoder, rules = load_encoder(path), QwenVideoRules.load(path)
    processor = transformers.Qwen3VLVideoProcessor.from_pretrained(path)
    frames = np.random.default_rng(count).integers(0, 256, (count, height, width, 3), dtype=np.uint8)
    ref = processor(
        videos=[frames],
        video_metadata=[VideoMetadata(total_num_frames=count, fps=fps)],
        do_sample_frames=True,
        return_metadata=True,
        cap_pixels_per_frame=False,
        return_tensors="pt",
    )
    indices = sample_indices(count, fps, rules)
    assert indices == ref["video_metadata"][0].frames_indices.tolist()
    slices = preprocess_video(torch.from_numpy(frames[indices]), rules)
    t, h, w = ref["video_grid_thw"][0].tolist()
    assert (len(slices), *slices[0].grid_hw) == (t, h, w)
    window = (
        ref["pixel_values_videos"].view(t, h // 2, w // 2, 2, 2, -1).permute(0, 1, 3, 2, 4, 5).reshape(t, h * w, -1)
    )
    assert torch.equal(torch.stack([s.patches.flatten(1) for s in slices]), window)  # the same pixels, bit for bit
    want = model.get_video_features(ref["pixel_values_videos"], ref["video_grid_thw"])
    levels = [want.pooler_output[0]] + [level[0] for level in want.deepstack_features]
    got = encoder(pack_images(slices))
    assert got.shape == (t * (h // 2) * (w // 2), 3 * OUT)
    for i, level in enumerate(levels):
        err = (got[:, i * OUT : (i + 1) * OUT].double() - level.double()).norm() / level.double().norm()
        assert float(err) < 1e-4, i
    stamps = frame_timestamps(indices, fps)
    assert stamps == transformers.Qwen3VLProcessor._calculate_timestamps(None, indices, fps, 2)
    assert frame_prompt(stamps, 2).startswith(f"<{stamps[0]:.1f} seconds><|vision_start|><|video_pad|>")
