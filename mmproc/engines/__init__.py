"""Engine adapters: `mmproc.engines.vllm*` (vLLM: front-end helpers and the `mmproc-vllm-proxy` OpenAI front without
vLLM, the EC connector in `vllm_connector`). SGLang needs none: mmproc serves its encoder protocol
(service/frontends/sglang/). See docs/engines.md."""
