"""What a `stapo-train` run leaves besides the model: the before/after evaluation record (`eval.json`), the figures,
the S2T summary of the run files, and the summary printed at the end."""

from __future__ import annotations

import json
import logging
import os
import shlex
from functools import partial
from typing import Any

from trl.models.utils import unwrap_model_for_generation

from ..data import INSTRUCTION, NOT_HELD_OUT, evaluation_split, model_max_positions
from ..evaluation.generation import decoding_setting, evaluate_problems, hf_generate
from ..evaluation.tasks import BenchmarkProblem
from ..run_folder.checkpoints import open_run_file
from ..run_folder.logs import METRICS_FILENAME, SPURIOUS_TOKENS_FILENAME, read_metrics, read_token_records, s2t_totals
from .args import prompt_dataset_kwargs
from .figures import plot_diagnostics, plot_training_curves


logger = logging.getLogger(__name__)


EVAL_FILENAME = "eval.json"


CURVES_FILENAME = "training_curves.png"


def evaluate_trainer_model(trainer, script_args, eval_dataset, max_new_tokens: int) -> dict[str, Any]:
    """The table of [`~stapo_trl.evaluation.generation.evaluate_problems`] (avg@k, pass@k, `num_problems`, ...) of the
    trainer's model on `eval_dataset` (`prompt`, `solution`), `stapo-eval`'s loop with the `eval_*` settings, the
    run's seed and `eval_batch_size` x k sequences per `generate` call, on every process; with the `stapo-eval`
    name of the `decoding` (`greedy` at temperature 0, else `t<T>-p<top_p>`), `dtype` and `threads`."""
    import torch

    a, k, tokenizer = script_args, script_args.eval_num_samples, trainer.processing_class
    rows = zip(eval_dataset["prompt"], eval_dataset["solution"])
    problems = [BenchmarkProblem(str(i), *row, a.dataset_name) for i, row in enumerate(rows)]
    t, p = float(a.eval_temperature), float(a.eval_top_p)
    decoding = decoding_setting("greedy" if t == 0 else f"t{t}-p{p}")
    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
        table, _ = evaluate_problems(
            partial(hf_generate, model, tokenizer, batch_size=a.eval_batch_size * k),
            tokenizer,
            problems,
            n=k,
            decoding=decoding,
            max_new_tokens=max_new_tokens,
            seed=trainer.args.seed,
            chat_template_kwargs=trainer.args.chat_template_kwargs,
            max_positions=model_max_positions(model),
            accelerator=trainer.accelerator,
        )
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return table | {"decoding": decoding.name, "dtype": dtype, "threads": torch.get_num_threads()}


def stapo_eval_command(record: dict[str, Any], model: str) -> str | None:
    """The `stapo-eval` command that gives `record`'s (an `eval.json`'s) numbers for `model`; `None` where it cannot
    build the same prompts (not `builtin:tiny-math`'s test split, another instruction, `chat_template_kwargs`)."""
    r = record
    prompts = (r["dataset"], r["split"], r["instruction"], r["chat_template_kwargs"])
    if prompts != ("builtin:tiny-math", "test", INSTRUCTION, None):
        return None
    argv = ["stapo-eval", "--model", model, "--benchmarks", "tiny-math", "--limit", r["limit"]]
    argv += ["--decoding", r["decoding"], "--samples", r["k"], "--max-new-tokens", r["max_new_tokens"]]
    argv += ["--seed", r["seed"], "--backend", "hf", "--dtype", r["dtype"], "--batch-size", r["batch_size"]]
    return shlex.join(map(str, [*argv, "--threads", r["threads"]]))


def summarize_s2t(rows: list[dict[str, Any]], output_dir: str | None = None) -> dict[str, Any]:
    """The S2T summary of a run's `metrics.jsonl` rows: the mean of the rows' silenced ratios, the pooled ratio of the
    run ([`~stapo_trl.run_folder.logs.s2t_totals`]) and, with `output_dir`, what its candidates were
    ([`candidate_facts`] of `spurious_tokens.jsonl`). Empty without `s2t/` metrics."""
    ratios = [r["s2t/silenced_ratio"] for r in rows if r.get("s2t/silenced_ratio") is not None]
    totals = s2t_totals(rows)
    if not ratios or totals is None:
        return {}
    summary = {
        "mean_silenced_ratio": sum(ratios) / len(ratios),
        "fraction_of_logging_steps_with_silencing": sum(r > 0 for r in ratios) / len(ratios),
        **totals,
    }
    if output_dir is not None and os.path.isfile(os.path.join(output_dir, SPURIOUS_TOKENS_FILENAME)):
        summary["candidates"] = candidate_facts(read_token_records(output_dir))
    return summary


