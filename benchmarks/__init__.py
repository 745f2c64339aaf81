"""Kernel and transport micro-benchmarks, run from a checkout (`python3 -m benchmarks.rope_kernels --help`, or
`mmproc bench NAME` from an editable install); not in the wheel. They may import mmproc and service, never the
reverse."""
