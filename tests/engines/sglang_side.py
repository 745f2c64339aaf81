"""SGLang 0.5.23's own language-side code, set up on the CPU for tests/engines/test_sglang_epd.py.

What runs is SGLang's: the tokenizer-side `MMReceiverHTTP` (dispatch to /encode; zmq_to_tokenizer receive), the
scheduler-side wait loop (`process_waiting_requests`: receive-URL registration, the shared PULL socket, the
allow-listed unpickler, part assembly, the TP status all-reduce) and the Kimi processors' `get_mm_data` (prompt
expansion, spans). Stand-ins, for what needs a GPU server or a real checkpoint: the HF processor object the Kimi
processors wrap (the checkpoint's remote code: a tokenizer and `media_proc_cfg`), the scheduler object
(only `create_req` reads it, to build an aborted request) and the TP group (a gloo group over 1 or 2 processes,
with SGLang's `all_gather_object`/`cpu_group` interface). Not run here: a full `--language-only` server (its
model runner needs CUDA kernels) and generation.

torchvision: `sglang.srt.configs` imports it at module level (InternVL's config), no CPU build for torch 2.13 is
on the index, and nothing here calls it; tests/engines/sglang_stubs/ has an import-only stand-in.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import time
import types
from array import array
from collections import OrderedDict

os.environ.setdefault("SGLANG_HOST_IP", "127.0.0.1")  # receive URLs on loopback (get_local_ip_auto reads it)

FAMILIES = {
    "kimi_k25": "KimiK2_5VLImageProcessor",
    "kimi_k3": "KimiK3ImageProcessor",
    "kimi_vl": "KimiVLImageProcessor",
}
SPECIAL = ["[UNK]", "<|im_end|>", "<|media_begin|>", "<|media_start|>", "<|media_content|>", "<|media_pad|>",
           "<|media_end|>"]  # fmt: skip
WORDS = ["image", "describe", "and", "compare", "these"]


def vocab(sizes: list[tuple[int, int]]) -> list[str]:
    """The test tokenizer's words: the media tokens, a few words, and K3's "WxH" of each test image."""
    return SPECIAL + WORDS + sorted({f"{w}x{h}" for w, h in sizes})


def tokenizer(words: list[str]):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = {
        "version": "1.0",
        "added_tokens": [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, t in enumerate(SPECIAL)
        ],  # fmt: skip
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {w: i for i, w in enumerate(words)}, "unk_token": "[UNK]"},
    }
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)), unk_token="[UNK]", eos_token="<|im_end|>"
    )


def publish(backend: str, encoder_urls: list[str], tp_rank: int = 0, tp_size: int = 1, tp_group=None):
    """SGLang's runtime context as a `--language-only --encoder-urls ... --encoder-transfer-backend` server has it."""
    from sglang.srt.runtime_context import get_context, get_parallel

    server_args = (
        get_context()
        .override_server_args(
            encoder_transfer_backend=backend,
            language_only=True,
            encoder_urls=encoder_urls,
            mm_process_config={},
            tp_size=tp_size,
        )
        .install()
    )
    get_parallel().override_permanently(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, tp_group=tp_group, nnodes=1)
    return server_args


def processor(family: str, server_args, words: list[str]):
    """SGLang's own multimodal processor of `family`, over a stand-in for the checkpoint's HF processor."""
    from sglang.srt.multimodal.processors import kimi_k3, kimi_k25, kimi_vl
    from transformers import PretrainedConfig

    tok = tokenizer(words)
    media_cfg = {"patch_size": 14, "merge_kernel_size": 2, "in_patch_limit": 16384, "patch_limit_on_one_side": 512,
                 "image_mean": [0.5] * 3, "image_std": [0.5] * 3}  # fmt: skip
    hf_processor = types.SimpleNamespace(
        tokenizer=tok, image_processor=None, media_processor=types.SimpleNamespace(media_proc_cfg=media_cfg)
    )
    hf_config = PretrainedConfig(
        media_placeholder_token_id=words.index("<|media_pad|>"),
        vision_config=types.SimpleNamespace(merge_kernel_size=[2, 2]),
    )
    hf_config.model_type = family
    module = {"kimi_k25": kimi_k25, "kimi_k3": kimi_k3, "kimi_vl": kimi_vl}[family]
    return getattr(module, FAMILIES[family])(hf_config, server_args, hf_processor, "default")


def outcome_of(mm_inputs) -> dict:
    """What the test compares: the prompt ids, each image's span and rows (SGLang's precomputed_embeddings)."""
    return {
        "input_ids": list(mm_inputs.input_ids),
        "offsets": [list(item.offsets) for item in mm_inputs.mm_items],
        "rows": [item.precomputed_embeddings.clone() for item in mm_inputs.mm_items],
        "features": [item.feature for item in mm_inputs.mm_items],
    }


