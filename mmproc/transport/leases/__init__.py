"""Leases of a pool that hands out memory: sessions, slices, generations, readers, holds (docs/ipc.md)."""
