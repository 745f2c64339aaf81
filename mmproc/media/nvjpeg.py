"""Batched JPEG decode on a CUDA device with nvImageCodec (the `nvidia-nvimgcodec-cu13` wheel, optional).

nvJPEG's interpolated chroma upsampling (`fancy_upsampling`) is what keeps the pixels close to libjpeg's, which
Pillow uses (at most 3 levels in rare pixels, docs/benchmarks/preprocess.md); torchvision's nvJPEG decode is up to
120 levels off. Only GPU backends: nvImageCodec's CPU fallback would decode untrusted bytes inside the server process,
which the isolated decode workers exist to avoid. Any failure is per image and means "decode it on the CPU".
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from mmproc.errors import ConfigError

logger = logging.getLogger(__name__)


class NvJpegDecoder:
    """One nvImageCodec decoder bound to `device`; `decode` is called from one thread at a time."""

    def __init__(self, device: torch.device, cpu_threads: int) -> None:
        try:
            from nvidia import nvimgcodec
        except ImportError as exc:
            raise ConfigError(
                f"GPU JPEG decode needs nvImageCodec (pip install nvidia-nvimgcodec-cu13): {exc}"
            ) from exc
        gpu_backends = [nvimgcodec.Backend(kind) for kind in (nvimgcodec.BackendKind.GPU_ONLY,
                                                              nvimgcodec.BackendKind.HYBRID_CPU_GPU)]  # fmt: skip
        self._decoder = nvimgcodec.Decoder(
            device_id=device.index or 0,
            max_num_cpu_threads=cpu_threads,
            backends=gpu_backends,
            options=":fancy_upsampling=1",
        )
        self._params = nvimgcodec.DecodeParams(
            sample_format=nvimgcodec.SampleFormat.I_RGB, apply_exif_orientation=False
        )
        self.device = device

    def decode(self, files: list[bytes], stream: torch.cuda.Stream) -> list[Tensor | None]:
        """(H, W, 3) uint8 tensors on the device, ordered on `stream`; None where an image did not decode."""
        try:
            images = self._decoder.decode(files, params=self._params, cuda_stream=stream.cuda_stream)
        except Exception as exc:  # noqa: BLE001 - a batch-level failure: find the culprits one by one
            if len(files) == 1:
                logger.debug("GPU JPEG decode failed: %s: %.200s", type(exc).__name__, exc)
                return [None]
            return [self.decode([f], stream)[0] for f in files]
        return [self._tensor(image, stream) for image in images]

    def _tensor(self, image: object, stream: torch.cuda.Stream) -> Tensor | None:
        if image is None:
            return None
        pixels = torch.from_dlpack(image.to_dlpack(cuda_stream=stream.cuda_stream))
        if pixels.dtype != torch.uint8 or pixels.dim() != 3 or pixels.shape[2] != 3 or pixels.device != self.device:
            return None
        return pixels
