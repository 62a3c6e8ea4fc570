"""One `stapo-train` run after [`~stapo_trl.cli.prepare.prepare`]: evaluation, training, model, card, figures, push."""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
import shlex
import sys
import time
import warnings
from functools import partial

import datasets
import torch
import transformers
from trl import get_peft_config, get_quantization_config
from trl.models.utils import unwrap_model_for_generation

from ..data import INSTRUCTION, NOT_HELD_OUT, evaluation_split, model_max_positions
from ..evaluation.generation import decoding_setting, evaluate_problems, hf_generate
from ..evaluation.tasks import BenchmarkProblem
from ..rewards import NoRewardWarning, reward_error_line
from ..run_folder.checkpoints import LinkError, command_line, hold_run_folder, open_run_file
from ..run_folder.logs import METRICS_FILENAME, SPURIOUS_TOKENS_FILENAME, read_metrics, read_token_records, s2t_totals
from ..trainer.trainers import GRPOBaselineTrainer, STAPOTrainer, tiny_model_threads
from .callbacks import add_command_callbacks
from .errors import InputError, full_disk_in_one_line, quiet_upstream
from .figures import plot_diagnostics, plot_training_curves
from .prepare import PreparedRun, prepare


logger = logging.getLogger(__name__)

RUN_FILES = {  # the files a run can leave in output_dir
    "metrics.jsonl": "every metric of every logging step", "spurious_tokens.jsonl": "the silenced tokens in context",
    "training_curves.png": "reward, entropy and silenced ratio over steps", "s2t_*.png": "the S2T diagnostics",
    "eval*.json": "accuracy before and after training", "train_results.json": "runtime and final loss",
    "README.md": "the model card", "model.safetensors": "the trained model, with its tokenizer and config",
    "adapter_model.safetensors": "the trained adapter",
    "checkpoint-*": "checkpoints: the same command resumes the newest complete one",
}  # fmt: skip


@contextlib.contextmanager
def torch_threads(num_threads: int | None):
    """Run the block on `num_threads` torch threads and `OMP_NUM_THREADS` (`None`: unchanged)."""
    threads, omp = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    if num_threads is not None:
        torch.set_num_threads(num_threads)
        os.environ["OMP_NUM_THREADS"] = str(num_threads)
    try:
        yield
    finally:
        if num_threads is not None:
            torch.set_num_threads(threads)
            if omp is None:
                os.environ.pop("OMP_NUM_THREADS")
            else:
                os.environ["OMP_NUM_THREADS"] = omp


def resume_command(argv: list[str] | None = None) -> str:
    """The command that resumes this run (under a launcher: its launch line), secrets written `REDACTED`."""
    args = command_line(sys.argv[1:] if argv is None else argv)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"the same launch command, i.e. accelerate launch [your launch options] -m stapo_trl.cli.train {args}"
    return f"stapo-train {args}"


def train(script_args, training_args, model_args, prepared: PreparedRun | None = None, *, end_training=True) -> dict:
    """One training (`end_training=False`: trackers kept) -> `output_dir`, `global_step`, `eval`, `eval_path`, `s2t`,
    `seconds`; raises `InputError` (one line) or `KeyboardInterrupt` (a stop signal, after its checkpoint)."""
    threads = script_args.torch_num_threads
    threads = torch_threads(threads) if threads else tiny_model_threads(prepared.model_path if prepared else None)
    with threads, quiet_upstream(), warnings.catch_warnings():
        warnings.simplefilter("error", NoRewardWarning)
        try:
            with full_disk_in_one_line("stapo-train", training_args.output_dir):
                run = prepared or prepare(script_args, training_args, model_args)
                return _train(run, end_training)
        except NoRewardWarning as e:
            raise InputError("stapo-train", f"{e} Make the reward functions return a number for the completions "
                             "they can judge (None only for those they cannot).") from e  # fmt: skip
        except Exception as e:
            if (line := str(e) if isinstance(e, LinkError) else reward_error_line(e)) is None:
                raise
            raise InputError("stapo-train", line, code=1) from e
        finally:
            if training_args.should_save:
                hold_run_folder(training_args.output_dir, acquire=False)


