"""The CUDA IPC transport: an exported pool on the encoder's GPU, the consumer's handle cache, the probe (docs/ipc.md)."""
