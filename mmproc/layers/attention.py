"""Block-diagonal (per image) attention over a packed varlen sequence; softmax scale 1/sqrt(dh).

Backends, chosen once per (device, dtype) by `select_attention`: "flash_attn_cute" (FlashAttention 4's CuTe-DSL
kernels, Hopper and Blackwell: the head dim of 72 padded to 80 inside the kernel where cuDNN pads it to 128),
"flash_attn", "torch_varlen" (CUDA, fp16/bf16) and "sdpa" (a loop over segments: CPU, float32, the fallback). A
varlen backend is probed against "sdpa" before it is trusted. With flash_attn or torch_varlen, segments of
LONG_SEGMENT patches or more go to per-segment SDPA (cuDNN wins on long ones; figures in
docs/benchmarks/encoder.md) and equal-length segments may take one batched SDPA call; flash_attn_cute keeps both.
Segment bounds are CPU ints, so nothing is read back from the GPU.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

logger = logging.getLogger(__name__)

LONG_SEGMENT = 2048  # patches: from here on one SDPA call per segment beats varlen (see above)
_UNBOUNDED = 1 << 62  # patches: longer than any packed batch


@dataclass(frozen=True)
class VarlenMeta:
    """Segments of a packed sequence, built once per forward and shared by all layers.

    cu_seqlens: (N + 1,) int32 on the CPU. cu_seqlens_device: the same on the compute device (the CPU tensor
    itself on a CPU device). max_seqlen: longest segment. bounds: per segment (start, end) Python ints.
    uniform: the common segment length when every segment has the same one, else 0.
    """

    cu_seqlens: Tensor
    cu_seqlens_device: Tensor
    max_seqlen: int
    bounds: tuple[tuple[int, int], ...]
    uniform: int = 0
    _runs: dict[int, tuple[Run, ...]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_cu_seqlens(
        cls, cu_seqlens: Tensor, max_seqlen: int, cu_seqlens_device: Tensor | None = None
    ) -> VarlenMeta:
        offsets = cu_seqlens.tolist()  # a CPU tensor: no device sync
        bounds = tuple(zip(offsets[:-1], offsets[1:], strict=True))
        device_copy = cu_seqlens if cu_seqlens_device is None else cu_seqlens_device
        return cls(cu_seqlens, device_copy, max_seqlen, bounds, _uniform_length(bounds))

    def runs(self, long_segment: int) -> tuple[Run, ...]:
        """Consecutive segments grouped into runs: each long segment alone (meta None), each stretch of short
        segments as one sub-batch with its own rebased VarlenMeta. Computed once per forward, then cached."""
        cached = self._runs.get(long_segment)
        if cached is None:
            cached = self._runs[long_segment] = _plan_runs(self, long_segment)
        return cached


@dataclass(frozen=True)
class Run:
    start: int
    end: int
    meta: VarlenMeta | None  # None: a single long segment


def _plan_runs(meta: VarlenMeta, long_segment: int) -> tuple[Run, ...]:
    runs: list[Run] = []
    first = 0  # index of the first segment of the current short stretch
    for i, (start, end) in enumerate((*meta.bounds, (0, long_segment))):  # sentinel closes the last stretch
        if end - start < long_segment:
            continue
        if first < i:
            base, stop = meta.bounds[first][0], meta.bounds[i - 1][1]
            sub_cpu = meta.cu_seqlens[first : i + 1] - base
            sub_dev = meta.cu_seqlens_device[first : i + 1] - base  # a tiny device op, once per forward
            bounds = tuple((s - base, e - base) for s, e in meta.bounds[first:i])
            longest = max(e - s for s, e in bounds)
            runs.append(Run(base, stop, VarlenMeta(sub_cpu, sub_dev, longest, bounds, _uniform_length(bounds))))
        if i < len(meta.bounds):
            runs.append(Run(start, end, None))
        first = i + 1
    return tuple(runs)


def _uniform_length(bounds: tuple[tuple[int, int], ...]) -> int:
    lengths = {end - start for start, end in bounds}
    return lengths.pop() if len(lengths) == 1 else 0


# q, k, v (L, H, dh) -> (L, H, dh), same dtype/device.
AttentionFn = Callable[[Tensor, Tensor, Tensor, VarlenMeta], Tensor]


def sdpa_segments(q: Tensor, k: Tensor, v: Tensor, meta: VarlenMeta) -> Tensor:
    """Per-segment `F.scaled_dot_product_attention` on (1, H, L_i, dh) views; exact, any device/dtype."""
    if len(meta.bounds) == 1:
        return _sdpa(q, k, v)
    out = torch.empty_like(q)  # (L, H, dh)
    for start, end in meta.bounds:
        out[start:end] = _sdpa(q[start:end], k[start:end], v[start:end])
    return out


def _sdpa(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    # (L_i, H, dh) -> (1, H, L_i, dh) -> SDPA (default scale 1/sqrt(dh)) -> (L_i, H, dh)
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None])
    return o[0].transpose(0, 1)


def sdpa_uniform(q: Tensor, k: Tensor, v: Tensor, meta: VarlenMeta) -> Tensor:
    """N equal segments of length meta.uniform as one batched SDPA call on (N, H, L_i, dh) views; no copies."""
    n, seg = len(meta.bounds), meta.uniform
    qb, kb, vb = (t.unflatten(0, (n, seg)).transpose(1, 2) for t in (q, k, v))  # (N, H, L_i, dh) strided views
    return F.scaled_dot_product_attention(qb, kb, vb).transpose(1, 2).flatten(0, 1)  # (L, H, dh)


def long_segments_on_sdpa(
    varlen: AttentionFn,
    long_segment: int = LONG_SEGMENT,
    uniform_batched: bool = False,
    streams: tuple[torch.cuda.Stream, ...] = (),
    uniform_below: int = _UNBOUNDED,
) -> AttentionFn:
    """Wrap a varlen backend: short segments go through it together, long ones one by one through SDPA.

    uniform_batched: a batch of equal segments (more than one) goes through one batched SDPA call instead;
    uniform_below: only when they are shorter than this.
    streams: side CUDA streams (none: everything on the caller's stream). With them, the runs of a mixed batch
    (each long segment, each stretch of short ones) are issued round-robin on the side streams, so that one
    image's attention can fill the SMs left idle by the last wave of the previous one (an image of 2-6k patches
    is only 16 heads x L/64 tiles). Each run writes its own rows of the output; the side streams wait for the
    caller's stream first (q, k, v ready) and the caller's stream waits for all of them after (every row written),
    so no tensor is used across streams without ordering; no host sync.
    """

    def run_one(q: Tensor, k: Tensor, v: Tensor, run: Run) -> Tensor:
        s, e = run.start, run.end
        return _sdpa(q[s:e], k[s:e], v[s:e]) if run.meta is None else varlen(q[s:e], k[s:e], v[s:e], run.meta)

    def hybrid(q: Tensor, k: Tensor, v: Tensor, meta: VarlenMeta) -> Tensor:
        if uniform_batched and meta.uniform and len(meta.bounds) > 1 and meta.uniform < uniform_below:
            return sdpa_uniform(q, k, v, meta)
        if meta.max_seqlen < long_segment:
            return varlen(q, k, v, meta)
        runs = meta.runs(long_segment)
        if len(runs) == 1:
            return _sdpa(q, k, v)
        out = torch.empty_like(q)  # (L, H, dh)
        if not streams:
            for run in runs:
                out[run.start : run.end] = run_one(q, k, v, run)
            return out
        caller = torch.cuda.current_stream(q.device)
        for side in streams:
            side.wait_stream(caller)
        for i, run in enumerate(runs):
            with torch.cuda.stream(streams[i % len(streams)]):
                out[run.start : run.end] = run_one(q, k, v, run)
        for side in streams:
            caller.wait_stream(side)
        return out

    suffix = ("+uniform" if uniform_batched else "") + (f"+streams{len(streams)}" if streams else "")
    hybrid.__name__ = f"{varlen.__name__}+sdpa{suffix}"
    return hybrid


SDPA_BACKENDS = ("cudnn", "flash", "efficient")  # names for `prefer_sdpa_backend`


def prefer_sdpa_backend(fn: AttentionFn, backend: str) -> AttentionFn:
    """Run `fn` with SDPA trying `backend` first (then the others): torch's default order may not be the fastest
    for dh = 72 on a given GPU. A context manager around the call: no sync, a few microseconds of Python."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    by_name = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }
    order = [by_name[backend], *(b for n, b in by_name.items() if n != backend), SDPBackend.MATH]

    def preferred(q: Tensor, k: Tensor, v: Tensor, meta: VarlenMeta) -> Tensor:
        with sdpa_kernel(order, set_priority=True):
            return fn(q, k, v, meta)

    preferred.__name__ = f"{fn.__name__}@{backend}"
    return preferred


