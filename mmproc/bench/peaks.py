"""Peak rates for MFU, only for a device and dtype whose peak was measured on that device (else no MFU)."""

from __future__ import annotations

import torch

# (substring of torch.cuda.get_device_name, dtype) -> dense matmul TFLOP/s measured on that GPU
# (docs/benchmarks/encoder.md: H200, bf16 GEMM rate).
MEASURED_PEAKS: dict[tuple[str, torch.dtype], float] = {
    ("H200", torch.bfloat16): 790.0,
}


def device_peak(device: torch.device, dtype: torch.dtype) -> tuple[float | None, str]:
    """(TFLOP/s or None, where it comes from / why there is none) for the device actually used."""
    if device.type != "cuda":
        return None, f"no MFU: no peak is known for {device.type} (give --peak TFLOP/s for one)"
    name = torch.cuda.get_device_name(device)
    for (part, peak_dtype), peak in MEASURED_PEAKS.items():
        if part in name and peak_dtype == dtype:
            return peak, f"peak {peak:.0f} TFLOP/s ({name}, {str(dtype).removeprefix('torch.')}, measured)"
    return None, f"no MFU: no measured peak for {name} in {str(dtype).removeprefix('torch.')} (give --peak TFLOP/s)"
