"""A built-in model's SFT warm-up with label smoothing (a low-p tail kept), its check, and the `gguf+sft` recipe."""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from functools import partial
from typing import Any

import torch
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.trainer_callback import PrinterCallback
from trl import SFTConfig, SFTTrainer

from ..core.s2t import S2TSettings
from ..data import make_tiny_math_dataset
from ..evaluation.generation import DECODINGS, evaluate_problems, hf_generate
from ..evaluation.tasks import load_benchmark
from .gguf import state_dict_sha256
from .names import BUILTIN_MODELS, read_builtin_info


SEED = 0  # of every built-in recipe: data order, model init, the check's sampling


def sft_warm_up(model, tokenizer, train_dataset, max_steps: int, sft_config: dict[str, Any]) -> dict[str, float]:
    """Train `model` in place with TRL's `SFTTrainer` on the CPU: `mean_train_loss`, `last_logged_loss` (nats)."""
    dataset = train_dataset.map(lambda ex: {"completion": [{"role": "assistant", "content": ex["completion"]}]},
        remove_columns=[c for c in train_dataset.column_names if c not in ("prompt", "completion")])  # fmt: skip
    renamed = hasattr(SFTConfig, "activation_checkpointing")  # transformers 5.24 renamed gradient_checkpointing
    with tempfile.TemporaryDirectory() as output_dir:
        args = SFTConfig(
            output_dir=output_dir, max_steps=max_steps, seed=SEED, use_cpu=True, bf16=False, report_to=[],
            save_strategy="no", logging_steps=min(50, max(1, max_steps // 5)), disable_tqdm=True,
            loss_type="nll", **{f"{'activation' if renamed else 'gradient'}_checkpointing": False}, **sft_config,
        )  # fmt: skip  # loss_type: TRL 1.9-1.14's chunked_nll fails with label smoothing
        with warnings.catch_warnings():  # TRL deprecates label smoothing in SFT; it is the point of this warm-up
            warnings.filterwarnings("ignore", message=".*label_smoothing_factor.*", category=FutureWarning)
            trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
        trainer.remove_callback(PrinterCallback)  # no loss rows amid a command's output: the build record has them
        trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    return {"mean_train_loss": trainer.state.log_history[-1]["train_loss"], "last_logged_loss": losses[-1]}


def summarize_token_statistics(stats: dict[str, list]) -> dict[str, Any]:
    """`num_tokens`, `entropy_nats` (`p10`, `p50`, `p90`, `mean`), `frac_prob_below_tau_p` of `hf_generate`'s stats."""
    tau_p, quantiles = S2TSettings.prob_threshold, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    entropy, prob = (torch.tensor(stats[key], dtype=torch.float64) for key in ("entropy", "prob"))
    nats = zip(("p10", "p50", "p90", "mean"), [*torch.quantile(entropy, quantiles).tolist(), entropy.mean().item()])
    return {"num_tokens": len(entropy), "entropy_nats": {k: round(v, 6) for k, v in nats},
            "frac_prob_below_tau_p": round((prob < tau_p).double().mean().item(), 6), "tau_p": tau_p}  # fmt: skip


def evaluate_tiny_math(model, tokenizer, num_problems: int, max_new_tokens=48, statistics=False):
    """`stapo-eval`'s evaluation of the first `num_problems` tiny-math problems, sampled (T 1.0) and greedy."""
    problems, stats = load_benchmark("tiny-math", limit=num_problems), {} if statistics else None
    (sampled, records), (greedy, _) = (evaluate_problems(  # max_new_tokens: tiny writes 29-31 tokens + eos
        partial(hf_generate, model, tokenizer, stats=stats if name != "greedy" else None), tokenizer, problems, n=1,
        decoding=DECODINGS[name], max_new_tokens=max_new_tokens, seed=SEED, save_completions=True,
    ) for name in ("t1.0-p1.0", "greedy"))  # fmt: skip
    samples = [dict(problem=p.problem, completion=r["completion"], solution=p.gold) for p, r in zip(problems, records)]
    evaluation = {"split": "builtin:tiny-math test", "num_problems": len(problems), "temperature": 1.0, "top_p": 1.0,
                  "max_new_tokens": max_new_tokens, "sampled_accuracy": sampled["avg@1"],
                  "greedy_accuracy": greedy["avg@1"], "samples": samples[:5]}  # fmt: skip
    return evaluation | ({"sampled_tokens": summarize_token_statistics(stats)} if statistics else {})


SFT_CONFIG: dict[str, Any] = {"per_device_train_batch_size": 8, "learning_rate": 5e-5, "lr_scheduler_type": "constant",
                              "label_smoothing_factor": 0.01}  # fmt: skip


def build(name: str, output_dir: str | os.PathLike, base_path: str | os.PathLike | None) -> dict[str, Any]:
    """SFT-warm the built base at `base_path`, check it and save into `output_dir`; returns the record's fields."""
    recipe = BUILTIN_MODELS[name]
    if base_path is None:
        raise ValueError(f"builtin:{name} is SFT-warmed from builtin:{recipe['base']}: give its folder.")
    base_info, data = read_builtin_info(base_path), make_tiny_math_dataset(seed=SEED)
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    start, losses = time.perf_counter(), sft_warm_up(model, tokenizer, data["train"], recipe["sft_steps"], SFT_CONFIG)
    sft = {"steps": recipe["sft_steps"], "train_examples": len(data["train"]),
           "seconds": round(time.perf_counter() - start, 1), **losses, **SFT_CONFIG}  # fmt: skip
    # the first 200 of the 300 held-out problems; SmolLM2 writes a tiny-math completion in 29-32 tokens + eos
    evaluation = evaluate_tiny_math(model, tokenizer, 200, max_new_tokens=64, statistics=True)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return {"base": {k: base_info[k] for k in ("name", "version", "source", "state_dict_sha256")},
            **{k: base_info[k] for k in ("chat_template", "tokenizer", "model")}, "seed": SEED, "sft": sft,
            "eval": evaluation, "state_dict_sha256": state_dict_sha256(model),
            "versions": {"trl": trl.__version__, "gguf": base_info["versions"]["gguf"]}}  # fmt: skip