# -- the scheduler ranks (zmq_to_scheduler), one process each ---------------------------------------------------


class _TpGroup:
    """The two members of SGLang's GroupCoordinator that the receiver uses, over a gloo group."""

    def __init__(self, group) -> None:
        self.cpu_group = group

    def all_gather_object(self, obj):
        import torch.distributed as dist

        out = [None] * dist.get_world_size(self.cpu_group)
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out


def _scheduler_stub(tok):
    """The attributes `MMReceiverBase.create_req` reads (it builds the aborted request's Req)."""
    model_config = types.SimpleNamespace(hf_eos_token_id=None, vocab_size=len(tok))
    return types.SimpleNamespace(
        model_config=model_config, disaggregation_mode=None, metrics_reporter=types.SimpleNamespace(enable_metrics=False),
        metrics_collector=None, tokenizer=tok, dllm_config=None,
    )  # fmt: skip


def tokenized(rid: str, input_ids: list[int], assigned: dict, encoder_urls: list[str]):
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    return TokenizedGenerateReqInput(
        rid=rid, input_text=None, input_ids=array("q", input_ids), input_embeds=None, mm_inputs=None,
        token_type_ids=None, sampling_params=SamplingParams(), return_logprob=False, logprob_start_len=-1,
        top_logprobs_num=0, token_ids_logprob=None, stream=False, need_wait_for_mm_inputs=True,
        num_items_assigned=assigned, encoder_urls=encoder_urls,
    )  # fmt: skip


def rank_main(rank: int, world: int, init_file: str, family: str, words: list[str], encoder_urls, inbox, outbox):
    """One scheduler TP rank: rank 0 takes messages from `inbox` and broadcasts them (as SGLang's scheduler
    broadcasts its requests), every rank runs `process_waiting_requests` each tick, and rank 0 reports each
    finished request's outcome on every rank to `outbox`."""
    import torch.distributed as dist
    from sglang.srt.disaggregation.encoder.receiver import MMReceiverHTTP
    from sglang.srt.managers.io_struct import EncoderDispatchErrorReq

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    group = _TpGroup(dist.group.WORLD)
    server_args = publish("zmq_to_scheduler", encoder_urls, rank, world, group)
    proc = processor(family, server_args, words)
    receiver = MMReceiverHTTP(server_args, hf_config=None, scheduler=_scheduler_stub(proc._tokenizer))
    receiver.mm_processor = proc
    group.all_gather_object(None)  # every rank set up
    if rank == 0:
        outbox.put(("ready", []))
    stop = False
    while not stop:
        messages = []
        if rank == 0:
            with contextlib.suppress(queue.Empty):
                messages.append(inbox.get(timeout=0.01 if receiver.waiting_list else 0.2))
        box = [messages]
        dist.broadcast_object_list(box, src=0)
        reqs = []
        for message in box[0]:
            if message[0] == "stop":
                stop = True
            elif message[0] == "req":
                reqs.append(tokenized(*message[1:]))
            elif message[0] == "dispatch_error":
                reqs.append(EncoderDispatchErrorReq(rid=message[1], error_msg=message[2], error_code=message[3]))
        done, aborted = receiver.process_waiting_requests(reqs)
        local = {r.rid: {"ok": True, **outcome_of(r.mm_inputs)} for r in done}
        for req, msg, code in aborted:
            local[req.rid] = {"ok": False, "error_msg": msg, "error_code": None if code is None else int(code)}
        gathered = group.all_gather_object(local)
        if rank == 0:
            for rid in local:
                outbox.put((rid, [g.get(rid) for g in gathered]))
        time.sleep(0.005)
    dist.destroy_process_group()


# -- the tokenizer side --------------------------------------------------------------------------------------------


def tokenizer_receiver(backend: str, encoder_urls: list[str]):
    """SGLang's tokenizer-manager side receiver (no scheduler): dispatch, and zmq_to_tokenizer's receive."""
    from sglang.srt.disaggregation.encoder.receiver import MMReceiverHTTP

    server_args = publish(backend, encoder_urls)
    return server_args, MMReceiverHTTP(server_args, hf_config=None, scheduler=None)


def generate_request(rid: str, images: list[str]):
    from sglang.srt.managers.io_struct import GenerateReqInput

    return GenerateReqInput(rid=rid, text="", image_data=list(images))


def assignment(receiver, request) -> OrderedDict:
    """SGLang's own split of a request's items over its encoders (all to one here: one encoder URL)."""
    return receiver._assign_items_by_modality(receiver._extract_url_data(request), len(receiver.encode_urls))
