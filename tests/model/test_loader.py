"""Loading real-layout checkpoints (Kimi-VL sharded, K2.5 single file), config parsing, presets."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from mmproc.batching import pack_images
from mmproc.errors import ConfigError
from mmproc.models import PRESETS, VisionConfig, VisionEncoder, load_encoder, parse_config
from mmproc.models import loader as loader_mod
from tests.support.checkpoints import hf_config, preprocessor_config, write_checkpoint
from tests.support.preprocessed import make_images

VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "mm_projector.")


def internal_state(tensors: dict[str, torch.Tensor], family: str) -> dict[str, torch.Tensor]:
    """Checkpoint names -> VisionEncoder names, spelled out by hand (independent of the loader's tables)."""
    rename = {
        "vision_tower.": "tower.",
        "multi_modal_projector.": "projector.",
        "mm_projector.pre_norm.": "projector.pre_norm.",
        "mm_projector.proj.0.": "projector.linear_1.",
        "mm_projector.proj.2.": "projector.linear_2.",
    }
    out = {}
    for key, t in tensors.items():
        prefix = next(p for p in rename if key.startswith(p))
        out[rename[prefix] + key[len(prefix) :]] = t
    return out


def in_memory_encoder(config: VisionConfig, tensors: dict[str, torch.Tensor], dtype=torch.float32) -> VisionEncoder:
    model = VisionEncoder(config).to(dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in internal_state(tensors, config.family).items()})
    return model.eval()


class SafeOpenSpy:
    """Wraps safetensors.safe_open to record opened files and the tensors actually read."""

    def __init__(self, real):
        self.real, self.opened, self.read = real, [], []

    def __call__(self, path, *args, **kwargs):
        self.opened.append(str(path).rsplit("/", 1)[-1])
        handle = self.real(path, *args, **kwargs)
        spy = self

        class Handle:
            def __enter__(self):
                self.inner = handle.__enter__()
                return self

            def __exit__(self, *exc):
                return handle.__exit__(*exc)

            def keys(self):
                return self.inner.keys()

            def get_slice(self, key):
                return self.inner.get_slice(key)

            def get_tensor(self, key):
                spy.read.append(key)
                return self.inner.get_tensor(key)

        return Handle()


@torch.inference_mode()
def test_kimi_vl_sharded_reads_only_vision_tensors(tmp_path, monkeypatch):
    tensors = write_checkpoint(tmp_path, family="kimi_vl", sharded=True, with_language_model=True)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    assert any(k.startswith("language_model.") for k in index) and len(set(index.values())) == 3
    spy = SafeOpenSpy(loader_mod.safe_open)
    monkeypatch.setattr(loader_mod, "safe_open", spy)

    model = load_encoder(tmp_path)

    assert sorted(spy.read) == sorted(tensors)  # every vision tensor once, no language-model tensor
    assert "model-00003-of-00003.safetensors" not in spy.opened  # the LLM-only shard is never opened
    assert model.config.family == "kimi_vl" and model.config.text_hidden_size == 256
    batch = pack_images(make_images([(4, 4), (10, 6), (64, 64)]))
    want = in_memory_encoder(model.config, tensors)(batch)
    torch.testing.assert_close(model(batch), want, atol=0, rtol=0)  # bit for bit


@torch.inference_mode()
def test_k25_single_file_loads(tmp_path, monkeypatch):
    tensors = write_checkpoint(tmp_path, family="kimi_k25", sharded=False, with_language_model=True, seed=3)
    assert "mm_projector.proj.0.weight" in tensors and "mm_projector.proj.2.bias" in tensors
    spy = SafeOpenSpy(loader_mod.safe_open)
    monkeypatch.setattr(loader_mod, "safe_open", spy)
    model = load_encoder(tmp_path)
    assert sorted(spy.read) == sorted(tensors)
    assert model.config.family == "kimi_k25"
    batch = pack_images(make_images([(2, 2), (12, 20)]))
    torch.testing.assert_close(model(batch), in_memory_encoder(model.config, tensors)(batch), atol=0, rtol=0)


