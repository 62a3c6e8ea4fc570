"""The SFT warm-up of a built-in model (TRL's `SFTTrainer`) and its held-out check on tiny-math: sampled and greedy
accuracy, and the entropy and probability of the sampled tokens."""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import warnings
from typing import Any

from ..grading import extract_boxed_answer


logger = logging.getLogger(__name__)

SEED = 0  # of every built-in recipe: data order, model init, the check's sampling
EVAL_TEMPERATURE = 1.0  # the check samples as RL rollouts do
EVAL_MAX_NEW_TOKENS = 48  # the tiny tokenizer writes a tiny-math completion in 29-31 tokens + eos
TAU_P = 0.002  # the paper's tau_p: the token statistics count the sampled tokens below it


def sft_warm_up(model, tokenizer, train_dataset, max_steps: int, sft_config: dict[str, Any]) -> dict[str, float]:
    """Train `model` in place with TRL's [`~trl.SFTTrainer`] on tiny-math rows (loss on the completions), on the CPU,
    for `max_steps` steps of the `SFTConfig` fields in `sft_config`. Returns `mean_train_loss` (all steps) and
    `last_logged_loss`, in nats per completion token."""
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    dataset = train_dataset.map(
        lambda ex: {"completion": [{"role": "assistant", "content": ex["completion"]}]},
        remove_columns=[c for c in train_dataset.column_names if c not in ("prompt", "completion")],
    )
    # transformers 5.24 renamed `gradient_checkpointing` (the vLLM CPU environment's 5.19 has only the old name).
    fields = {field.name for field in dataclasses.fields(SFTConfig)}
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    with tempfile.TemporaryDirectory() as output_dir:
        args = SFTConfig(
            output_dir=output_dir,
            max_steps=max_steps,
            seed=SEED,
            use_cpu=True,
            bf16=False,
            report_to=[],
            save_strategy="no",
            logging_steps=min(50, max(1, max_steps // 5)),
            disable_tqdm=True,
            loss_type="nll",  # TRL 1.9-1.14 default to chunked_nll, which fails with label smoothing
            **{checkpointing: False},
            **sft_config,
        )
        with warnings.catch_warnings():  # TRL deprecates label smoothing in SFT; it is the point of this warm-up
            warnings.filterwarnings("ignore", message=".*label_smoothing_factor.*", category=FutureWarning)
            trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
        trainer.remove_callback(PrinterCallback)  # no loss rows amid a command's output: the build record has them
        trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    return {"mean_train_loss": trainer.state.log_history[-1]["train_loss"], "last_logged_loss": losses[-1]}


def measure_accuracy(
    model, tokenizer, prompts, solutions, *, do_sample: bool, max_new_tokens=EVAL_MAX_NEW_TOKENS, token_statistics=None
) -> tuple[float, list[str]]:
    """The fraction in [0, 1] of `prompts` (conversational) whose completion's last `\\boxed{}` equals the gold string,
    and the decoded completions: sampled at `EVAL_TEMPERATURE`, top-p 1, no top-k after `torch.manual_seed(SEED)`, or
    greedy, 100 prompts per `generate` call; the model's train/eval mode is restored. A `token_statistics` dict gets
    the lists `entropy` (nats) and `prob` (of the drawn token) of every completion token up to the first eos included.
    """
    import torch

    torch.manual_seed(SEED)
    was_training = model.training
    model.eval()
    eos_ids = model.generation_config.eos_token_id  # the ids that end a completion, as TRL takes them
    eos_ids = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids or [])
    eos_ids = eos_ids if tokenizer.eos_token_id in eos_ids else [tokenizer.eos_token_id, *eos_ids]
    sampling = {"temperature": EVAL_TEMPERATURE, "top_p": 1.0, "top_k": 0} if do_sample else {}
    completions: list[str] = []
    for start in range(0, len(prompts), 100):
        texts = tokenizer.apply_chat_template(prompts[start : start + 100], tokenize=False, add_generation_prompt=True)
        batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        recorder = _TokenStatisticsRecorder()
        processors = [recorder] if token_statistics is not None else None
        with torch.no_grad():
            out = model.generate(
                **batch, max_new_tokens=max_new_tokens, do_sample=do_sample, **sampling, logits_processor=processors
            )
        completion_ids = out[:, batch["input_ids"].shape[1] :]  # (B, T)
        if token_statistics is not None:
            entropy, prob = recorder.finish(completion_ids)  # (B, T) each
            is_eos = torch.isin(completion_ids, torch.tensor(eos_ids))
            after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0  # (B, T): strictly after the first eos
            token_statistics.setdefault("entropy", []).extend(entropy[~after_eos].tolist())
            token_statistics.setdefault("prob", []).extend(prob[~after_eos].tolist())
        completions += tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    model.train(was_training)
    return sum(extract_boxed_answer(c) == s for c, s in zip(completions, solutions)) / len(prompts), completions


class _TokenStatisticsRecorder:
    """A logits processor recording at each decoding step the entropy (nats) of the next-token distribution and the
    log-probability of the token drawn from the previous one. At temperature 1, top-p 1 and top-k 0 no warper is
    added, so these are the scores the token is drawn from."""

    def __init__(self):
        self.entropies, self.chosen_logps, self._logps = [], [], None  # per step (B,), (B,), the last step's (B, V)

    def __call__(self, input_ids, scores):
        import torch

        if self._logps is not None:
            self.chosen_logps.append(self._logps.gather(1, input_ids[:, -1:]).squeeze(1))
        self._logps = torch.log_softmax(scores.float(), dim=-1)  # (B, V)
        self.entropies.append(-(self._logps.exp() * self._logps).nansum(dim=-1))  # 0 * -inf at masked logits is 0
        return scores

    def finish(self, completion_ids):
        """(entropy in nats, probability of the drawn token), each (B, T) float."""
        import torch

        self.chosen_logps.append(self._logps.gather(1, completion_ids[:, -1:]).squeeze(1))
        return torch.stack(self.entropies, dim=1), torch.stack(self.chosen_logps, dim=1).exp()


def summarize_token_statistics(token_statistics: dict[str, list]) -> dict[str, Any]:
    """From [`measure_accuracy`]'s `token_statistics`: `num_tokens`, `entropy_nats` (`p10`, `p50`, `p90`, `mean`) and
    `frac_prob_below_tau_p`, the fraction of tokens whose probability is below `tau_p`."""
    import torch

    entropy = torch.tensor(token_statistics["entropy"], dtype=torch.float64)
    prob = torch.tensor(token_statistics["prob"], dtype=torch.float64)
    quantiles = torch.quantile(entropy, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
    entropy_nats = {"p10": quantiles[0], "p50": quantiles[1], "p90": quantiles[2], "mean": entropy.mean().item()}
    return {
        "num_tokens": len(entropy),
        "entropy_nats": {k: round(v, 6) for k, v in entropy_nats.items()},
        "frac_prob_below_tau_p": round((prob < TAU_P).double().mean().item(), 6),
        "tau_p": TAU_P,
    }


def evaluate_tiny_math(
    model, tokenizer, test_dataset, *, max_new_tokens: int = EVAL_MAX_NEW_TOKENS, token_statistics: bool = False
) -> dict[str, Any]:
    """The held-out check on tiny-math rows: `sampled_accuracy` and `greedy_accuracy`, the settings, five sampled
    completions and, with `token_statistics`, `sampled_tokens` ([`summarize_token_statistics`])."""
    prompts, solutions = test_dataset["prompt"], test_dataset["solution"]
    stats = {} if token_statistics else None
    sampled_accuracy, sampled = measure_accuracy(
        model, tokenizer, prompts, solutions, do_sample=True, max_new_tokens=max_new_tokens, token_statistics=stats
    )
    greedy_accuracy, _ = measure_accuracy(
        model, tokenizer, prompts, solutions, do_sample=False, max_new_tokens=max_new_tokens
    )
    evaluation = {
        "split": "builtin:tiny-math test",
        "num_problems": len(prompts),
        "temperature": EVAL_TEMPERATURE,
        "top_p": 1.0,
        "max_new_tokens": max_new_tokens,
        "sampled_accuracy": sampled_accuracy,
        "greedy_accuracy": greedy_accuracy,
        "samples": [
            {"problem": test_dataset[i]["problem"], "completion": sampled[i], "solution": solutions[i]}
            for i in range(min(5, len(prompts)))
        ],
    }
    if stats is not None:
        evaluation["sampled_tokens"] = summarize_token_statistics(stats)
    logger.info("Held-out accuracy: %.1f %% sampled, %.1f %% greedy", 100 * sampled_accuracy, 100 * greedy_accuracy)
    return evaluation
