"""The SFT warm-up of a built-in model (TRL's `SFTTrainer`) and its held-out check (`stapo-eval`'s evaluation)."""

from __future__ import annotations

import dataclasses
import tempfile
import warnings
from functools import partial
from typing import Any


SEED = 0  # of every built-in recipe: data order, model init, the check's sampling
EVAL_MAX_NEW_TOKENS = 48  # the tiny tokenizer writes a tiny-math completion in 29-31 tokens + eos


def sft_warm_up(model, tokenizer, train_dataset, max_steps: int, sft_config: dict[str, Any]) -> dict[str, float]:
    """Train `model` in place with [`~trl.SFTTrainer`] on the CPU for `max_steps` steps of `sft_config`; returns
    `mean_train_loss` and `last_logged_loss` (nats per completion token)."""
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    dataset = train_dataset.map(
        lambda ex: {"completion": [{"role": "assistant", "content": ex["completion"]}]},
        remove_columns=[c for c in train_dataset.column_names if c not in ("prompt", "completion")],
    )
    # transformers 5.24 renamed `gradient_checkpointing`
    fields = {field.name for field in dataclasses.fields(SFTConfig)}
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    with tempfile.TemporaryDirectory() as output_dir:
        args = SFTConfig(
            output_dir=output_dir, max_steps=max_steps, seed=SEED, use_cpu=True, bf16=False, report_to=[],
            save_strategy="no", logging_steps=min(50, max(1, max_steps // 5)), disable_tqdm=True,
            loss_type="nll", **{checkpointing: False}, **sft_config,  # TRL 1.9-1.14: chunked_nll fails with smoothing
        )  # fmt: skip
        with warnings.catch_warnings():  # TRL deprecates label smoothing in SFT; it is the point of this warm-up
            warnings.filterwarnings("ignore", message=".*label_smoothing_factor.*", category=FutureWarning)
            trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
        trainer.remove_callback(PrinterCallback)  # no loss rows amid a command's output: the build record has them
        trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    return {"mean_train_loss": trainer.state.log_history[-1]["train_loss"], "last_logged_loss": losses[-1]}


def summarize_token_statistics(stats: dict[str, list]) -> dict[str, Any]:
    """`num_tokens`, `entropy_nats` (`p10`, `p50`, `p90`, `mean`), `frac_prob_below_tau_p` of `hf_generate`'s stats."""
    import torch

    from ..core.s2t import S2TSettings

    entropy, prob = (torch.tensor(stats[key], dtype=torch.float64) for key in ("entropy", "prob"))
    quantiles = torch.quantile(entropy, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
    entropy_nats = dict(zip(("p10", "p50", "p90"), quantiles)) | {"mean": entropy.mean().item()}
    return {
        "num_tokens": len(entropy),
        "entropy_nats": {k: round(v, 6) for k, v in entropy_nats.items()},
        "frac_prob_below_tau_p": round((prob < S2TSettings.prob_threshold).double().mean().item(), 6),
        "tau_p": S2TSettings.prob_threshold,
    }


def evaluate_tiny_math(model, tokenizer, num_problems: int, max_new_tokens=EVAL_MAX_NEW_TOKENS, statistics=False):
    """`stapo-eval`'s evaluation of the first `num_problems` tiny-math problems at seed `SEED`, sampled (T 1.0) and
    greedy: the accuracies, settings, five completions and, with `statistics`, [`summarize_token_statistics`]."""
    from ..evaluation.generation import DECODINGS, evaluate_problems, hf_generate
    from ..evaluation.tasks import load_benchmark

    problems, stats = load_benchmark("tiny-math", limit=num_problems), {} if statistics else None
    (sampled, records), (greedy, _) = (
        evaluate_problems(
            partial(hf_generate, model, tokenizer, stats=stats if name != "greedy" else None), tokenizer, problems,
            n=1, decoding=DECODINGS[name], max_new_tokens=max_new_tokens, seed=SEED, save_completions=True,
        )
        for name in ("t1.0-p1.0", "greedy")
    )  # fmt: skip
    samples = [dict(problem=p.problem, completion=r["completion"], solution=p.gold) for p, r in zip(problems, records)]
    evaluation = {"split": "builtin:tiny-math test", "num_problems": len(problems), "temperature": 1.0, "top_p": 1.0}
    evaluation |= {"max_new_tokens": max_new_tokens, "sampled_accuracy": sampled["avg@1"]}
    evaluation |= {"greedy_accuracy": greedy["avg@1"], "samples": samples[:5]}
    return evaluation | ({"sampled_tokens": summarize_token_statistics(stats)} if statistics else {})
