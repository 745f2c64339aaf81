"""Byte units, written once."""

MiB = 1 << 20
