"""The embedding cache, a step in front of decode (docs/cache.md)."""