def write_figures(script_args, training_args, output_dir: str) -> list[dict[str, Any]]:
    """`training_curves.png` and the diagnostics figures of the run (main process); returns the metrics rows."""
    if not os.path.isfile(os.path.join(output_dir, METRICS_FILENAME)):
        return []
    rows = read_metrics(output_dir)
    if rows:
        label = f"{script_args.trainer} (seed {training_args.seed})"
        plot_training_curves({label: [rows]}, os.path.join(output_dir, CURVES_FILENAME), title=output_dir)
        plot_diagnostics([output_dir], output_dir, labels=[label])
    return rows


def evaluation_kind(split: str) -> str:
    """How the console names a before/after evaluation on `split` (its label in `eval.json`): "held-out", or
    "training (not held-out)" when it read the training prompts."""
    return "training (not held-out)" if split == NOT_HELD_OUT else "held-out"


def make_eval_record(script_args, training_args, trainer, before, after, max_new_tokens: int, model: str):
    """The content of `eval.json`: held-out avg@k and pass@k before and after training, every setting that gives
    them, and the `stapo-eval` commands that reproduce them for `model` (the initial one) and `output_dir`
    ([`stapo_eval_command`]; `None`: none can)."""
    a, k = script_args, script_args.eval_num_samples
    record = {
        "metric": f"avg@{k}",
        "accuracy_before": before[f"avg@{k}"],
        "accuracy_after": after[f"avg@{k}"],
        f"pass@{k}_before": before["pass@k"][str(k)],
        f"pass@{k}_after": after["pass@k"][str(k)],
        "k": k,
        "decoding": after["decoding"],
        "temperature": a.eval_temperature,
        "top_p": a.eval_top_p,
        "top_k": None,
        "max_new_tokens": max_new_tokens,
        "num_problems": before["num_problems"],
        "limit": a.eval_num_problems,
        "dataset": a.dataset_name,
        "split": evaluation_split(a.dataset_name, a.dataset_test_split)[0],
        "instruction": prompt_dataset_kwargs(a)["instruction"],
        "chat_template_kwargs": training_args.chat_template_kwargs,
        "seed": training_args.seed,
        "backend": "hf",
        "dtype": after["dtype"],
        "batch_size": a.eval_batch_size * k,  # sequences per generate call
        "threads": after["threads"],
        "num_processes": trainer.accelerator.num_processes,
        "trainer": a.trainer,
        "global_step": trainer.state.global_step,
    }
    models = {"before": model, "after": training_args.output_dir}
    commands = {when: stapo_eval_command(record, model) for when, model in models.items()}
    return record | {"stapo_eval_command": commands if all(commands.values()) else None}


def eval_results_path(output_dir: str, global_step: int) -> str:
    """Where this run's before/after results go: `eval.json`, else (an earlier run's is there: a rerun or a continued
    run, whose results are never replaced) `eval-step{global_step}.json`, then `eval-step{global_step}-2.json`, ..."""
    path = os.path.join(output_dir, EVAL_FILENAME)
    if not os.path.exists(path):
        return path
    stem = os.path.join(output_dir, f"eval-step{global_step}")
    candidate, n = f"{stem}.json", 1
    while os.path.exists(candidate):
        n += 1
        candidate = f"{stem}-{n}.json"
    return candidate