def _flash_attn_backend(device: torch.device) -> AttentionFn | None:
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None

    def flash_attn(q: Tensor, k: Tensor, v: Tensor, meta: VarlenMeta) -> Tensor:
        cu = meta.cu_seqlens_device
        scale = 1.0 / math.sqrt(q.shape[-1])
        return flash_attn_varlen_func(q, k, v, cu, cu, meta.max_seqlen, meta.max_seqlen, softmax_scale=scale)

    return flash_attn


def _flash_attn_cute_backend(device: torch.device) -> AttentionFn | None:
    if torch.cuda.get_device_capability(device)[0] not in (9, 10, 11):  # its kernels: Hopper and Blackwell only
        return None
    try:  # an optional install (flash-attn's flash_attn/cute with nvidia-cutlass-dsl); JIT-compiled on first call
        from flash_attn.cute import flash_attn_varlen_func as cute_varlen
    except Exception as exc:  # absent: quietly; present but not loading (a CUTLASS DSL mismatch): said once
        if not (isinstance(exc, ImportError) and exc.name in ("flash_attn", "flash_attn.cute")):
            logger.warning("flash_attn.cute is installed but does not load; not used", exc_info=True)
        return None

    def flash_attn_cute(q: Tensor, k: Tensor, v: Tensor, meta: VarlenMeta) -> Tensor:
        cu = meta.cu_seqlens_device
        out, _ = cute_varlen(  # keywords: the positional order changed between releases
            q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=meta.max_seqlen, max_seqlen_k=meta.max_seqlen
        )
        return out

    return flash_attn_cute


