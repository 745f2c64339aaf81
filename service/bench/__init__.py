"""`mmproc bench ...`: GPU micro-benchmarks, one module per subject (each exposes `main(argv) -> int`)."""
