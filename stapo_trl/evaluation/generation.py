"""Prompts, sampling (transformers or vLLM) and grading: [`evaluate_problems`], the one loop of every evaluation."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections import namedtuple

from .. import data
from ..grading import grade
from .tasks import BenchmarkProblem, benchmark_metrics


logger = logging.getLogger(__name__)
DecodingSetting = namedtuple("DecodingSetting", "name temperature top_p")
DECODINGS = {name: DecodingSetting(name, t, p) for name, t, p in  # the paper's two settings (Sec. 4), and argmax
             (("t1.0-p1.0", 1.0, 1.0), ("t0.7-p0.9", 0.7, 0.9), ("greedy", 0.0, 1.0))}  # fmt: skip
DECODING_ALIASES = {"paper": ("t1.0-p1.0", "t0.7-p0.9")}
DECODING_NAMES = ", ".join([*DECODING_ALIASES, *DECODINGS, "t<temperature>-p<top_p> (e.g. t0.6-p0.95)"])
DEFAULT_MAX_NEW_TOKENS = 20480  # the paper's generation budget
GeneratedSample = namedtuple("GeneratedSample", "text num_tokens finished")


def decoding_setting(name: str) -> DecodingSetting:
    """A [`DECODINGS`] name or `t<temperature>-p<top_p>` (top-p in (0, 1]); else `ValueError` naming the valid ones."""
    match = re.fullmatch(r"t(\d+(?:\.\d+)?)-p(\d+(?:\.\d+)?)", name)
    if name not in DECODINGS and (match is None or not 0 < float(match[2]) <= 1):
        raise ValueError(f"Unknown decoding {name!r}. Valid decodings: {DECODING_NAMES}.")
    return DECODINGS.get(name) or DecodingSetting(name, float(match[1]), float(match[2]))


def build_prompt_text(tokenizer, problem, use_chat_template: bool = True, chat_template_kwargs=None) -> str:
    """A problem (text or chat) as training renders it (`ValueError` without a chat template), or its last message."""
    messages = data.format_prompt(problem) if isinstance(problem, str) else problem
    if not use_chat_template:
        return messages[-1]["content"]
    if not data.has_chat_template(tokenizer):
        what, fix = "The evaluation prompts are", data.EVAL_CHAT_TEMPLATE_FIX
        raise ValueError(data.chat_template_message(tokenizer.name_or_path, what, fix))
    return data.render_chat_template(tokenizer, messages, **(chat_template_kwargs or {}))


def _seeded_sampler(temperature: float, top_p: float, seeds: list[int], steps: list | None = None):
    """Samples row r from a stream seeded `seeds[r]`; `steps` gets the (B,) entropy (nats) and drawn token's prob."""
    import torch
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

    warp = LogitsProcessorList([TemperatureLogitsWarper(temperature)] + [TopPLogitsWarper(top_p)] * (top_p < 1.0))
    streams = [torch.Generator().manual_seed(seed) for seed in seeds]

    def sample(input_ids, scores):  # scores: (B, V) float32 logits
        probs = warp(input_ids, scores).softmax(-1)
        cdf = probs.cumsum(-1, dtype=torch.float64)  # (B, V)
        u = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in streams]).to(cdf.device)  # (B,)
        token = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).clamp_(max=cdf.shape[1] - 1)
        if steps is not None:
            steps.append((-(probs * probs.log()).nansum(-1), probs.gather(1, token).squeeze(1)))
        return torch.full_like(scores, -torch.inf).scatter_(1, token, 0.0)

    return sample