@torch.inference_mode()
def test_bfloat16_checkpoint_to_both_dtypes(tmp_path):
    tensors = write_checkpoint(tmp_path, family="kimi_vl", sharded=False, dtype=torch.bfloat16)
    batch = pack_images(make_images([(6, 6)]))
    f32 = load_encoder(tmp_path, dtype=torch.float32)
    torch.testing.assert_close(f32(batch), in_memory_encoder(f32.config, tensors)(batch), atol=0, rtol=0)
    bf16 = load_encoder(tmp_path, dtype="bfloat16")
    assert bf16.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in bf16.parameters())
    torch.testing.assert_close(bf16(batch), in_memory_encoder(bf16.config, tensors, torch.bfloat16)(batch))


def test_missing_tensor_is_named(tmp_path):
    write_checkpoint(tmp_path, family="kimi_k25", sharded=False)
    file = tmp_path / "model.safetensors"
    tensors = load_file(file)
    del tensors["vision_tower.encoder.blocks.1.wo.bias"]
    save_file(tensors, str(file))
    with pytest.raises(ConfigError, match=r"vision_tower\.encoder\.blocks\.1\.wo\.bias"):
        load_encoder(tmp_path)


def test_tensor_missing_from_its_shard_names_tensor_and_file(tmp_path):
    write_checkpoint(tmp_path, family="kimi_vl", sharded=True)
    weight_map = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    key = "multi_modal_projector.linear_2.weight"
    shard = tmp_path / weight_map[key]
    tensors = load_file(shard)
    del tensors[key]
    save_file(tensors, str(shard))
    with pytest.raises(ConfigError, match=rf"{key}.*{shard.name}"):
        load_encoder(tmp_path)


def test_misshaped_tensor_is_named(tmp_path):
    write_checkpoint(tmp_path, family="kimi_vl", sharded=True)
    weight_map = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    key = "vision_tower.encoder.blocks.0.wqkv.weight"
    shard = tmp_path / weight_map[key]
    tensors = load_file(shard)
    tensors[key] = torch.zeros(3 * 144, 143)
    save_file(tensors, str(shard))
    with pytest.raises(ConfigError, match=rf"{key}.*{shard.name}.*\(432, 143\)"):
        load_encoder(tmp_path)


def test_unexpected_vision_tensor_is_named(tmp_path):
    write_checkpoint(tmp_path, family="kimi_vl", sharded=False, vision={"num_layers": 2})
    file = tmp_path / "model.safetensors"
    tensors = load_file(file)
    tensors["vision_tower.encoder.blocks.2.wo.bias"] = torch.zeros(144)  # a layer the config does not have
    save_file(tensors, str(file))
    with pytest.raises(ConfigError, match=r"unexpected vision tensor vision_tower\.encoder\.blocks\.2\.wo\.bias"):
        load_encoder(tmp_path)