def print_summary(script_args, output_dir, step, s2t_summary, eval_record, max_new_tokens, timings) -> None:
    """The end of a run on the console: the S2T counts, the held-out accuracy, the wall times, and the files written
    ([`files_summary`]: every metric is in `metrics.jsonl`, the figures beside it)."""
    print(f"\n=== {script_args.trainer} run finished: {output_dir} (step {step}) ===")
    if s2t_summary:
        print(
            f"S2T: {s2t_summary['num_silenced']} of {s2t_summary['num_loss_tokens']} loss tokens silenced, pooled "
            f"silenced ratio {s2t_summary['silenced_ratio']:.3g} (mean over logging steps "
            f"{s2t_summary['mean_silenced_ratio']:.3g}); the mask fired at {s2t_summary['rows_with_silencing']} of "
            f"{s2t_summary['num_rows']} logging steps; {s2t_summary['num_candidates']} candidates."
        )
        facts = s2t_summary.get("candidates")
        if facts:
            logged = facts["silenced"] + facts["kept"]
            sample = "all" if logged == s2t_summary["num_candidates"] else f"a sample of {logged}"
            print(
                f"Candidates in spurious_tokens.jsonl ({sample}): {facts['silenced']} silenced, {facts['kept']} kept "
                f"({facts['kept_below']} of them with H < {facts['entropy_below']:g} nats); "
                f"{facts['masks_with_candidates']} masks had a candidate, {facts['masks_with_one_candidate']} exactly "
                f"one (a lone candidate is never silenced: strict H < tau_h)."
            )
    if eval_record is not None:
        print(
            f"{evaluation_kind(eval_record.get('split', '')).capitalize()} {eval_record['metric']} on "
            f"{eval_record['num_problems']} problems (T={eval_record['temperature']}, "
            f"top_p={eval_record['top_p']}, {max_new_tokens} new tokens): "
            f"before {100 * eval_record['accuracy_before']:.1f} % -> after {100 * eval_record['accuracy_after']:.1f} %"
        )
        if eval_record.get("stapo_eval_command"):
            print(f"The same numbers from stapo-eval: {eval_record['stapo_eval_command']['after']}")
    print("Wall time (s): " + ", ".join(f"{name} {value:.0f}" for name, value in timings.items()))
    files = files_summary(output_dir)
    if files:
        print(files)


def write_eval_record(eval_record: dict[str, Any], output_dir: str, global_step: int) -> str:
    """Write the before/after record to `eval.json`, or beside an earlier run's (never over it); return the path."""
    path = eval_results_path(output_dir, global_step)
    if os.path.basename(path) != EVAL_FILENAME:
        logger.warning(
            f"{output_dir} already holds {EVAL_FILENAME} from an earlier run: kept unchanged; these results "
            f"are written beside it, to {os.path.basename(path)}."
        )
    with open_run_file(path) as f:
        json.dump(eval_record, f, indent=2)
    return path


RUN_FILES = (  # the files a run can leave in output_dir, with what each holds
    ("metrics.jsonl", "every metric of every logging step"),
    ("spurious_tokens.jsonl", "the silenced tokens in context"),
    ("training_curves.png", "reward, entropy and silenced ratio over steps"),
    ("s2t_*.png", "the S2T diagnostics"),
    ("eval*.json", "accuracy before and after training"),
    ("train_results.json", "runtime and final loss"),
    ("README.md", "the model card"),
    ("model.safetensors", "the trained model, with its tokenizer and config"),
    ("adapter_model.safetensors", "the trained adapter"),
    ("checkpoint-*", "checkpoints: the same command resumes the newest complete one"),
)


def files_summary(output_dir: str) -> str:
    """`Files in DIR:` and a line per file (or pattern, with its count) of [`RUN_FILES`] present; empty when none."""
    import fnmatch

    present = sorted(os.listdir(output_dir)) if os.path.isdir(output_dir) else []
    lines = []
    for pattern, what in RUN_FILES:
        names = sorted(fnmatch.filter(present, pattern), key=lambda n: (len(n), n))
        if names:
            shown = ", ".join(names) if len(names) <= 2 else f"{names[0]} ... {names[-1]} ({len(names)})"
            lines.append(f"  {shown:<40}  {what}")
    return "\n".join([f"Files in {output_dir}:", *lines]) if lines else ""


def candidate_facts(records: list[dict[str, Any]], entropy_below: float = 0.3) -> dict[str, Any]:
    """What the candidates of a run's `spurious_tokens.jsonl` records were: `silenced`, `kept` (a sample) and
    `kept_below` (kept with H < `entropy_below` nats); `masks_with_candidates` and `masks_with_one_candidate` (a mask is
    told apart by its update and tau_h; a lone candidate is never silenced: strict H < tau_h), `kept_alone`."""
    candidates = [r for r in records if r["kind"] in ("silenced", "kept_candidate")]
    kept = [r for r in candidates if r["kind"] == "kept_candidate"]
    masks: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for record in candidates:
        masks.setdefault((record.get("update", record["step"]), record.get("entropy_threshold")), []).append(record)
    alone = [group[0] for group in masks.values() if len(group) == 1]
    return {
        "silenced": len(candidates) - len(kept),
        "kept": len(kept),
        "kept_below": sum(1 for r in kept if r["entropy"] < entropy_below),
        "entropy_below": entropy_below,
        "masks_with_candidates": len(masks),
        "masks_with_one_candidate": len(alone),
        "kept_alone": sum(1 for r in alone if r["kind"] == "kept_candidate"),
    }