def hf_generate(model, tokenizer, prompts, *, n, temperature, top_p, max_new_tokens, seeds, batch_size=64, stats=None):
    """(P, n) [`GeneratedSample`]s from `generate` (no `top_k`; temperature 0: argmax), sample j of prompt i seeded
    `seeds[i] + j` whatever the batch; `stats` gets the `entropy` and `prob` of every sampled token up to its eos."""
    import torch
    from transformers import GenerationConfig

    eos = getattr(model.generation_config, "eos_token_id", None)
    eos = tokenizer.eos_token_id if eos is None else eos
    eos = [] if eos is None else list(eos) if isinstance(eos, (list, tuple)) else [eos]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or [0])[0]
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos or None,
                              pad_token_id=pad)  # fmt: skip
    flat, out = [(i, j) for i in range(len(prompts)) for j in range(n)], [[None] * n for _ in prompts]
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(flat), batch_size):
            chunk, steps = flat[start : start + batch_size], [] if stats is not None else None
            enc = tokenizer([prompts[i] for i, _ in chunk], return_tensors="pt", padding=True, padding_side="left",
                            add_special_tokens=False).to(model.device)  # fmt: skip
            chunk_seeds = [seeds[i] + j for i, j in chunk]
            sampler = [_seeded_sampler(temperature, top_p, chunk_seeds, steps)] if temperature else []
            generated = model.generate(**enc, generation_config=config, logits_processor=sampler)  # under no_grad
            recorded = [torch.stack(values, 1).tolist() for values in zip(*steps)] if steps else []  # (B, T) each
            for r, (row, (i, j)) in enumerate(zip(generated[:, enc["input_ids"].shape[1] :].tolist(), chunk)):
                end, stop = next(((t + 1, True) for t, token in enumerate(row) if token in eos), (len(row), False))
                out[i][j] = GeneratedSample(tokenizer.decode(row[:end], skip_special_tokens=True), end, stop)
                for key, values in zip(("entropy", "prob"), recorded):
                    stats.setdefault(key, []).extend(values[r][:end])
    finally:
        model.train(was_training)
    return out


class HFGenerator:
    """`--backend hf`: [`hf_generate`], `load_causal_lm` on `device` (`cuda` if any), `dtype="auto"`: bf16 on a GPU."""

    def __init__(self, model: str, revision: str | None = None, dtype: str = "auto", device=None, batch_size=64):
        import torch

        from ..models.loading import load_causal_lm

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        auto = torch.bfloat16 if device.startswith("cuda") else torch.float32
        self.model, self.tokenizer = load_causal_lm(model, revision=revision, dtype=getattr(torch, dtype, auto))
        self.model, self.batch_size = self.model.to(device), batch_size

    def generate(self, prompt_texts, **sampling):
        return hf_generate(self.model, self.tokenizer, prompt_texts, batch_size=self.batch_size, **sampling)


def vllm_max_lora_rank(adapter: str) -> int:
    """The smallest vLLM `max_lora_rank` holding the adapter's `r` and `rank_pattern`; `ValueError` above 512."""
    with open(os.path.join(adapter, "adapter_config.json"), encoding="utf-8") as f:
        rank = max(map(int, [(c := json.load(f)).get("r", 8), *(c.get("rank_pattern") or {}).values()]))
    if rank > 512:
        raise ValueError(f"{adapter}: LoRA rank {rank} is above vLLM's largest max_lora_rank 512.")
    return next(r for r in (1, 8, 16, 32, 64, 128, 256, 320, 512) if r >= rank)  # vllm.config.lora.MaxLoRARanks


