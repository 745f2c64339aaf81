"""A tiny Kimi K2.5 checkpoint that BOTH mmproc and vLLM load: random weights in the released key layout.

The vision tower and projector come from tests/support/checkpoints.py (released names, `vt_*` config keys for mmproc);
vision_config also carries transformers' `Kimi_K25VisionConfig` names, which vLLM reads (a missing one silently
falls back to the full-size default). The language model is a two-layer dense DeepSeek-V3 ("kimi_k2") with a
word-level tokenizer that knows the media tokens. `in_patch_limit` is small so that modest images get resized.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.support.checkpoints import deep_merge, hf_config, make_vision_tensors, preprocessor_config, vision_spec

TEXT_HIDDEN = 256
IN_PATCH_LIMIT = 1024  # patches per image before a resize: 256 tokens at most
SPECIAL_TOKENS = ["[UNK]", "<|im_end|>", "<|media_begin|>", "<|media_content|>", "<|media_pad|>", "<|media_end|>"]
WORDS = 250
# `vllm serve`'s chat completions: each message's text (vLLM writes the image placeholders into it) and a reply turn
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} w5 {% endfor %}{% if add_generation_prompt %}w9 {% endif %}"
VOCAB = SPECIAL_TOKENS + ["image"] + [f"w{i}" for i in range(WORDS)]
TEXT = {
    "model_type": "kimi_k2",
    "architectures": ["DeepseekV3ForCausalLM"],
    "vocab_size": 256 * ((len(VOCAB) + 255) // 256),
    "hidden_size": TEXT_HIDDEN,
    "intermediate_size": 512,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 2,
    "first_k_dense_replace": 2,  # every layer dense: no experts to shard
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": None,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 48,
    "qk_rope_head_dim": 16,
    "v_head_dim": 64,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "float32",
}


def token_id(token: str) -> int:
    return VOCAB.index(token)


def _text_tensor_shapes() -> dict[str, tuple[int, ...]]:
    t = TEXT
    h, heads, v = t["hidden_size"], t["num_attention_heads"], t["vocab_size"]
    qk = t["qk_nope_head_dim"] + t["qk_rope_head_dim"]
    shapes: dict[str, tuple[int, ...]] = {
        "language_model.model.embed_tokens.weight": (v, h),
        "language_model.model.norm.weight": (h,),
        "language_model.lm_head.weight": (v, h),
    }
    for i in range(t["num_hidden_layers"]):
        p = f"language_model.model.layers.{i}"
        shapes.update(
            {
                f"{p}.input_layernorm.weight": (h,),
                f"{p}.post_attention_layernorm.weight": (h,),
                f"{p}.self_attn.q_proj.weight": (heads * qk, h),
                f"{p}.self_attn.kv_a_proj_with_mqa.weight": (t["kv_lora_rank"] + t["qk_rope_head_dim"], h),
                f"{p}.self_attn.kv_a_layernorm.weight": (t["kv_lora_rank"],),
                f"{p}.self_attn.kv_b_proj.weight": (
                    heads * (t["qk_nope_head_dim"] + t["v_head_dim"]),
                    t["kv_lora_rank"],
                ),
                f"{p}.self_attn.o_proj.weight": (h, heads * t["v_head_dim"]),
                f"{p}.mlp.gate_proj.weight": (t["intermediate_size"], h),
                f"{p}.mlp.up_proj.weight": (t["intermediate_size"], h),
                f"{p}.mlp.down_proj.weight": (h, t["intermediate_size"]),
            }
        )
    return shapes


def _text_tensors(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed + 7)
    out = {}
    for name, shape in _text_tensor_shapes().items():
        if len(shape) == 1:  # RMSNorm weights
            out[name] = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:  # sharp (3/sqrt(fan_in)) so that greedy decoding varies with the image rows instead of repeating
            out[name] = (3.0 * torch.randn(shape, generator=gen) / shape[1] ** 0.5).contiguous()
    return out


def _tokenizer_json() -> dict:
    specials = [
        {"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
        | {"special": True}
        for i, tok in enumerate(SPECIAL_TOKENS)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": specials,
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {tok: i for i, tok in enumerate(VOCAB)}, "unk_token": "[UNK]"},
    }


def write_k25_engine_checkpoint(path: Path | str, seed: int = 0) -> Path:
    """Write the checkpoint directory (config, preprocessor, tokenizer, one safetensors file); returns it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    v = vision_spec()
    config = hf_config("kimi_k25", text_hidden=TEXT_HIDDEN)
    pad = token_id("<|media_pad|>")
    transformers_vision = {
        "hidden_size": v["hidden_size"],
        "num_hidden_layers": v["num_layers"],
        "num_attention_heads": v["num_heads"],
        "intermediate_size": v["intermediate_size"],
        "patch_size": v["patch_size"],
        "pos_emb_height": v["pos_emb_height"],
        "pos_emb_width": v["pos_emb_width"],
        "pos_emb_time": 4,
        "merge_kernel_size": list(v["merge_kernel_size"]),
        "hidden_act": "gelu_pytorch_tanh",
    }
    config = deep_merge(
        config,
        {
            "vision_config": transformers_vision,
            "text_config": TEXT,
            "media_placeholder_token_id": pad,
            "image_token_id": pad,
            "projection_hidden_size": v["hidden_size"],
            "use_unified_vision_chunk": True,  # vLLM's chat parser turns image_url parts into vision_chunk items
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
        },
    )
    (path / "config.json").write_text(json.dumps(config, indent=2))
    pre = preprocessor_config(
        "kimi_k25",
        {
            "media_proc_cfg": {
                "in_patch_limit": IN_PATCH_LIMIT,
                "temporal_merge_kernel_size": 4,
                "in_patch_limit_each_frame": IN_PATCH_LIMIT,
                "in_patch_limit_video": 4 * IN_PATCH_LIMIT,
                "sample_fps": 2.0,
            }
        },
    )
    (path / "preprocessor_config.json").write_text(json.dumps(pre, indent=2))
    (path / "tokenizer.json").write_text(json.dumps(_tokenizer_json()))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "[UNK]",
        "eos_token": "<|im_end|>",
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    tensors = {**make_vision_tensors("kimi_k25", text_hidden=TEXT_HIDDEN, seed=seed), **_text_tensors(seed)}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path
