"""Engine adapters: `mmproc.engines.vllm*` (vLLM: front-end helpers and the `mmproc-vllm-proxy` OpenAI front without
vLLM, the EC connector in `vllm_connector`) and `mmproc.engines.sglang` (SGLang's precomputed-embedding items). Each
imports its engine only when imported itself; see docs/engines.md."""
