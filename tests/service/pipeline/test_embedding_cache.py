"""The embedding cache's parts without a server: keys, policies, the byte bound, the memory of invalid images."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmproc.errors import InvalidMediaError, Reason
from mmproc.preprocess import PreprocessConfig
from service.pipeline.cache.keys import CacheKeys, content_hash, model_context
from service.pipeline.cache.policy import POLICIES, LruPolicy, S3FifoPolicy
from service.pipeline.cache.store import CacheStore, Entry, InvalidImages


def context(**changes: object) -> str:
    values: dict[str, object] = {
        "model": "tiny", "model_path": None, "dtype": "float32", "device_type": "cpu",
        "preprocess": PreprocessConfig.default_for("kimi_vl"), "exif": True,
    }  # fmt: skip
    values.update(changes)
    return model_context(**values)  # type: ignore[arg-type]


def test_the_key_changes_with_model_dtype_preprocessing_and_exif_but_not_with_the_caller() -> None:
    data = b"\x89PNG same bytes"
    base = CacheKeys("xxh3", context())
    key = base.key(base.mm_hash(data))
    assert CacheKeys("xxh3", context()).key(base.mm_hash(data)) == key  # another server, same configuration
    pre = PreprocessConfig.default_for("kimi_vl")
    changed = [
        context(model="other"),
        context(dtype="bfloat16"),
        context(dtype="bfloat16", quantization="fp8"),
        context(device_type="cuda"),
        context(exif=False),
        context(preprocess=PreprocessConfig.default_for("kimi_k25")),
        context(preprocess=PreprocessConfig(**{**pre.__dict__, "in_token_limit": pre.in_token_limit // 2})),
    ]
    for other in changed:
        keys = CacheKeys("xxh3", other)
        assert keys.key(keys.mm_hash(data)) != key
    assert base.key(base.mm_hash(data + b"!")) != key
    store = CacheStore("host", 1 << 20, "s3fifo", on_evict=lambda e: None)
    store.put(key, Entry(None, key, 10))  # type: ignore[arg-type]
    other = CacheKeys("xxh3", context(dtype="bfloat16"))
    assert store.get(other.key(other.mm_hash(data))) is None  # a changed model is a miss


def test_checkpoint_identity_follows_the_files(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "kimi_vl"}')
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    first = context(model_path=tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"x" * 11)
    assert context(model_path=tmp_path) != first


def test_mm_hash_names_its_algorithm() -> None:
    assert content_hash(b"abc", "xxh3").startswith("xxh3:") and len(content_hash(b"abc", "xxh3")) == 5 + 32
    with pytest.raises(ValueError, match="cache hash"):
        content_hash(b"abc", "md5")
    pytest.importorskip("blake3")
    assert content_hash(b"abc", "blake3") != content_hash(b"abd", "blake3")


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(POLICIES),
    max_bytes=st.integers(1, 5000),
    ops=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 1500), st.integers(0, 5)), max_size=200),
)
def test_the_store_never_exceeds_its_byte_bound(policy: str, max_bytes: int, ops: list[tuple[int, int, int]]) -> None:
    """Random gets and puts; entries sometimes share a charge (a pool slice holding several images)."""
    evicted: list[Entry] = []
    store = CacheStore("pool", max_bytes, policy, on_evict=evicted.append)
    sizes: dict[int, int] = {}
    for key, size, group in ops:
        if store.get(f"k{key}") is not None:
            continue
        charge = ("slice", group) if group else ("own", key, size)
        nbytes = sizes.setdefault(group, size) if group else size
        kept = store.put(f"k{key}", Entry(None, charge, nbytes))  # type: ignore[arg-type]
        assert kept or nbytes > max_bytes or evicted
        assert store.nbytes <= max_bytes
        held = {}
        for entry in store.entries():
            held[entry.charge_key] = entry.charge_bytes
        assert store.nbytes == sum(held.values())  # each charge counted once
    store.clear()
    assert store.nbytes == 0 and len(store) == 0


def skewed_trace(seed: int, keys: int, length: int, one_hit_share: float) -> list[str]:
    """Zipf-like popular images (a chat's re-sent screenshots) mixed with images seen once (a batch job)."""
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(keys)]
    trace, fresh = [], 0
    for _ in range(length):
        if rng.random() < one_hit_share:
            fresh += 1
            trace.append(f"once-{fresh}")
        else:
            trace.append(f"hot-{rng.choices(range(keys), weights)[0]}")
    return trace


def hit_ratio(policy: str, trace: list[str], capacity: int) -> float:
    store = CacheStore("host", capacity, policy, on_evict=lambda e: None)
    hits = 0
    for key in trace:
        if store.get(key) is not None:
            hits += 1
        else:
            store.put(key, Entry(None, key, 1))  # type: ignore[arg-type]
    return hits / len(trace)


def test_s3fifo_keeps_the_popular_images_through_a_scan_of_one_hit_wonders() -> None:
    trace = skewed_trace(seed=7, keys=200, length=20_000, one_hit_share=0.5)
    assert hit_ratio("s3fifo", trace, 50) > hit_ratio("lru", trace, 50)


def test_policies_skip_entries_they_must_not_evict() -> None:
    for policy in (LruPolicy(100), S3FifoPolicy(100)):
        for key in "abc":
            policy.insert(key, 10)
        assert policy.victim(lambda k: k != "b") == "b"
        assert policy.victim(lambda k: True) is None
        assert len(policy) == 2 and "a" in policy and "c" in policy


def test_invalid_images_are_replayed_for_their_ttl_naming_the_new_index() -> None:
    invalid = InvalidImages(ttl_s=10, max_entries=2)
    error = InvalidMediaError("not an image", reason=Reason.UNDECODABLE, index=0)
    invalid.add("bad", error, now=100.0)
    with pytest.raises(InvalidMediaError) as raised:
        invalid.check("bad", 3, now=105.0)
    assert (raised.value.index, raised.value.reason, raised.value.message) == (3, "undecodable", "not an image")
    invalid.check("bad", 3, now=110.0)  # expired: decoded again
    assert len(invalid) == 0 and invalid.replayed == 1
    for key in ("x", "y", "z"):
        invalid.add(key, error, now=200.0)
    assert len(invalid) == 2  # bounded: the oldest went
