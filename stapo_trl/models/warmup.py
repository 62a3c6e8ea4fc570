"""Supervised warm-up of a built-in model with TRL's `SFTTrainer`, and its held-out accuracy on tiny-math.

Works for any model with a chat template: the tiny Qwen3 of `tiny.py` and the converted real models (`sft_math.py`).
"""

from __future__ import annotations

import tempfile
import warnings
from typing import Any

from ..grading import extract_boxed_answer


# The seed of every built-in recipe (data order, model init, sampling of the accuracy check).
SEED = 0
# Held-out accuracy check after the build: the tiny-math test split, sampled like the RL rollouts.
EVAL_TEMPERATURE = 1.0
# The tiny tokenizer writes a tiny-math completion in 29-31 tokens + eos: 48 leaves room for a few stray tokens.
EVAL_MAX_NEW_TOKENS = 48
# The paper's tau_p (`s2t_prob_threshold` default): the token statistics report how many sampled tokens fall below it.
TAU_P = 0.002


def sft_warm_up(
    model,
    tokenizer,
    train_dataset,
    max_steps: int,
    sft_config: dict[str, Any],
    seed: int = SEED,
) -> dict[str, float]:
    """Supervised warm-up with TRL's [`~trl.SFTTrainer`] on prompt/completion pairs (CPU, loss on completions).

    Args:
        model ([`~transformers.PreTrainedModel`]): The model, trained in place.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): Its tokenizer, with a chat template.
        train_dataset ([`~datasets.Dataset`]): Tiny-math rows (conversational `prompt`, string `completion`).
        max_steps (`int`): Optimizer steps of `sft_config["per_device_train_batch_size"]` examples.
        sft_config (`dict[str, Any]`): `SFTConfig` fields of the recipe (batch size, learning rate, schedule,
            label smoothing), e.g. `stapo_trl.models.tiny.SFT_CONFIG`.
        seed (`int`, *optional*, defaults to `SEED`): Seed of the data order.

    Returns:
        `dict[str, float]`: `mean_train_loss` (over all steps) and `last_logged_loss` (label-smoothed cross-entropy,
        nats per completion token).
    """
    from trl import SFTConfig, SFTTrainer

    dataset = train_dataset.map(
        lambda ex: {"completion": [{"role": "assistant", "content": ex["completion"]}]},
        remove_columns=[c for c in train_dataset.column_names if c not in ("prompt", "completion")],
    )
    with tempfile.TemporaryDirectory() as output_dir:
        args = SFTConfig(
            output_dir=output_dir,
            max_steps=max_steps,
            seed=seed,
            use_cpu=True,
            bf16=False,
            report_to=[],
            save_strategy="no",
            logging_steps=min(50, max(1, max_steps // 5)),  # 50 for the tiny recipe's 320 steps; a loss to report
            disable_tqdm=True,
            loss_type="nll",  # TRL 1.15's default; 1.9-1.14 default to chunked_nll, which fails with label smoothing
            # TRL turns it on by default; a 144k-parameter model needs no memory saving.
            **{_checkpointing_field(SFTConfig): False},
            **sft_config,
        )
        with warnings.catch_warnings():
            # TRL deprecates `label_smoothing_factor` in SFTTrainer (it costs an extra forward pass); it is the point
            # of this warm-up, see the module docstring.
            warnings.filterwarnings("ignore", message=".*label_smoothing_factor.*", category=FutureWarning)
            trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
        trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    return {"mean_train_loss": trainer.state.log_history[-1]["train_loss"], "last_logged_loss": losses[-1]}


def _checkpointing_field(config_class) -> str:
    """The gradient-checkpointing field of a `TrainingArguments` subclass: `activation_checkpointing` from
    transformers 5.24 (where `gradient_checkpointing` is a deprecated alias), `gradient_checkpointing` before (5.19,
    the vLLM CPU environment)."""
    import dataclasses

    names = {field.name for field in dataclasses.fields(config_class)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def measure_accuracy(
    model,
    tokenizer,
    prompts: list,
    solutions: list[str],
    *,
    do_sample: bool,
    seed: int = SEED,
    batch_size: int = 100,
    max_new_tokens: int = EVAL_MAX_NEW_TOKENS,
    token_statistics: dict[str, list] | None = None,
) -> tuple[float, list[str]]:
    """Fraction of prompts whose completion's last `\\boxed{}` equals the gold string exactly.

    Args:
        model ([`~transformers.PreTrainedModel`]): The model, on CPU (left in the train/eval mode it came in).
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): Its tokenizer, with a chat template.
        prompts (`list`): Conversational prompts.
        solutions (`list[str]`): Gold answers.
        do_sample (`bool`): Sample at `EVAL_TEMPERATURE` with top-p 1 and no top-k (True) or decode greedily (False).
        seed (`int`, *optional*, defaults to `SEED`): Seed of the sampling.
        batch_size (`int`, *optional*, defaults to `100`): Prompts per `generate` call.
        max_new_tokens (`int`, *optional*, defaults to `EVAL_MAX_NEW_TOKENS`): Completion budget, in tokens.
        token_statistics (`dict[str, list]` or `None`, *optional*, defaults to `None`): If a dict, gets the lists
            `entropy` (nats) and `prob` (of the chosen token) of every completion token up to and including the first
            eos, from the distribution each token was drawn from (see [`summarize_token_statistics`]).

    Returns:
        `tuple[float, list[str]]`: The accuracy, a fraction in [0, 1], and the decoded completions.
    """
    import torch
    from transformers import LogitsProcessorList

    torch.manual_seed(seed)
    was_training = model.training
    model.eval()
    completions: list[str] = []
    eos_ids = _eos_token_ids(model, tokenizer)
    for start in range(0, len(prompts), batch_size):
        texts = [
            tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
            for p in prompts[start : start + batch_size]
        ]
        batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        recorder = _TokenStatisticsRecorder()
        with torch.no_grad():
            out = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                do_sample=do_sample,
                temperature=EVAL_TEMPERATURE if do_sample else None,
                top_p=1.0 if do_sample else None,
                top_k=0 if do_sample else None,
                logits_processor=LogitsProcessorList([recorder]) if token_statistics is not None else None,
            )
        completion_ids = out[:, batch["input_ids"].shape[1] :]  # (B, T)
        if token_statistics is not None:
            entropy, prob = recorder.finish(completion_ids)  # (B, T) each
            # Up to and including the first eos (as TRL's completion mask), or every token of a truncated completion.
            is_eos = torch.isin(completion_ids, torch.tensor(eos_ids))
            after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0  # (B, T): True strictly after the first eos
            token_statistics.setdefault("entropy", []).extend(entropy[~after_eos].tolist())
            token_statistics.setdefault("prob", []).extend(prob[~after_eos].tolist())
        completions += tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    model.train(was_training)
    correct = sum(extract_boxed_answer(c) == s for c, s in zip(completions, solutions))
    return correct / len(prompts), completions


def _eos_token_ids(model, tokenizer) -> list[int]:
    """The ids that end a completion: the generation config's eos ids and the tokenizer's eos (as TRL takes them)."""
    ids = model.generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    return ids if tokenizer.eos_token_id in ids else [tokenizer.eos_token_id, *ids]


class _TokenStatisticsRecorder:
    """A logits processor that records, at each decoding step, the entropy (nats) of the next-token distribution and
    the log-probabilities, to look up the chosen token's probability once it is known (the next step's input).

    It must see the scores the token is drawn from: at temperature 1, top-p 1 and top-k 0 transformers adds no warper,
    and processors given to `generate` run after the built-in ones (none are configured for these models).
    """

    def __init__(self):
        self.entropies: list = []  # per step: (B,)
        self.chosen_logps: list = []  # per step but the last: (B,)
        self._logps = None  # (B, V), the last step's

    def __call__(self, input_ids, scores):
        import torch

        if self._logps is not None:  # input_ids[:, -1] is the token chosen from the previous step's distribution
            self.chosen_logps.append(self._logps.gather(1, input_ids[:, -1:]).squeeze(1))
        logps = torch.log_softmax(scores.float(), dim=-1)  # (B, V)
        self.entropies.append(-(logps.exp() * logps).nansum(dim=-1))  # nansum: 0 * -inf at masked logits is 0
        self._logps = logps
        return scores

    def finish(self, completion_ids):
        """(entropy, prob), each (B, T) float: per generated token, the entropy (nats) and the chosen token's
        probability."""
        import torch

        self.chosen_logps.append(self._logps.gather(1, completion_ids[:, -1:]).squeeze(1))
        return torch.stack(self.entropies, dim=1), torch.stack(self.chosen_logps, dim=1).exp()


def summarize_token_statistics(token_statistics: dict[str, list]) -> dict[str, Any]:
    """Quantiles of the sampled tokens' entropy and the share of tokens below the paper's tau_p.

    Args:
        token_statistics (`dict[str, list]`): As filled by [`measure_accuracy`] (sampled decoding).

    Returns:
        `dict[str, Any]`: `num_tokens`; `entropy_nats` with `p10`, `p50`, `p90` and `mean` (linear-interpolated
        quantiles, nats); `frac_prob_below_tau_p`, the fraction of tokens whose probability is below `tau_p` = 0.002
        (the paper's candidates, before the advantage sign), and `tau_p`.
    """
    import torch

    entropy = torch.tensor(token_statistics["entropy"], dtype=torch.float64)
    prob = torch.tensor(token_statistics["prob"], dtype=torch.float64)
    quantiles = torch.quantile(entropy, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()  # < 2**24 values
    return {
        "num_tokens": len(entropy),
        "entropy_nats": {
            "p10": round(quantiles[0], 6),
            "p50": round(quantiles[1], 6),
            "p90": round(quantiles[2], 6),
            "mean": round(entropy.mean().item(), 6),
        },
        "frac_prob_below_tau_p": round((prob < TAU_P).double().mean().item(), 6),
        "tau_p": TAU_P,
    }


def evaluate_tiny_math(
    model,
    tokenizer,
    test_dataset,
    *,
    max_new_tokens: int = EVAL_MAX_NEW_TOKENS,
    token_statistics: bool = False,
    greedy: bool = True,
) -> dict[str, Any]:
    """Held-out accuracy of a tiny-math model: sampled at `EVAL_TEMPERATURE` (as RL rollouts are) and greedy.

    Args:
        model ([`~transformers.PreTrainedModel`]): The model, on CPU.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): Its tokenizer, with a chat template.
        test_dataset ([`~datasets.Dataset`]): Tiny-math rows (`prompt`, `solution`, `problem`).
        max_new_tokens (`int`, *optional*, defaults to `EVAL_MAX_NEW_TOKENS`): Completion budget, in tokens.
        token_statistics (`bool`, *optional*, defaults to `False`): Also summarize the entropy and probability of
            the sampled tokens ([`summarize_token_statistics`]), under `sampled_tokens`.
        greedy (`bool`, *optional*, defaults to `True`): Also measure greedy accuracy (`None` when False).

    Returns:
        `dict[str, Any]`: `sampled_accuracy` and `greedy_accuracy` (fractions in [0, 1]), the settings, the first five
        sampled completions, and `sampled_tokens` when asked.
    """
    prompts, solutions = test_dataset["prompt"], test_dataset["solution"]
    stats: dict[str, list] | None = {} if token_statistics else None
    sampled_accuracy, sampled = measure_accuracy(
        model, tokenizer, prompts, solutions, do_sample=True, max_new_tokens=max_new_tokens, token_statistics=stats
    )
    greedy_accuracy = (
        measure_accuracy(model, tokenizer, prompts, solutions, do_sample=False, max_new_tokens=max_new_tokens)[0]
        if greedy
        else None
    )
    evaluation = {
        "split": "builtin:tiny-math test",
        "num_problems": len(prompts),
        "temperature": EVAL_TEMPERATURE,
        "top_p": 1.0,
        "max_new_tokens": max_new_tokens,
        "sampled_accuracy": sampled_accuracy,
        "greedy_accuracy": greedy_accuracy,
        # A few sampled completions: at T = 1.0 some wander into the low-probability tail label smoothing left.
        "samples": [
            {"problem": test_dataset[i]["problem"], "completion": sampled[i], "solution": solutions[i]}
            for i in range(min(5, len(prompts)))
        ],
    }
    if stats is not None:
        evaluation["sampled_tokens"] = summarize_token_statistics(stats)
    return evaluation
