"""Keys of the embedding cache: "<context>:<mm_hash>", a hash of the raw bytes bound to everything that changes
the output, which the client never chooses (docs/cache.md; xxh3 is not collision-resistant: blake3 for tenants
that do not trust each other)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import xxhash

HASHES = ("xxh3", "blake3")
MAX_MM_HASH_CHARS = 128


def content_hash(data: bytes, algorithm: str) -> str:
    """mm_hash of raw bytes: "<algorithm>:<hex>"."""
    if algorithm == "xxh3":
        return "xxh3:" + xxhash.xxh3_128_hexdigest(data)
    if algorithm == "blake3":
        import blake3  # optional: only a server configured for it needs the wheel

        return "blake3:" + blake3.blake3(data).hexdigest()
    raise ValueError(f"cache hash must be one of {HASHES}, got {algorithm!r}")


def checkpoint_fingerprint(model_path: Path) -> str:
    """config.json's bytes and each weight file's name, size and mtime (no weights read at start-up)."""
    digest = hashlib.sha256()
    path = Path(model_path)
    for file in sorted(path.iterdir()):
        if file.name.endswith((".json", ".safetensors")):
            stat = file.stat()
            digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
            if file.name == "config.json":
                digest.update(file.read_bytes())
    return digest.hexdigest()[:32]


class CacheKeys:
    """Key maker of one server configuration. `context` says what the model and preprocessing are."""

    def __init__(self, algorithm: str, context: str) -> None:
        content_hash(b"", algorithm)  # validates the name (and that blake3 is installed when chosen)
        self.algorithm = algorithm
        self.context = xxhash.xxh3_128_hexdigest(context.encode())

    def mm_hash(self, data: bytes) -> str:
        return content_hash(data, self.algorithm)

    def key(self, mm_hash: str, overrides: str = "") -> str:
        """The cache key of an image by its mm_hash, with the request's overrides (none exist yet: "")."""
        return f"{self.context}:{mm_hash}" + (f":{overrides}" if overrides else "")


def model_context(
    *,
    model: str,
    model_path: Path | None,
    dtype: str,
    device_type: str,
    preprocess: object,
    exif: bool,
    quantization: str = "none",
) -> str:
    """Everything of the server configuration that changes an image's embedding, as one string (an fp8 server's
    embeddings never answer a bf16 server's requests: quantization is part of it)."""
    identity = f"checkpoint:{checkpoint_fingerprint(model_path)}" if model_path is not None else f"preset:{model}"
    quant = f"|quantization={quantization}" if quantization != "none" else ""  # "none" keeps the keys it had
    return f"{identity}|dtype={dtype}{quant}|device={device_type}|preprocess={preprocess!r}|exif={exif}"
