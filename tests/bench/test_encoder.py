"""`mmproc bench encoder` on the CPU with the tiny preset: the bench's own code (variants, --profile, --json) runs
end to end before it meets a GPU, and the profile's kernel categories are right for real CUDA kernel names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mmproc.batching import pack_images
from mmproc.bench import forward as bench
from mmproc.bench.profile import CATEGORIES, categorize, profile_forward, summarize
from mmproc.models import load_encoder
from mmproc.types import PreprocessedImage

# Kernel names as the CUDA profiler reports them on an H200 (torch 2.11, cuBLAS 13, cuDNN 9), abbreviated.
GPU_KERNELS = {
    "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NNT": "gemm",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off": "gemm",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_align8>": "gemm",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x72_4x1x1_kernel0_0": "attention",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<96, 128, 64, 4, false, cutlass::bfloat16_t>>": (
        "attention"
    ),
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t>::Params)": (
        "attention"
    ),
    "_rope_kernel": "rope",
    "_add_layer_norm_kernel": "layernorm/add-norm",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>": (
        "layernorm/add-norm"
    ),
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
    "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}>": "elementwise/gelu",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>": (
        "elementwise/gelu"
    ),
    "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::direct_copy_kernel_cuda("
    "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}>": "copies/H2D",
    "Memcpy HtoD (Pinned -> Device)": "copies/H2D",
    "Memcpy DtoD (Device -> Device)": "copies/H2D",
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<c10::BFloat16, unsigned int, 2, 64, 64>": (
        "copies/H2D"
    ),
    "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>": (
        "copies/H2D"
    ),
    "void at::native::(anonymous namespace)::upsample_bicubic2d_out_frame<float, float>": "other",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>>>": "other",
    "void at::native::property_kernel<float>": "other",  # "property" contains "rope": must not be RoPE
}


@pytest.mark.parametrize("name", sorted(GPU_KERNELS))
def test_gpu_kernel_names_fall_in_the_right_category(name: str) -> None:
    assert categorize(name) == GPU_KERNELS[name]


def test_cpu_op_names_fall_in_the_right_category() -> None:
    assert categorize("aten::addmm") == categorize("aten::_addmm_activation") == "gemm"
    assert categorize("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert categorize("aten::native_layer_norm") == "layernorm/add-norm"
    assert categorize("aten::gelu") == categorize("aten::add") == "elementwise/gelu"
    assert categorize("aten::copy_") == categorize("aten::index_select") == categorize("aten::cat") == "copies/H2D"
    assert categorize("aten::empty") == "other"


def test_summarize_groups_times_and_counts_calls() -> None:
    rows = [("nvjet_a", 0.0, 3000.0), ("nvjet_a", 5.0, 1000.0), ("_rope_kernel", 9.0, 500.0), ("Memcpy HtoD", 1, 500)]
    report = summarize(rows, forward_ms=10.0, top=2)
    by_cat = {c["category"]: c for c in report["categories"]}
    assert [c["category"] for c in report["categories"]] == list(CATEGORIES)
    assert by_cat["gemm"]["ms"] == pytest.approx(4.0) and by_cat["gemm"]["pct"] == pytest.approx(40.0)
    assert by_cat["rope"]["ms"] == pytest.approx(0.5) and by_cat["copies/H2D"]["ms"] == pytest.approx(0.5)
    assert report["busy_ms"] == pytest.approx(5.0) and report["idle_ms"] == pytest.approx(5.0)
    assert report["launches"] == 4
    assert [(k["name"], k["calls"]) for k in report["top_kernels"]] == [("nvjet_a", 2), ("_rope_kernel", 1)]


def test_device_rows_keep_gpu_kernels_only() -> None:
    # The CUDA branch of the profile reads FunctionEvents like these (no GPU here: stand-ins with the same fields).
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from mmproc.bench.profile import _device_rows

    def event(name, device, start, dur, annotation=False):
        span = SimpleNamespace(start=start, elapsed_us=lambda: dur)
        return SimpleNamespace(name=name, device_type=device, time_range=span, is_user_annotation=annotation)

    events = [
        event("aten::addmm", DeviceType.CPU, 0.0, 50.0),  # the launching op: host time, not GPU time
        event("cudaLaunchKernel", DeviceType.CPU, 1.0, 5.0),
        event("nvjet_hsh_256x128", DeviceType.CUDA, 10.0, 300.0),
        event("Memcpy HtoD (Pinned -> Device)", DeviceType.CUDA, 2.0, 40.0),
        event("forward", DeviceType.CUDA, 0.0, 900.0, annotation=True),  # a range, not a kernel
    ]
    rows = _device_rows(events)
    assert rows == [("nvjet_hsh_256x128", 10.0, 300.0), ("Memcpy HtoD (Pinned -> Device)", 2.0, 40.0)]


@torch.inference_mode()
def test_profile_forward_on_cpu_accounts_for_the_forward() -> None:
    model = load_encoder(None, preset="tiny")
    gen = torch.Generator().manual_seed(0)
    images = [PreprocessedImage(torch.rand(h * w, 3, 14, 14, generator=gen), (h, w), h * w // 4) for h, w in [(8, 6)]]
    batch = pack_images(images)
    model(batch)  # warm
    report = profile_forward(model, batch, torch.device("cpu"))
    assert report["activity"] == "cpu" and report["forward_ms"] > 0 and report["launches"] > 10
    by_cat = {c["category"]: c["ms"] for c in report["categories"]}
    assert by_cat["gemm"] > 0 and by_cat["attention"] > 0 and by_cat["layernorm/add-norm"] > 0
    # Self times of the ops of one forward cannot exceed the forward's wall time (up to timer granularity).
    assert report["busy_ms"] <= report["forward_ms"] * 1.05 + 0.5
    assert 0 < len(report["top_kernels"]) <= 15


def test_bench_runs_on_cpu_with_variants_profile_and_json(tmp_path, capsys) -> None:
    out = tmp_path / "encoder.json"
    argv = ["--device", "cpu", "--preset", "tiny", "--dtype", "float32", "--workloads", "112x3", "--reps", "1"]
    assert bench.main([*argv, "--warmup", "0", "--variants", "--profile", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "profile 112x3" in printed and "no-fused-add-norm" in printed and "FAILED" not in printed
    record = json.loads(out.read_text())
    impls = [r["impl"] for r in record["results"]]
    assert impls[:3] == ["mmproc", "mmproc-b2b", "eager-baseline"] and "no-fused-add-norm" in impls
    b2b = record["results"][1]  # forwards issued back to back: the runner's steady state, same work per forward
    assert b2b["workload"] == "112x3" and b2b["ms"] > 0 and b2b["images"] == record["results"][0]["images"]
    assert "f32-pixels" not in impls  # float32 on the CPU already ships float32 pixels
    assert all("ms" in r and "error" not in r for r in record["results"])
    assert record["pixel_dtype"] == "float32" and len(record["kernels"]) == 4
    (profile,) = record["profiles"]
    assert profile["workload"] == "112x3" and profile["activity"] == "cpu"
    assert [c["category"] for c in profile["categories"]] == list(CATEGORIES)
    assert profile["top_kernels"] and all({"name", "ms", "calls", "pct"} <= set(k) for k in profile["top_kernels"])


def test_bench_without_profile_never_imports_the_profiler(tmp_path) -> None:
    # The flag off must cost nothing: the profiling module (the only caller of torch.profiler) is never imported.
    # A subprocess gives fresh imports.
    import subprocess
    import sys

    code = (
        "import sys; from mmproc.bench import forward as b; "
        "assert b.main(['--device', 'cpu', '--preset', 'tiny', '--dtype', 'float32', '--workloads', '56x2', "
        "'--reps', '1', '--warmup', '0', '--no-baseline']) == 0; "
        "assert 'mmproc.bench.profile' not in sys.modules, 'imported'"
    )
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_failing_variant_is_reported_and_the_bench_goes_on(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(bench.VARIANTS, "broken", {"no_such_option": True})
    out = tmp_path / "encoder.json"
    argv = ["--device", "cpu", "--preset", "tiny", "--dtype", "float32", "--workloads", "56x2", "--reps", "1"]
    assert bench.main([*argv, "--warmup", "0", "--variants", "--no-baseline", "--json", str(out)]) == 0
    rows = {r["impl"]: r for r in json.loads(out.read_text())["results"]}
    assert "error" in rows["broken"] and "ms" in rows["no-fused-add-norm"]
    assert "broken FAILED" in capsys.readouterr().out
