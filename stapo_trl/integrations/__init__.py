"""Where stapo_trl meets other libraries' edges: vLLM on the CPU (`vllm_support`, `vllm_cpu_serve`) and the process
group at exit (`process_group`)."""
