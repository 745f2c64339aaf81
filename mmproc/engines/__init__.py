"""Engine adapters: `mmproc.engines.vllm` (an EC connector for vLLM; it imports vLLM only when imported itself).
SGLang needs none: mmproc serves its encoder protocol (service/frontends/sglang/). See docs/engines.md."""
