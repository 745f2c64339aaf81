"""The CUDA IPC transport: one exported pool on the encoder's GPU, its device words, the consumer's handle cache, and the start-up probe (docs/ipc.md)."""
