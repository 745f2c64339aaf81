"""`mmproc bench ...`: the user-facing load generators and model benchmarks, installed with the wheel (each
exposes `main(argv) -> int`; catalog.py maps names to modules). They talk to a server over its API or run the
core (mmproc) in-process, and never import service/."""
