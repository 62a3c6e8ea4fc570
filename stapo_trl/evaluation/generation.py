"""Prompts, sampling and grading: the one sampling loop of `stapo-eval` and of the evaluations during training.

- [`hf_generate`] samples n completions per prompt with transformers `generate` (top-k off, as vLLM); [`HFGenerator`]
  and [`VLLMGenerator`] are the two `stapo-eval` backends with the same `generate` signature.
- [`evaluate_problems`] builds the prompts as training does, samples, grades ([`stapo_trl.grading.grade`]) and
  scores one benchmark under one decoding (`stapo-eval`, [`~stapo_trl.evaluation.callback.BenchmarkEvalCallback`]).
- [`evaluate_avg_at_k`] is the held-out before/after evaluation of `stapo-train` (`eval_before_after`): the same
  [`hf_generate`] loop over conversational prompts, split across processes.

transformers, torch and vllm are imported inside the functions that use them, so that `stapo-eval --help` and
`--compare` stay fast.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..checks.dataset import EVAL_CHAT_TEMPLATE_FIX, chat_template_message, has_chat_template
from ..grading import grade
from ..preflight import count_prompt_tokens, keep_short_prompts, prompt_token_budget
from .metrics import benchmark_metrics
from .tasks import BenchmarkProblem


logger = logging.getLogger(__name__)


_DEFAULT_INSTRUCTION = "default"  # sentinel: stapo_trl.data.INSTRUCTION


@dataclass(frozen=True)
class DecodingSetting:
    """A sampling setting of the paper's evaluation.

    Args:
        name (`str`): key in results files (`t1.0-p1.0`).
        temperature (`float`): softmax temperature.
        top_p (`float`): nucleus mass in (0, 1].
    """

    name: str
    temperature: float
    top_p: float


DECODINGS: dict[str, DecodingSetting] = {
    d.name: d
    for d in (
        DecodingSetting("t1.0-p1.0", 1.0, 1.0),
        DecodingSetting("t0.7-p0.9", 0.7, 0.9),
        DecodingSetting("greedy", 0.0, 1.0),  # not in the paper: backend checks (vLLM against HF), debugging
    )
}
"""The two decoding settings of the paper (Sec. 4), and `greedy` (temperature 0: argmax decoding)."""

DECODING_ALIASES: dict[str, tuple[str, ...]] = {"paper": ("t1.0-p1.0", "t0.7-p0.9")}
"""`paper` = both of the paper's settings."""

DEFAULT_MAX_NEW_TOKENS = 20480


@dataclass(frozen=True)
class GeneratedSample:
    """One sampled completion.

    Args:
        text (`str`): decoded completion, special tokens removed.
        num_tokens (`int`): generated tokens, the end-of-sequence token included when present.
        finished (`bool`): ended with an end-of-sequence token (False: cut at max new tokens).
    """

    text: str
    num_tokens: int
    finished: bool


def build_prompt_text(
    tokenizer, problem: str, instruction: str | None = _DEFAULT_INSTRUCTION, use_chat_template: bool = True
) -> str:
    """The prompt string of one problem, formatted as in training.

    Args:
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): the model's tokenizer.
        problem (`str`): the problem statement.
        instruction (`str` or `None`): appended by [`stapo_trl.data.format_prompt`]; defaults to
            [`stapo_trl.data.INSTRUCTION`], the training prompt's.
        use_chat_template (`bool`): apply the tokenizer's chat template (with the generation prompt), as training
            does; `False`: the user message content as plain text.

    Returns:
        `str`: the text to tokenize (without extra special tokens).

    Raises:
        ValueError: `use_chat_template` and the tokenizer has no chat template (training refuses chat prompts without
            one too: [`~stapo_trl.checks.dataset.check_chat_template`]).
    """
    from ..data import INSTRUCTION, format_prompt  # datasets is slow to import: kept out of `stapo-eval --help`

    messages = format_prompt(problem, INSTRUCTION if instruction == _DEFAULT_INSTRUCTION else instruction)
    if not use_chat_template:
        return messages[-1]["content"]
    if not has_chat_template(tokenizer):
        raise ValueError(
            chat_template_message(tokenizer.name_or_path, "The evaluation prompts are", EVAL_CHAT_TEMPLATE_FIX)
        )
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _eos_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id if model.generation_config is not None else None
    if ids is None:
        ids = tokenizer.eos_token_id
    if ids is None:
        return []
    return list(ids) if isinstance(ids, (list, tuple)) else [ids]


