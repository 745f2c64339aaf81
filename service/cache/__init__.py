"""The embedding cache in front of the engine: content keys, the eviction policy, the bounded store, the encoder
that asks it first (docs/cache.md)."""