def _torch_varlen_backend(device: torch.device) -> AttentionFn | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None

    def torch_varlen(q: Tensor, k: Tensor, v: Tensor, meta: VarlenMeta) -> Tensor:
        cu = meta.cu_seqlens_device
        # Positional arguments only: the keyword set changed between torch 2.9 and 2.13; scale defaults to
        # 1/sqrt(dh). Row-strided q/k/v (unbound from one qkv tensor) are accepted; the probe checks that layout.
        return varlen_attn(q, k, v, cu, cu, meta.max_seqlen, meta.max_seqlen)

    return torch_varlen


def _probe(fn: AttentionFn, device: torch.device, dtype: torch.dtype, num_heads: int, head_dim: int) -> bool:
    """Run `fn` once on two small segments laid out as in the model (q, k, v unbound from one qkv tensor)
    and compare with `sdpa_segments`."""
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(40, 3, num_heads, head_dim, generator=gen).to(device=device, dtype=dtype)
    q, k, v = qkv.unbind(1)
    cu = torch.tensor([0, 24, 40], dtype=torch.int32)
    meta = VarlenMeta.from_cu_seqlens(cu, 24, cu.to(device))
    try:
        got = fn(q, k, v, meta)
        want = sdpa_segments(q, k, v, meta)
        return got.shape == want.shape and torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    except Exception:  # an unsupported head dim / arch / build: fall back, never fail the service
        logger.warning("attention backend %s failed its probe on %s/%s", fn.__name__, device, dtype, exc_info=True)
        return False


# name -> (constructor, keeps long segments): a backend that keeps them runs every segment itself; the others
# hand segments of `long_segment` patches or more to per-segment SDPA (and batches of equal ones to one batched
# SDPA call where asked). Tried in this order by "auto". Figures: docs/benchmarks/encoder.md.
VARLEN_BACKENDS: dict[str, tuple[Callable[[torch.device], AttentionFn | None], bool]] = {
    "flash_attn_cute": (_flash_attn_cute_backend, True),
    "flash_attn": (_flash_attn_backend, False),
    "torch_varlen": (_torch_varlen_backend, False),
}
ATTENTION_BACKENDS = ("auto", *VARLEN_BACKENDS, "sdpa")


def select_attention(
    device: torch.device | str,
    dtype: torch.dtype,
    num_heads: int,
    head_dim: int,
    *,
    backend: str = "auto",
    long_segment: int = LONG_SEGMENT,
    uniform_batched: bool = False,
    sdpa_backend: str = "auto",
    streams: int = 1,
) -> tuple[str, AttentionFn]:
    """The fastest working backend for this device and dtype: (name, fn). Call once, reuse the fn.

    backend: "auto" (the first of VARLEN_BACKENDS that loads and passes its probe, else "sdpa"), or one name of
    ATTENTION_BACKENDS to use only that one (falling back to "sdpa" if it cannot run here).
    sdpa_backend: "auto" (torch's order) or one of SDPA_BACKENDS to try first for the SDPA calls (CUDA only).
    streams: how many CUDA streams a mixed batch's per-segment calls are spread over (1: the caller's only).
    """
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend must be one of {ATTENTION_BACKENDS}, got {backend!r}")
    device = torch.device(device)
    names = [name for name in VARLEN_BACKENDS if backend in ("auto", name)]  # "sdpa": none
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        for name in names:
            make, keeps_long = VARLEN_BACKENDS[name]
            fn = make(device)
            if fn is None or not _probe(fn, device, dtype, num_heads, head_dim):
                continue
            # A backend that keeps long segments takes equal long ones too: batched SDPA only below long_segment.
            batch_below, to_sdpa_from = (long_segment, _UNBOUNDED) if keeps_long else (_UNBOUNDED, long_segment)
            routing = "every segment" if keeps_long else f"segments >= {long_segment} patches on sdpa"
            if uniform_batched:
                routing += "; equal segments batched on sdpa" + (f" below {batch_below} patches" if keeps_long else "")
            logger.info("attention backend: %s (%s) on %s/%s", name, routing, device, dtype)
            side = tuple(torch.cuda.Stream(device) for _ in range(streams)) if streams > 1 else ()
            hybrid = long_segments_on_sdpa(fn, to_sdpa_from, uniform_batched, side, batch_below)
            name += f"+streams{streams}" if side else ""
            if sdpa_backend != "auto":
                return f"{name}+sdpa@{sdpa_backend}", prefer_sdpa_backend(hybrid, sdpa_backend)
            return name, hybrid
    logger.info("attention backend: sdpa (per segment) on %s/%s", device, dtype)
    return "sdpa", sdpa_segments