def hf_generate(
    model,
    tokenizer,
    prompt_texts: Sequence[str],
    *,
    n: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    batch_size: int = 64,
    seed: int | None = None,
) -> list[list[GeneratedSample]]:
    """Sample `n` completions per prompt with `transformers` `generate` (any device, CPU included).

    The model is put in eval mode for the call and restored afterwards; `top_k` is disabled and no other logits
    processor is applied, so the distribution is the temperature/top-p one, as in vLLM.

    Args:
        model ([`~transformers.PreTrainedModel`]): a causal LM (not wrapped by DDP/DeepSpeed).
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): its tokenizer.
        prompt_texts (`Sequence[str]`): P prompt strings (see [`build_prompt_text`]).
        n (`int`): samples per prompt.
        temperature (`float`): sampling temperature; 0.0 means greedy (argmax) decoding.
        top_p (`float`): nucleus mass.
        max_new_tokens (`int`): generation budget per sample, in tokens.
        batch_size (`int`): sequences per `generate` call.
        seed (`int` or `None`): `torch.manual_seed` before sampling.

    Returns:
        `list[list[GeneratedSample]]`: shape (P, n).
    """
    import torch  # torch/transformers are slow to import: kept out of `stapo-eval --help` and `--compare`
    from transformers import GenerationConfig

    if seed is not None:
        torch.manual_seed(seed)
    eos = _eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
    greedy = temperature == 0.0  # argmax decoding, as vLLM treats temperature 0
    gen_config = GenerationConfig(
        do_sample=not greedy,
        temperature=None if greedy else temperature,
        top_p=None if greedy else top_p,
        top_k=None if greedy else 0,  # disabled: transformers' default top_k=50 would change the paper's distribution
        max_new_tokens=max_new_tokens,
        eos_token_id=eos or None,
        pad_token_id=pad,
    )
    flat = [(i, j) for i in range(len(prompt_texts)) for j in range(n)]
    out: list[list[GeneratedSample | None]] = [[None] * n for _ in prompt_texts]
    eos_set = set(eos)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(flat), batch_size):
            chunk = flat[start : start + batch_size]
            enc = tokenizer(
                [prompt_texts[i] for i, _ in chunk],
                return_tensors="pt",
                padding=True,
                padding_side="left",
                add_special_tokens=False,
            ).to(model.device)
            with torch.no_grad():
                sequences = model.generate(**enc, generation_config=gen_config)
            generated = sequences[:, enc["input_ids"].shape[1] :]  # (batch, <= max_new_tokens)
            for row, (i, j) in zip(generated.tolist(), chunk):
                length, finished = len(row), False
                for t, tok in enumerate(row):
                    if tok in eos_set:
                        length, finished = t + 1, True
                        break
                text = tokenizer.decode(row[:length], skip_special_tokens=True)
                out[i][j] = GeneratedSample(text, length, finished)
    finally:
        model.train(was_training)
    return out  # type: ignore[return-value]