def _train(run: PreparedRun, end_training: bool) -> dict:
    s, a, m, out = run.s, run.a, run.m, run.a.output_dir
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                        handlers=[logging.StreamHandler(sys.stdout)])  # fmt: skip
    transformers.utils.logging.enable_explicit_format()
    for library in (transformers, datasets):  # now, for the model's load too: the Trainer sets it once it is built
        library.utils.logging.set_verbosity(a.get_process_log_level())
    transformers.set_seed(a.seed)  # before the trainer: a LoRA adapter is initialised with it
    init = {"revision": m.model_revision, "attn_implementation": m.attn_implementation, "dtype": m.dtype}
    a.model_init_kwargs = init | (a.model_init_kwargs or {})
    trainer = (STAPOTrainer if s.trainer == "stapo" else GRPOBaselineTrainer)(
        run.model_path, run.reward_funcs, a, run.train_dataset, run.test_dataset if a.eval_strategy != "no" else None,
        peft_config=get_peft_config(m), quantization_config=get_quantization_config(m),
    )  # fmt: skip
    add_command_callbacks(trainer, resume_hint=f"Resume with the same command: {resume_command()}")
    trainer.run_settings = run.settings
    is_main, say = trainer.accelerator.is_main_process, trainer.accelerator.print
    timings, record, eval_path = {"prepare": run.seconds}, None, None
    max_new_tokens = s.eval_max_new_tokens or a.max_completion_length
    evaluate = partial(_timed, timings, evaluate_trainer_model, trainer, s, run.eval_dataset, max_new_tokens)
    if s.eval_before_after:
        kind = evaluation_kind(evaluation_split(s.dataset_name, s.dataset_test_split)[0])
        say(f"Evaluating the initial model on {len(run.eval_dataset)} {kind} problems ...")
        before = evaluate(name="eval_before")
    done = None  # or a checkpoint at max_steps: the final model
    if run.checkpoint is not None and a.max_steps > 0:
        done = transformers.TrainerState.load_from_json(os.path.join(run.checkpoint, "trainer_state.json"))
        done = done if done.global_step >= a.max_steps else None
    try:
        if done is None:
            say(f"Training with {type(trainer).__name__} ...")
            result = _timed(timings, trainer.train, run.checkpoint, name="train")
            metrics = {k: v for k, v in result.metrics.items() if v is not None}
            trainer.save_metrics("train", metrics | {"train_samples": len(run.train_dataset)})
        else:
            logger.warning(f"{run.checkpoint} is at step {done.global_step} >= max_steps={a.max_steps}: training is "
                           "already complete, nothing is trained. The checkpoint is saved as the final model (and "
                           "evaluated). To train anew use another output_dir; to continue, raise "
                           "max_steps.")  # fmt: skip
            trainer._load_from_checkpoint(run.checkpoint)
            trainer.state = done
        trainer.save_state()
    except KeyboardInterrupt:
        if end_training:
            trainer.end()
        raise
    trainer.save_model(out)
    say(f"Model and tokenizer saved to {out}.")
    dataset = None if s.dataset_name.startswith("builtin:") or os.path.exists(s.dataset_name) else s.dataset_name
    name = os.path.basename(os.path.normpath(out))
    card = partial(trainer.create_model_card, name, dataset, ["stapo_trl", s.trainer])
    if is_main:
        card()
        trainer.model.config.use_cache = True  # training turns the KV cache off
        trainer.model.config.save_pretrained(out)
    rows = read_metrics(out) if is_main and os.path.isfile(os.path.join(out, METRICS_FILENAME)) else []
    if rows:
        label = f"{s.trainer} (seed {a.seed})"
        plot_training_curves({label: [rows]}, os.path.join(out, "training_curves.png"), title=out)
        plot_diagnostics([out], out, labels=[label])
    s2t = summarize_s2t(rows, out)
    if s.eval_before_after:
        say("Evaluating the trained model ...")
        after = evaluate(name="eval_after")
        record = make_eval_record(s, a, trainer, before, after, max_new_tokens, m.model_name_or_path)
        if is_main:
            eval_path, trainer.eval_record = write_eval_record(record, out, trainer.state.global_step), record
            card()
    if is_main:
        print_summary(s, out, trainer.state.global_step, s2t, record, max_new_tokens, timings)
    if a.push_to_hub:
        _push_to_hub(trainer, s, a, record)
    if end_training:
        trainer.end()
    return {"output_dir": out, "global_step": trainer.state.global_step, "eval": record, "eval_path": eval_path,
            "s2t": s2t, "seconds": {name: round(value, 1) for name, value in timings.items()}}  # fmt: skip


def _timed(timings: dict, call, *args, name: str):
    start, result = time.perf_counter(), call(*args)
    return timings.update({name: time.perf_counter() - start}) or result


