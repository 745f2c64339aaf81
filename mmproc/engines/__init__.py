"""Engine adapters: `mmproc.engines.vllm` (an EC connector for vLLM) and `mmproc.engines.sglang` (SGLang's
precomputed-embedding items). Each imports its engine only when imported itself; see docs/engines.md."""
