"""The surface a user relies on: the public names, the three commands and every flag (one that goes on purpose leaves
these lists with a CHANGELOG line), the demo learning as the README says."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import warnings
from importlib import metadata

import pytest
import yaml
from testing_utils import RECIPES_DIR, REPO, STAPO_RECIPE, builtin_cache_root, subprocess_env, write_jsonl


PUBLIC_NAMES = [
    *((module, name) for module in ("stapo_trl", "stapo_trl.core") for name in ("STAPOTrainer", "STAPOConfig",
                                                                                "s2t_mask", "S2TResult")),
    ("stapo_trl.rewards", "math_accuracy_reward"), ("stapo_trl.models", "resolve_model_path"),
    *(("stapo_trl.data", name) for name in ("make_tiny_math_dataset", "format_prompt", "INSTRUCTION")),
]  # fmt: skip


@pytest.mark.parametrize("module, name", PUBLIC_NAMES, ids=[f"{m}.{n}" for m, n in PUBLIC_NAMES])
def test_public_name_imports_from_where_the_readme_says(module, name):
    assert hasattr(importlib.import_module(module), name)


# Names the docs told users to import from a path that moved: each path imports them for one release (warned).
IMPORTED_FROM_0_3_PATHS = {
    "stapo_trl.callbacks": ["add_command_callbacks", "SaveOnSignal"],
    "stapo_trl.preflight": ["check_hub_access", "check_hub_model", "check_hub_dataset", "prompt_token_budget"],
    "stapo_trl.checks": ["check_reward_columns", "check_prompt_column", "check_chat_template"],
    "stapo_trl.run_files": ["SpuriousTokenLogger", "MetricsLogCallback", "read_metrics", "read_token_records"],
    "stapo_trl.checkpoints": ["resume_checkpoint", "check_checkpoint", "run_settings", "check_run_settings"],
    "stapo_trl.model_card": ["model_card"],
    "stapo_trl.plots": ["plot_prob_entropy_scatter", "load_token_records", "plot_output_dirs", "plot_diagnostics"],
    "stapo_trl.config": ["STAPOConfig"],
    "stapo_trl.trainer": ["STAPOTrainer", "GRPOBaselineTrainer", "tiny_model_threads"],
    "stapo_trl.grading": ["grade", "extract_boxed_answer"],
}


@pytest.mark.parametrize("module", IMPORTED_FROM_0_3_PATHS)
def test_a_module_path_of_0_3_still_imports_its_names(module):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        imported = importlib.import_module(module)
        assert all(callable(getattr(imported, name)) for name in IMPORTED_FROM_0_3_PATHS[module])


@pytest.mark.parametrize("module", ["stapo_trl", "stapo_trl.core"])
def test_the_trainer_and_config_are_trls_and_the_rule_is_one_function(module):
    from trl import GRPOConfig, GRPOTrainer

    from stapo_trl import core

    package = importlib.import_module(module)
    assert issubclass(package.STAPOTrainer, GRPOTrainer) and issubclass(package.STAPOConfig, GRPOConfig)
    assert package.s2t_mask is core.s2t_mask and package.S2TResult is core.S2TResult


def test_s2t_mask_takes_the_notebooks_arguments_and_returns_its_fields():
    # Four candidates (p = 0.001 < tau_p, advantage > 0), entropies 0.1-0.4: tau_h at q = 0.75 is 0.325 (linear).
    import math

    import torch

    from stapo_trl import s2t_mask

    logps, entropies = torch.full((1, 4), math.log(0.001)), torch.tensor([[0.1, 0.2, 0.3, 0.4]])  # (B, T), nats
    result = s2t_mask(logps, entropies, torch.tensor([1.0]), torch.ones(1, 4, dtype=torch.long), prob_threshold=0.002,
                      entropy_quantile=0.75)  # fmt: skip
    assert (result.num_loss_tokens, result.num_candidates, result.num_silenced) == (4, 4, 3)
    assert result.entropy_threshold == pytest.approx(0.325)
    assert result.candidate.tolist() == [[True] * 4]
    assert result.silenced.tolist() == [[True, True, True, False]]


def test_the_readme_helpers_behave_as_printed(tiny_math_model_path, monkeypatch):
    from stapo_trl.data import INSTRUCTION, format_prompt, make_tiny_math_dataset
    from stapo_trl.models import resolve_model_path
    from stapo_trl.rewards import math_accuracy_reward

    assert INSTRUCTION == "Please reason step by step, and put your final answer within \\boxed{}."
    assert format_prompt("47+38") == [{"role": "user", "content": f"47+38\n{INSTRUCTION}"}]
    # 1.0 when the last \boxed{} equals `solution`, else 0.0; strings and chat messages (what TRL passes) alike.
    answer = "7+8=15, write 5 carry 1; 4+3+1=8; \\boxed{85}"
    completions = [answer, [{"role": "assistant", "content": answer}], "\\boxed{85} then \\boxed{84}"]
    assert math_accuracy_reward(completions, solution=["85", "85", "85"]) == [1.0, 1.0, 0.0]
    train = make_tiny_math_dataset()["train"].select_columns(["prompt", "solution"])
    assert train[0]["prompt"][0]["content"].endswith(INSTRUCTION) and train[0]["solution"].isdigit()
    # A builtin name resolves to the cached build (no rebuild here), a folder to itself.
    monkeypatch.setenv("STAPO_TRL_CACHE", str(builtin_cache_root(tiny_math_model_path)))
    assert resolve_model_path("builtin:tiny-math") == tiny_math_model_path
    assert resolve_model_path(tiny_math_model_path) == tiny_math_model_path


COMMANDS = {
    "stapo-train": "stapo_trl.cli.train",
    "stapo-eval": "stapo_trl.cli.eval",
    "stapo-plot": "stapo_trl.cli.plot",
}

# Every flag `stapo-eval` accepts, with a value it accepts (None: a switch).
EVAL_FLAGS = {
    "--model": "/nonexistent-model", "--revision": "main", "--benchmarks": "tiny-math", "--decoding": "paper",
    "--samples": "2", "--max-new-tokens": "16", "--backend": "hf", "--data-dir": ".", "--output": "results.json",
    "--limit": "3", "--seed": "1", "--batch-size": "4", "--threads": "1", "--dtype": "float32",
    "--tensor-parallel-size": "1", "--gpu-memory-utilization": "0.5", "--max-model-len": "64",
    "--no-chat-template": None, "--save-completions": None,
}  # fmt: skip
# Every flag `stapo-plot` accepts beside its OUTPUT_DIR arguments.
PLOT_FLAGS = {"--out": "figures", "--labels": "run", "--title": "a title", "--smoothing": "3"}

# `stapo-train`'s options that answer without a recipe.
TRAIN_OPTIONS = [["--help"], ["-h"], ["--version"], ["--dry-run", "--help"], ["--dry_run", "--help"]]
# The fields `stapo-train` accepts as --FIELD and --FIELD-NAME beyond every recipe key: the script arguments, the S2T
# fields, those a documented command line names (TRL's other fields come and go with its releases).
TRAIN_FIELDS = [
    "trainer", "reward_funcs", "dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split",
    "prompt_column", "solution_column", "instruction", "strip_dapo_instruction", "max_prompt_tokens",
    "max_train_samples", "eval_before_after", "eval_num_problems", "eval_num_samples", "eval_temperature",
    "eval_top_p", "eval_max_new_tokens", "eval_batch_size", "benchmark_eval", "benchmark_eval_data_dir",
    "benchmark_eval_steps", "benchmark_eval_samples", "benchmark_eval_limit", "torch_num_threads",
    "s2t_prob_threshold", "s2t_entropy_quantile", "s2t_mode", "s2t_write_run_files",
    "output_dir", "seed", "max_steps", "model_name_or_path", "gradient_accumulation_steps", "steps_per_generation",
    "per_device_train_batch_size", "resume_from_checkpoint", "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization",
    "vllm_max_model_length", "vllm_server_host", "vllm_server_port",
]  # fmt: skip


def _run(command: str, *args: str, cwd=REPO) -> subprocess.CompletedProcess:
    module, env = COMMANDS.get(command, command), subprocess_env(PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True)


def _options(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", help_text))


def test_the_three_commands_are_installed_console_scripts():
    scripts = {ep.name: ep.value for ep in metadata.entry_points(group="console_scripts")}
    for command, module in COMMANDS.items():
        assert scripts.get(command) == f"{module}:main", command
        assert callable(importlib.import_module(module).main)


@pytest.mark.parametrize("command, flags, argv, expected", [  # every flag parses: the command gets as far as its input
        ("stapo-eval", EVAL_FLAGS, [], "Model directory '/nonexistent-model' does not exist"),
        ("stapo-eval", {"--compare": "a.json"}, ["b.json"], "[Errno 2] No such file or directory: 'a.json'"),
        ("stapo-plot", PLOT_FLAGS, ["/nonexistent-run"], "No metrics.jsonl in '/nonexistent-run'"),
])  # fmt: skip
def test_stapo_eval_and_plot_list_and_accept_every_flag(tmp_path, command, flags, argv, expected):
    assert set(flags) | {"--version", "--help"} <= _options(_run(command, "--help").stdout)
    words = [word for flag, value in flags.items() for word in (flag, value) if word is not None]
    proc = _run(command, *words, *argv, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.startswith(f"{command}: error: {expected}"), proc


def test_stapo_train_lists_every_field_in_both_spellings(capsys):
    from stapo_trl.cli.train import main

    with pytest.raises(SystemExit, match="^0$"):
        main(["--help-fields"])
    listed = _options(capsys.readouterr().out)
    recipe_keys = {key for path in RECIPES_DIR.rglob("*.yaml") if "accelerate_configs" not in path.parts
                   for key in yaml.safe_load(path.read_text())}  # fmt: skip
    for field in sorted(recipe_keys | set(TRAIN_FIELDS)):
        assert f"--{field}" in listed and f"--{field.replace('_', '-')}" in listed, field
    with pytest.raises(SystemExit):
        main(["--help_fields", "s2t_"])  # the other spelling, and a word
    assert _options(capsys.readouterr().out) >= {"--s2t_prob_threshold", "--s2t_entropy_quantile", "--s2t_mode"}


@pytest.mark.parametrize("dry_run", [["--dry-run", "--num-processes", "2"], ["--dry_run", "--num_processes", "2"]])
def test_stapo_train_dry_run_accepts_the_documented_overrides(tmp_path, capsys, dry_run):
    from stapo_trl.cli.train import main

    data = write_jsonl(
        tmp_path / "problems.jsonl", [{"question": f"{a}+1", "answer": str(a + 1)} for a in range(10, 40)]
    )
    with pytest.raises(SystemExit) as excinfo:
        main([
            "--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "mine"), "--seed", "1", "--max-steps", "50",
            "--dataset_name", data, "--prompt_column", "question", "--solution-column", "answer", "--reward_funcs",
            "math_accuracy", "--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "2",
            "--steps_per_generation", "4", "--torch-num-threads", "1", "--s2t_prob_threshold", "0.002",
            "--s2t-entropy-quantile", "0.75", "--s2t_mode", "low_entropy", *dry_run,
        ])  # fmt: skip
    out = capsys.readouterr()
    assert excinfo.value.code == 0 and "error" not in out.err.lower(), out.err
    assert "for 2 training process(es): OK" in out.out, out.out


@pytest.mark.parametrize("command, argv", [*(("stapo-train", argv) for argv in TRAIN_OPTIONS),
                                           ("stapo_trl.cli.dry_run", ["--help"])])  # fmt: skip
def test_stapo_train_and_its_dry_run_module_answer_their_own_options(command, argv):
    proc = _run(command, *argv)
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout.strip(), proc.stderr
    first = "Dry run of a recipe" if "dry" in f"{command}{argv}" else "stapo-train (" if "-v" in argv[0] else "usage:"
    assert proc.stdout.lstrip().startswith(first), proc.stdout


@pytest.mark.slow  # `make demo` itself: 500 updates and 2 x 1,200 held-out samples, ~2-5 min on 2 shared cores
def test_the_demo_recipe_raises_held_out_accuracy_by_15_points(tiny_math_model_path, tmp_path):
    env = subprocess_env(STAPO_TRL_CACHE=str(builtin_cache_root(tiny_math_model_path)), PYTHONPATH=str(REPO))
    out = tmp_path / "demo-stapo"
    proc = subprocess.run(
        [sys.executable, "-m", "stapo_trl.cli.train", "--config", STAPO_RECIPE, "--output_dir", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    evaluation = json.loads((out / "eval.json").read_text())
    assert (evaluation["k"], evaluation["num_problems"]) == (4, 300)
    assert evaluation["accuracy_after"] - evaluation["accuracy_before"] >= 0.15, evaluation