def test_missing_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="config.json"):
        load_encoder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(hf_config("kimi_vl")))
    with pytest.raises(ConfigError, match="model.safetensors"):
        load_encoder(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json"):
        load_encoder(tmp_path)


def test_parse_kimi_vl_config():
    cfg = parse_config(hf_config("kimi_vl", {"hidden_size": 1152, "num_heads": 16}, 2048))
    assert (cfg.family, cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.text_hidden_size) == (
        "kimi_vl",
        1152,
        16,
        72,
        2048,
    )
    assert cfg.merge_kernel_size == (2, 2) and cfg.pos_emb_height == 64 and cfg.projector_ln_eps == 1e-5


def test_parse_k25_config_and_text_hidden_precedence():
    raw = hf_config("kimi_k25", None, 7168)
    raw["vision_config"]["projector_ln_eps"] = 1e-6
    cfg = parse_config(raw)
    assert (cfg.family, cfg.text_hidden_size, cfg.projector_ln_eps, cfg.num_layers) == ("kimi_k25", 7168, 1e-6, 2)
    raw["text_hidden_size"], raw["text_config"]["hidden_size"] = 1000, 2000
    assert parse_config(raw).text_hidden_size == 7168  # vision_config wins
    del raw["vision_config"]["text_hidden_size"]
    assert parse_config(raw).text_hidden_size == 1000  # then the top level
    del raw["text_hidden_size"]
    assert parse_config(raw).text_hidden_size == 2000  # then text_config
    del raw["model_type"]  # the family is never guessed from which keys are present
    with pytest.raises(ConfigError, match="model_type"):
        parse_config(raw)
    raw["vision_config"]["model_type"] = "kimi_k25_vision"
    assert parse_config(raw).family == "kimi_k25"


@pytest.mark.parametrize(
    ("family", "section", "field", "value"),
    [
        ("kimi_vl", "vision_config", "num_attention_heads", None),
        ("kimi_vl", "vision_config", "hidden_size", "1152"),
        ("kimi_vl", "text_config", "hidden_size", -1),
        ("kimi_k25", "vision_config", "vt_num_hidden_layers", None),
        ("kimi_k25", "vision_config", "vt_intermediate_size", 0),
        ("kimi_k25", "vision_config", "merge_type", "sd2"),
    ],
)
def test_bad_config_fields_are_named(family, section, field, value):
    raw = hf_config(family)
    if value is None:
        del raw[section][field]
    else:
        raw[section][field] = value
    with pytest.raises(ConfigError, match=field):
        parse_config(raw)


def test_config_validation():
    with pytest.raises(ConfigError, match="divisible by 4"):
        VisionConfig(
            family="kimi_vl", hidden_size=140, num_layers=1, num_heads=2, intermediate_size=8, text_hidden_size=8
        )
    with pytest.raises(ConfigError, match="num_heads"):
        VisionConfig(
            family="kimi_vl", hidden_size=144, num_layers=1, num_heads=5, intermediate_size=8, text_hidden_size=8
        )
    with pytest.raises(ConfigError, match="model_type"):
        parse_config({**hf_config("kimi_vl"), "model_type": "kimi_k25"})
    with pytest.raises(ConfigError, match="vision_config"):
        parse_config({"model_type": "kimi_vl"})
    assert PRESETS["kimi-vl"].text_hidden_size == 2048 and PRESETS["kimi-k2.5"].family == "kimi_k25"
    assert PRESETS["kimi-k2.5"].text_hidden_size == 7168 and PRESETS["tiny"].hidden_size == 144


def test_preprocessor_config_written(tmp_path):
    write_checkpoint(tmp_path / "vl", family="kimi_vl", sharded=False, with_language_model=False)
    vl = json.loads((tmp_path / "vl" / "preprocessor_config.json").read_text())
    assert vl == preprocessor_config("kimi_vl") and vl["in_token_limit"] == 4096 and vl["pad_input"] is True
    write_checkpoint(
        tmp_path / "k25",
        family="kimi_k25",
        sharded=False,
        with_language_model=False,
        preprocessor={"media_proc_cfg": {"in_patch_limit": 1024}},
    )
    k25 = json.loads((tmp_path / "k25" / "preprocessor_config.json").read_text())["media_proc_cfg"]
    assert k25["in_patch_limit"] == 1024 and k25["patch_limit_on_one_side"] == 512 and k25["merge_kernel_size"] == 2


def test_presets_are_deterministic():
    a, b = load_encoder(None), load_encoder(None, preset="tiny")
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), name
    # Pinned values: the same bits on every machine (uniform from raw generator bits, no libm).
    w = a.state_dict()["tower.encoder.blocks.0.wqkv.weight"]
    assert w.shape == (432, 144) and abs(w.std().item() - 0.02) < 1e-3
    assert w[0, :3].tolist() == pytest.approx(EXPECTED_WQKV_HEAD, abs=0, rel=0)
    ln = a.state_dict()["tower.encoder.final_layernorm.weight"]
    assert (ln - 1).abs().max() < 0.035
    bf16 = load_encoder(None, dtype=torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and torch.equal(
        bf16.state_dict()["tower.patch_embed.proj.weight"], a.state_dict()["tower.patch_embed.proj.weight"].bfloat16()
    )
    with pytest.raises(ConfigError, match="preset"):
        load_encoder(None, preset="huge")


EXPECTED_WQKV_HEAD = [0.026546193286776543, 0.006657836027443409, -0.034640152007341385]