def _push_to_hub(trainer, s, a, eval_record: dict | None) -> None:
    try:
        trainer.eval_record = eval_record
        trainer.push_to_hub(dataset_name=s.dataset_name, tags=["stapo_trl", s.trainer])
        trainer.accelerator.print(f"Model pushed to the Hub: https://huggingface.co/{trainer.hub_model_id}.")
    except Exception as e:  # noqa: BLE001
        repo, cause = trainer.hub_model_id or a.hub_model_id, str(e).splitlines()[0] if str(e) else ""
        trainer.accelerator.print(f"Push to hub_model_id={repo!r} failed ({type(e).__name__}: {cause}); the model, "
                                  f"card and results are in {a.output_dir}: push them later with `hf upload {repo} "
                                  f"{a.output_dir}`.")  # fmt: skip


def evaluate_trainer_model(trainer, s, eval_dataset, max_new_tokens: int) -> dict:
    """`stapo-eval`'s table of the trainer's model on `eval_dataset` (every process), with decoding, dtype, threads."""
    k, tokenizer = s.eval_num_samples, trainer.processing_class
    rows = zip(eval_dataset["prompt"], eval_dataset["solution"])
    problems = [BenchmarkProblem(str(i), *row, s.dataset_name) for i, row in enumerate(rows)]
    t, p = float(s.eval_temperature), float(s.eval_top_p)
    decoding = decoding_setting("greedy" if t == 0 else f"t{t}-p{p}")
    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
        table, _ = evaluate_problems(
            partial(hf_generate, model, tokenizer, batch_size=s.eval_batch_size * k), tokenizer, problems, n=k,
            decoding=decoding, max_new_tokens=max_new_tokens, seed=trainer.args.seed,
            chat_template_kwargs=trainer.args.chat_template_kwargs, max_positions=model_max_positions(model),
            accelerator=trainer.accelerator,
        )  # fmt: skip
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return table | {"decoding": decoding.name, "dtype": dtype, "threads": torch.get_num_threads()}


def evaluation_kind(split: str) -> str:
    return "training (not held-out)" if split == NOT_HELD_OUT else "held-out"


def make_eval_record(s, a, trainer, before, after, max_new_tokens: int, model: str) -> dict:
    """`eval.json`: avg@k and pass@k before and after, their settings, and the `stapo-eval` commands that give them."""
    k = s.eval_num_samples
    record = {
        "metric": f"avg@{k}", "accuracy_before": before[f"avg@{k}"], "accuracy_after": after[f"avg@{k}"],
        f"pass@{k}_before": before["pass@k"][str(k)], f"pass@{k}_after": after["pass@k"][str(k)], "k": k,
        "decoding": after["decoding"], "temperature": s.eval_temperature, "top_p": s.eval_top_p, "top_k": None,
        "max_new_tokens": max_new_tokens, "num_problems": before["num_problems"], "limit": s.eval_num_problems,
        "dataset": s.dataset_name, "split": evaluation_split(s.dataset_name, s.dataset_test_split)[0],
        "instruction": s.dataset_kwargs()["instruction"], "chat_template_kwargs": a.chat_template_kwargs,
        "seed": a.seed, "backend": "hf", "dtype": after["dtype"], "batch_size": s.eval_batch_size * k,
        "threads": after["threads"], "num_processes": trainer.accelerator.num_processes, "trainer": s.trainer,
        "global_step": trainer.state.global_step,
    }  # fmt: skip
    same = (record["dataset"], record["split"], record["instruction"], record["chat_template_kwargs"])
    if same != ("builtin:tiny-math", "test", INSTRUCTION, None):
        return record | {"stapo_eval_command": None}
    argv = ["--benchmarks", "tiny-math", "--limit", record["limit"], "--decoding", record["decoding"], "--samples", k]
    argv += ["--max-new-tokens", max_new_tokens, "--seed", a.seed, "--backend", "hf", "--dtype", record["dtype"]]
    argv += ["--batch-size", record["batch_size"], "--threads", record["threads"]]
    commands = {when: shlex.join(map(str, ["stapo-eval", "--model", name, *argv]))
                for when, name in (("before", model), ("after", a.output_dir))}  # fmt: skip
    return record | {"stapo_eval_command": commands}


def write_eval_record(eval_record: dict, output_dir: str, global_step: int) -> str:
    """Write `eval.json`, else `eval-step{global_step}.json`, then `...-2.json`, ...: never over an earlier run's."""
    path, n = os.path.join(output_dir, "eval.json"), 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(output_dir, f"eval-step{global_step}{f'-{n - 1}' if n > 2 else ''}.json")
    if n > 1:
        logger.warning(f"{output_dir} already holds eval.json from an earlier run: kept unchanged; these results are "
                       f"written beside it, to {os.path.basename(path)}.")  # fmt: skip
    with open_run_file(path) as f:
        json.dump(eval_record, f, indent=2)
    return path