class HFGenerator:
    """`--backend hf`: `transformers` `AutoModelForCausalLM` + `generate` (CPU or one GPU).

    Args:
        model (`str`): local path or Hub id.
        revision (`str` or `None`): Hub revision.
        dtype (`str`): `auto`, `float32`, `bfloat16` or `float16`.
        device (`str` or `None`): torch device; `None` = `cuda` when available, else `cpu`.
        batch_size (`int`): sequences per `generate` call.
    """

    def __init__(self, model: str, revision: str | None = None, dtype: str = "auto", device=None, batch_size=64):
        import torch  # slow to import: kept out of `stapo-eval --help` and `--compare`

        from ..models.loading import load_causal_lm  # transformers + peft: kept out of `--help` too

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        auto = torch.bfloat16 if device.startswith("cuda") else torch.float32
        torch_dtype = auto if dtype == "auto" else getattr(torch, dtype)
        # A LoRA adapter folder is loaded onto its base model through PEFT.
        self.model, self.tokenizer = load_causal_lm(model, revision=revision, dtype=torch_dtype)
        self.model = self.model.to(device)
        self.batch_size = batch_size

    def generate(self, prompt_texts, **sampling):
        """[`hf_generate`] with this model: keywords `n`, `temperature`, `top_p`, `max_new_tokens`, `seed`."""
        return hf_generate(self.model, self.tokenizer, prompt_texts, batch_size=self.batch_size, **sampling)


def _grade_generations(problems, generations, decoding_name: str, save_completions: bool):
    """Grade (P, n) samples: the P * n per-sample records and the (P, n) correctness table, in problem order."""
    records, correct = [], []
    for problem, samples in zip(problems, generations):
        row = []
        for j, sample in enumerate(samples):
            result = grade(sample.text, problem.gold)
            row.append(result.correct)
            record = {
                "benchmark": problem.benchmark,
                "decoding": decoding_name,
                "id": problem.id,
                "sample": j,
                "extracted": result.extracted,
                "correct": result.correct,
                "grader_error": result.error,
                "num_tokens": sample.num_tokens,
                "finished": sample.finished,
            }
            if save_completions:
                record["completion"] = sample.text
            records.append(record)
        correct.append(row)
    return records, correct


