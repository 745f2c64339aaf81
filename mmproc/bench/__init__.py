"""`mmproc bench ...`: the load generators and model benchmarks shipped in the wheel (each exposes `main(argv) -> int`);
they never import service/."""