def summarize_s2t(rows: list, output_dir: str | None = None) -> dict:
    """The mean and pooled silenced ratios of `metrics.jsonl` rows and, with `output_dir`, the candidates."""
    ratios = [r["s2t/silenced_ratio"] for r in rows if r.get("s2t/silenced_ratio") is not None]
    if not ratios or (totals := s2t_totals(rows)) is None:
        return {}
    summary = {"mean_silenced_ratio": sum(ratios) / len(ratios), **totals,
               "fraction_of_logging_steps_with_silencing": sum(r > 0 for r in ratios) / len(ratios)}  # fmt: skip
    if output_dir is not None and os.path.isfile(os.path.join(output_dir, SPURIOUS_TOKENS_FILENAME)):
        candidates = [r for r in read_token_records(output_dir) if r["kind"] in ("silenced", "kept_candidate")]
        kept = [r for r in candidates if r["kind"] == "kept_candidate"]
        masks: dict[tuple, list] = {}  # by update and tau_h
        for r in candidates:
            masks.setdefault((r.get("update", r["step"]), r.get("entropy_threshold")), []).append(r)
        alone = [group[0] for group in masks.values() if len(group) == 1]  # never silenced: strict H < tau_h
        summary["candidates"] = {
            "silenced": len(candidates) - len(kept), "kept": len(kept),
            "kept_below": sum(r["entropy"] < 0.3 for r in kept), "entropy_below": 0.3,
            "masks_with_candidates": len(masks), "masks_with_one_candidate": len(alone),
            "kept_alone": sum(r["kind"] == "kept_candidate" for r in alone),
        }  # fmt: skip
    return summary


def print_summary(s, output_dir, step, s2t_summary, eval_record, max_new_tokens, timings) -> None:
    print(f"\n=== {s.trainer} run finished: {output_dir} (step {step}) ===")
    if s2t := s2t_summary:
        ratio = f"{s2t['silenced_ratio']:.3g} (mean over logging steps {s2t['mean_silenced_ratio']:.3g})"
        fired = f"{s2t['rows_with_silencing']} of {s2t['num_rows']} logging steps; {s2t['num_candidates']} candidates"
        print(f"S2T: {s2t['num_silenced']} of {s2t['num_loss_tokens']} loss tokens silenced, pooled silenced ratio "
              f"{ratio}; the mask fired at {fired}.")  # fmt: skip
        if facts := s2t.get("candidates"):
            logged = facts["silenced"] + facts["kept"]
            sample = "all" if logged == s2t["num_candidates"] else f"a sample of {logged}"
            kept = f"{facts['kept']} kept ({facts['kept_below']} of them with H < {facts['entropy_below']:g} nats)"
            masks = f"{facts['masks_with_candidates']} masks had a candidate, {facts['masks_with_one_candidate']}"
            print(f"Candidates in spurious_tokens.jsonl ({sample}): {facts['silenced']} silenced, {kept}; {masks} "
                  "exactly one (a lone candidate is never silenced: strict H < tau_h).")  # fmt: skip
    if r := eval_record:
        print(f"{evaluation_kind(r.get('split', '')).capitalize()} {r['metric']} on {r['num_problems']} problems "
              f"(T={r['temperature']}, top_p={r['top_p']}, {max_new_tokens} new tokens): before "
              f"{100 * r['accuracy_before']:.1f} % -> after {100 * r['accuracy_after']:.1f} %")  # fmt: skip
        if r.get("stapo_eval_command"):
            print(f"The same numbers from stapo-eval: {r['stapo_eval_command']['after']}")
    print("Wall time (s): " + ", ".join(f"{name} {value:.0f}" for name, value in timings.items()))
    present = sorted(os.listdir(output_dir)) if os.path.isdir(output_dir) else []
    found = {what: sorted(fnmatch.filter(present, g), key=lambda n: (len(n), n)) for g, what in RUN_FILES.items()}
    shown = {what: ", ".join(n) if len(n) <= 2 else f"{n[0]} ... {n[-1]} ({len(n)})" for what, n in found.items() if n}
    if lines := [f"  {names:<40}  {what}" for what, names in shown.items()]:
        print("\n".join([f"Files in {output_dir}:", *lines]))