class VLLMGenerator:
    """`--backend vllm`: `vllm.LLM(model, **llm_kwargs)`; a LoRA adapter folder served on its base model.
    `gpu_memory_utilization=None`: 0.9 on a GPU, 0.2 on the CPU backend. `RuntimeError` without vLLM."""

    def __init__(self, model: str, gpu_memory_utilization: float | None = None, **llm_kwargs):
        try:
            from vllm import LLM, SamplingParams
        except ImportError as e:
            fix = "On a GPU: pip install 'stapo_trl[vllm]'; on a CPU: `make install-vllm` or --backend hf."
            raise RuntimeError(f"--backend vllm needs vLLM, which is not installed. {fix}") from e
        from ..integrations.vllm_support import llm_platform_kwargs
        from ..models.loading import resolve_model_source

        self._sampling_params, self._lora = SamplingParams, {}
        source, kwargs = resolve_model_source(model), llm_platform_kwargs(gpu_memory_utilization)
        if source.adapter is not None:
            from vllm.lora.request import LoRARequest

            self._lora = {"lora_request": LoRARequest("adapter", 1, source.adapter)}
            kwargs |= {"enable_lora": True, "max_lora_rank": vllm_max_lora_rank(source.adapter)}
            if os.path.isfile(os.path.join(source.adapter, "tokenizer_config.json")):
                kwargs["tokenizer"] = source.adapter
            logger.info("Serving the LoRA adapter %s on its base model %s (vLLM enable_lora)", model, source.base)
        self.llm = LLM(model=source.base, **kwargs, **llm_kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompt_texts, *, n, temperature, top_p, max_new_tokens, seeds):
        """(P, n) [`GeneratedSample`]s; prompt i seeded `seeds[i]` (vLLM seeds sample j with seed + j)."""
        sampling = {"n": n, "temperature": temperature, "top_p": top_p, "max_tokens": max_new_tokens}
        params = [self._sampling_params(**sampling, seed=seed) for seed in seeds]
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in prompt_texts]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in ids], params, **self._lora)
        sample = lambda o: GeneratedSample(o.text, len(o.token_ids), o.finish_reason == "stop")  # noqa: E731
        return [[sample(o) for o in r.outputs] for r in outputs]


def evaluate_problems(generate_fn, tokenizer, problems: list[BenchmarkProblem], *, n: int, decoding: DecodingSetting,
                      max_new_tokens: int, seed: int = 0, use_chat_template: bool = True, chat_template_kwargs=None,
                      save_completions: bool = False, max_positions: int | None = None, accelerator=None):  # fmt: skip
    """(table, P * n records): `n` graded samples per problem, sample j of problem i seeded `seed + i * n + j`; table:
    [`benchmark_metrics`], counts. Prompts over `max_positions` dropped (`ValueError` if all); `accelerator`: split."""
    texts = [build_prompt_text(tokenizer, p.problem, use_chat_template, chat_template_kwargs) for p in problems]
    keep = list(range(len(problems)))
    if max_positions is not None:
        lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        budget = data.prompt_token_budget(max_positions, max_new_tokens)
        keep = data.keep_short_prompts(lengths, budget, what=f"{problems[0].benchmark} prompts")
    local = keep
    if accelerator is not None and accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        with accelerator.split_between_processes(keep, apply_padding=True) as shard:
            local = list(shard)
    start = time.perf_counter()
    sampling = {"temperature": decoding.temperature, "top_p": decoding.top_p, "max_new_tokens": max_new_tokens}
    generations = generate_fn([texts[i] for i in local], n=n, seeds=[seed + i * n for i in local], **sampling)
    generated = time.perf_counter()
    graded = [(i, [
        {"benchmark": problems[i].benchmark, "decoding": decoding.name, "id": problems[i].id, "sample": j,
         "extracted": r.extracted, "correct": r.correct, "grader_error": r.error, "num_tokens": sample.num_tokens,
         "finished": sample.finished} | ({"completion": sample.text} if save_completions else {})
        for j, sample in enumerate(samples) for r in [grade(sample.text, problems[i].gold)]
    ]) for i, samples in zip(local, generations)]  # fmt: skip
    by_index = dict(graded if local is keep else gather_object(graded))
    records = [record for i in keep for record in by_index[i]]
    correct = [[r["correct"] for r in by_index[i]] for i in keep]
    table = benchmark_metrics(correct, n, problems[0].benchmark if problems else None, [problems[i].id for i in keep])
    table.update(num_grader_errors=sum(r["grader_error"] is not None for r in records),
                 num_truncated=sum(not r["finished"] for r in records),
                 mean_completion_tokens=sum(r["num_tokens"] for r in records) / len(records) if records else None,
                 generation_time_s=round(generated - start, 3),
                 grading_time_s=round(time.perf_counter() - generated, 3))  # fmt: skip
    return table, records