def evaluate_problems(
    generate_fn,
    tokenizer,
    problems: Sequence[BenchmarkProblem],
    *,
    n: int,
    decoding: DecodingSetting,
    max_new_tokens: int,
    seed: int | None = None,
    instruction: str | None = _DEFAULT_INSTRUCTION,
    use_chat_template: bool = True,
    save_completions: bool = False,
    max_positions: int | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Generate, grade and score one benchmark under one decoding.

    Args:
        generate_fn (`Callable`): `(prompt_texts, *, n, temperature, top_p, max_new_tokens, seed)` -> (P, n)
            [`GeneratedSample`]s ([`HFGenerator.generate`], [`VLLMGenerator.generate`]).
        tokenizer: the model's tokenizer (for the chat template).
        problems (`Sequence[BenchmarkProblem]`): P problems.
        n (`int`): samples per problem.
        decoding ([`DecodingSetting`]): temperature and top-p.
        max_new_tokens (`int`): generation budget per sample.
        seed (`int` or `None`): sampling seed.
        instruction (`str` or `None`): prompt instruction ([`stapo_trl.data.format_prompt`]).
        use_chat_template (`bool`): see [`build_prompt_text`].
        save_completions (`bool`): keep the completion text in the records.
        max_positions (`int`, *optional*): the model's positions; prompts longer than `max_positions -
            max_new_tokens` tokens are dropped with a warning ([`stapo_trl.preflight`]).

    Returns:
        `tuple[dict, list[dict]]`: the benchmark table ([`benchmark_metrics`] plus `num_grader_errors`,
        `num_truncated`, `mean_completion_tokens`, `generation_time_s`) and the P * n per-sample records.
    """
    prompt_texts = [build_prompt_text(tokenizer, p.problem, instruction, use_chat_template) for p in problems]
    if max_positions is not None:  # the prompt-length rule shared with stapo-train
        keep = keep_short_prompts(
            count_prompt_tokens(prompt_texts, tokenizer),
            prompt_token_budget(max_positions, max_new_tokens),
            what=f"{problems[0].benchmark} prompts",
            max_positions=max_positions,
            max_new_tokens=max_new_tokens,
        )
        problems, prompt_texts = [problems[i] for i in keep], [prompt_texts[i] for i in keep]
    t0 = time.perf_counter()
    generations = generate_fn(
        prompt_texts,
        n=n,
        temperature=decoding.temperature,
        top_p=decoding.top_p,
        max_new_tokens=max_new_tokens,
        seed=seed,
    )
    gen_time = time.perf_counter() - t0
    records, correct = _grade_generations(problems, generations, decoding.name, save_completions)
    table = benchmark_metrics(correct, n, problems[0].benchmark if problems else None, [p.id for p in problems])
    num_samples = len(records)
    table.update(
        num_grader_errors=sum(r["grader_error"] is not None for r in records),
        num_truncated=sum(not r["finished"] for r in records),
        mean_completion_tokens=(sum(r["num_tokens"] for r in records) / num_samples) if num_samples else None,
        generation_time_s=round(gen_time, 3),
        grading_time_s=round(time.perf_counter() - t0 - gen_time, 3),
    )
    return table, records


def evaluate_avg_at_k(
    model,
    tokenizer,
    prompts: Sequence[list[dict[str, str]]],
    solutions: Sequence[str],
    *,
    k: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    batch_size: int = 64,
    seed: int = 0,
    accelerator=None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Held-out avg@k and pass@k of a model, sampling `k` completions per problem with [`hf_generate`].

    Problems are split across processes (every process must call this); the counts are gathered, so every process
    returns the same numbers. Sampling uses its own seeded RNG stream (`seed` + process index), so evaluating does
    not change the training's random numbers. Completions are graded with [`stapo_trl.grading.grade`] (last
    `\\boxed{}` against the gold answer), the same grader as the training reward.

    Args:
        model ([`~transformers.PreTrainedModel`]): An unwrapped model (see `trl.models.utils.unwrap_model_for_generation`).
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): With a chat template and a pad token.
        prompts (`Sequence[list[dict]]`): Conversational prompts.
        solutions (`Sequence[str]`): Gold answers, one per prompt.
        k (`int`): Completions per problem.
        temperature (`float`), top_p (`float`), max_new_tokens (`int`): Sampling settings (top-k is off).
        batch_size (`int`, *optional*, defaults to `64`): Problems per `generate` call (k completions each).
        seed (`int`, *optional*, defaults to `0`): Seed of the sampling.
        accelerator ([`~accelerate.Accelerator`], *optional*): To split the problems across processes.
        chat_template_kwargs (`dict`, *optional*): Extra `apply_chat_template` arguments (as in training).

    Returns:
        `dict[str, float]`: `avg@k` (mean accuracy over all completions, in [0, 1]), `pass@k` (fraction of problems
        with at least one correct completion) and `num_problems`.
    """
    import torch  # slow to import: kept out of `stapo-eval --help`

    indices = list(range(len(prompts)))
    process_index = 0
    distributed = accelerator is not None and accelerator.num_processes > 1
    if distributed:
        process_index = accelerator.process_index
        # Padded (the last problem repeated) so that every process makes the same number of `generate` calls: a
        # sharded model (FSDP) communicates in every forward. Duplicates are dropped after the gather.
        with accelerator.split_between_processes(indices, apply_padding=True) as local_indices:
            indices = list(local_indices)
    template_kwargs = chat_template_kwargs or {}
    texts = [
        tokenizer.apply_chat_template(prompts[i], tokenize=False, add_generation_prompt=True, **template_kwargs)
        for i in indices
    ]
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        torch.manual_seed(seed + process_index)
        samples = hf_generate(
            model,
            tokenizer,
            texts,
            n=k,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size * k,
        )
    # (problem index, correct completions out of k)
    num_correct = [(i, sum(grade(s.text, solutions[i]).correct for s in row)) for i, row in zip(indices, samples)]
    if distributed:
        from accelerate.utils import gather_object  # only in multi-process runs

        num_correct = gather_object(num_correct)
    correct_by_problem = dict(num_correct)  # drops the padding duplicates
    num_problems = len(prompts)
    return {
        f"avg@{k}": sum(correct_by_problem.values()) / (k * num_problems) if num_problems else float("nan"),
        f"pass@{k}": sum(c > 0 for c in correct_by_problem.values()) / num_problems if num_problems else float("nan"),
        "num_problems": num_problems,
    }
