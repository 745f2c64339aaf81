"""The top floor: the `mmproc` CLI, settings and flags (the only reader of the environment), and the composition
that builds the pipeline, the front ends and the observers from them and runs the process."""
