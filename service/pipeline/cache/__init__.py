"""The embedding cache, a step in front of decode: content keys, the eviction policy, the bounded store, and the
encoder that asks it first (docs/cache.md)."""
