"""The process around the server: the `mmproc` CLI, settings and flags (the only reader of the environment), the
app that builds and runs everything, logs, metrics, host memory, CPU count, protobuf codegen."""
