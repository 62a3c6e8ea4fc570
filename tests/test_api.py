"""The Python API as good as the CLI (issue 12, item 11): the README's Python example and CPU multi-process command run
as printed; `STAPOTrainer` checks reward columns at construction and writes the run files `stapo-plot` reads;
`STAPOConfig` picks CPU defaults on a machine without an accelerator."""

from __future__ import annotations

import ast
import functools
import logging
import re
import shlex
import sys
import warnings
from pathlib import Path

import pytest
from datasets import Dataset
from testing_utils import check_two_rank_demo_run, run_distributed, run_subprocess, subprocess_env

from stapo_trl import STAPOConfig, STAPOTrainer
from stapo_trl.config import has_accelerator
from stapo_trl.data import INSTRUCTION
from stapo_trl.models import builtin_model_dir
from stapo_trl.rewards import REWARDS, format_reward, math_accuracy_reward
from stapo_trl.runfiles.callbacks import MetricsLogCallback, SpuriousTokenLogger, add_run_file_callbacks
from stapo_trl.runfiles.metrics_log import read_metrics, read_token_records


REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
EXAMPLE = REPO / "examples" / "python_api.py"
STAPO_RECIPE = str(REPO / "recipes" / "demo" / "stapo.yaml")


def _code_blocks(language: str) -> list[str]:
    """The fenced code blocks of README.md in `language`, each without its fences."""
    return re.findall(rf"^```{language}\n(.*?)^```$", README.read_text(), flags=re.M | re.S)


def _cache_root(model_path: str) -> Path:
    """The `STAPO_TRL_CACHE` under which `builtin:tiny-math` resolves to `model_path` (the session's built model), so
    that a subprocess naming `builtin:tiny-math` loads it instead of building it (~50 s)."""
    root = Path(model_path).parent
    if builtin_model_dir("tiny-math", root) != Path(model_path):
        pytest.skip(f"{model_path} is not a builtin:tiny-math cache entry (STAPO_TRL_TEST_MODEL names another folder)")
    return root


def difficulty_reward(completions, difficulty, **kwargs):
    """A reward that reads a `difficulty` column (the tiny-math data has none)."""
    return [float(d) for d in difficulty]


@pytest.fixture
def no_model_loaded(monkeypatch):
    """Fail the test if construction gets as far as TRL's `__init__` (which loads the model)."""
    import trl

    def guard(self, *args, **kwargs):
        raise AssertionError("GRPOTrainer.__init__ reached: the model would be loaded now")

    monkeypatch.setattr(trl.GRPOTrainer, "__init__", guard)


def _config(tmp_path, **overrides) -> STAPOConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL's gradient_checkpointing deprecation warning
        return STAPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to=[], **overrides)


# ---------------------------------------------------------------------------------------------------------------
# Reward columns, checked at construction (before the model loads) and by stapo-train before the model build
# ---------------------------------------------------------------------------------------------------------------


def test_missing_prompt_column_and_reward_names_are_resolved_at_construction(no_model_loaded, tmp_path):
    """A dataset without `prompt` fails at construction (was a KeyError inside TRL at the first step); a reward given
    by its stapo_trl name is that function (was taken for a Hub reward model: a minute of network retries)."""
    from stapo_trl.rewards import resolve_reward_names

    args = _config(tmp_path)
    no_prompt = Dataset.from_list([{"question": "12+34=", "solution": "46"}])
    with pytest.raises(
        ValueError, match=r"^Column 'prompt' not found in dataset 'train_dataset'\. Available columns: "
    ):
        STAPOTrainer("Qwen/Qwen3-1.7B-Base", reward_funcs=math_accuracy_reward, args=args, train_dataset=no_prompt)
    assert resolve_reward_names("math_accuracy") is math_accuracy_reward
    assert resolve_reward_names(["format", "org/reward-model"]) == [format_reward, "org/reward-model"]
    with pytest.raises(ValueError, match=r"Unknown reward 'math_acc'\. Valid names: \['format', 'math_accuracy'\]"):
        STAPOTrainer("Qwen/Qwen3-1.7B-Base", reward_funcs="math_acc", args=args, train_dataset=no_prompt)
    # By name, the function's own required column is checked too.
    no_solution = Dataset.from_list([{"prompt": "12+34=", "answer": "46"}])
    with pytest.raises(ValueError, match=r"Column 'solution' not found .* 'math_accuracy_reward' needs it"):
        STAPOTrainer("Qwen/Qwen3-1.7B-Base", reward_funcs="math_accuracy", args=args, train_dataset=no_solution)


def test_missing_reward_column_fails_at_construction_naming_function_column_and_columns(no_model_loaded, tmp_path):
    no_solution = Dataset.from_list([{"prompt": "12+34=", "answer": "46"}])
    args = _config(tmp_path)
    # A Hub id that is never fetched: the check comes before TRL loads anything.
    with pytest.raises(ValueError) as error:
        STAPOTrainer("Qwen/Qwen3-1.7B-Base", reward_funcs=math_accuracy_reward, args=args, train_dataset=no_solution)
    assert str(error.value).startswith(
        "Column 'solution' not found in dataset 'train_dataset'. Available columns: ['prompt', 'answer']. "
        "The reward function 'math_accuracy_reward' needs it"
    ), error.value

    # Several rewards and several eval datasets: the first function with a missing argument, the dataset by key.
    with_solution = Dataset.from_list([{"prompt": "12+34=", "solution": "46"}])
    with pytest.raises(ValueError, match=r"Column 'solution' not found in dataset \"eval_dataset\['held_out'\]\""):
        STAPOTrainer(
            "Qwen/Qwen3-1.7B-Base",
            reward_funcs=[format_reward, math_accuracy_reward],
            args=args,
            train_dataset=with_solution,
            eval_dataset={"held_out": no_solution},
        )
    with pytest.raises(ValueError, match=r"Column 'difficulty' not found .* 'difficulty_reward' needs it"):
        STAPOTrainer("Qwen/Qwen3-1.7B-Base", reward_funcs=[difficulty_reward], args=args, train_dataset=with_solution)
    # `prompt` is a column, but TRL passes it as `prompts`: an argument named `prompt` is never filled.
    with pytest.raises(ValueError, match=r"takes an argument 'prompt', which TRL never fills.*`prompts`"):
        STAPOTrainer(
            "Qwen/Qwen3-1.7B-Base", reward_funcs=lambda prompt, completions: [], args=args, train_dataset=with_solution
        )

    # Filled arguments pass the check and construction goes on (to the guard): a column, a default, a bound
    # partial argument, TRL's own arguments and **kwargs.
    for reward in (
        math_accuracy_reward,
        functools.partial(difficulty_reward, difficulty=[1]),
        lambda completions, difficulty=0, **kwargs: [],
        lambda prompts, completions, completion_ids, trainer_state, log_metric, log_extra: [],
    ):
        with pytest.raises(AssertionError, match="the model would be loaded now"):
            STAPOTrainer("Qwen/Qwen3-1.7B-Base", reward_funcs=reward, args=args, train_dataset=with_solution)


def test_stapo_train_refuses_a_missing_reward_column_before_building_a_model(no_model_loaded, monkeypatch, tmp_path):
    from stapo_trl.cli.train import main

    monkeypatch.setitem(REWARDS, "difficulty", difficulty_reward)  # a registered reward reading a `difficulty` column
    expected = (
        r"^stapo-train: error: Column 'difficulty' not found in dataset 'builtin:tiny-math'\. Available columns: "
        r"\['prompt', 'solution'\]\. The reward function 'difficulty_reward' needs it"
    )
    with pytest.raises(SystemExit, match=expected):
        main(["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--reward_funcs", "difficulty"])


# ---------------------------------------------------------------------------------------------------------------
# Run files: metrics.jsonl and spurious_tokens.jsonl from the trainer itself
# ---------------------------------------------------------------------------------------------------------------


def _small_trainer(model_path, tmp_path, **overrides) -> STAPOTrainer:
    prompts = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": f"{i}+{i}\n{INSTRUCTION}"}], "solution": str(2 * i)}
            for i in range(8)
        ]
    )
    args = _config(
        tmp_path,
        max_steps=2,  # why: enough for two log rows
        activation_checkpointing=False,  # why: nothing to save on a tiny model; recomputing only costs time
        logging_steps=1,
        per_device_train_batch_size=4,  # why: 2 prompts x 2 completions keep a step ~0.1 s
        num_generations=2,
        max_completion_length=8,
        save_strategy="no",
        disable_tqdm=True,
        **overrides,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return STAPOTrainer(model_path, reward_funcs=math_accuracy_reward, args=args, train_dataset=prompts)


def test_trainer_writes_each_run_file_once_and_can_be_told_not_to(tiny_random_model_path, tmp_path):
    # A caller's own spurious-token logger (another path, other caps) replaces the built-in one: one writer per file.
    trainer = _small_trainer(tiny_random_model_path, tmp_path / "a")
    custom = tmp_path / "custom_tokens.jsonl"
    trainer.add_callback(SpuriousTokenLogger(trainer, path=str(custom), max_reference=4))
    trainer.train()
    callbacks = trainer.callback_handler.callbacks
    assert sum(isinstance(c, MetricsLogCallback) for c in callbacks) == 1
    assert [c.path for c in callbacks if isinstance(c, SpuriousTokenLogger)] == [str(custom)]
    out = Path(trainer.args.output_dir)
    assert [row["step"] for row in read_metrics(str(out)) if "loss" in row] == [1, 2]
    assert custom.is_file() and not (out / "spurious_tokens.jsonl").exists()
    assert add_run_file_callbacks(trainer) == []  # a second train() adds nothing

    # s2t_write_run_files=False: no files, the metrics stay in log_history.
    trainer = _small_trainer(tiny_random_model_path, tmp_path / "b", s2t_write_run_files=False)
    trainer.train()
    out = Path(trainer.args.output_dir)
    assert not (out / "metrics.jsonl").exists() and not (out / "spurious_tokens.jsonl").exists()
    assert any("s2t/silenced_ratio" in entry for entry in trainer.state.log_history)
    assert not any(
        isinstance(c, (MetricsLogCallback, SpuriousTokenLogger)) for c in trainer.callback_handler.callbacks
    )


# ---------------------------------------------------------------------------------------------------------------
# CPU defaults
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(has_accelerator(), reason="the CPU defaults apply only on a machine without an accelerator")
def test_cpu_only_machine_defaults_to_use_cpu_without_bf16_and_explicit_values_win(tmp_path, caplog):
    from stapo_trl.cli.args import parse_args

    def config(**settings):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return STAPOConfig(output_dir=str(tmp_path), report_to=[], **settings)

    with caplog.at_level(logging.INFO, logger="stapo_trl.config"):
        args = config()  # TRL's bf16 default is refused by transformers here: this raised before
    assert (args.use_cpu, args.bf16) == (True, False)
    lines = [record.getMessage() for record in caplog.records if record.name == "stapo_trl.config"]
    assert len(lines) == 1 and "use_cpu=True, bf16=False" in lines[0], lines
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="stapo_trl.config"):
        explicit = config(use_cpu=True, bf16=True)  # bf16 on a CPU: slow, but the user asked for it
    assert (explicit.use_cpu, explicit.bf16) == (True, True) and not caplog.records
    assert (config(use_cpu=False).use_cpu, config(use_cpu=False).bf16) == (False, False)
    assert config(fp16=False, bf16=False).bf16 is False

    # stapo-train: a recipe without the two keys gets the same defaults; the demo recipe's explicit values stay;
    # a bare `--use_cpu` still means true.
    recipe = tmp_path / "recipe.yaml"
    lines = Path(STAPO_RECIPE).read_text().splitlines()
    recipe.write_text("\n".join(line for line in lines if not line.startswith(("use_cpu:", "bf16:"))))
    for argv, expected in (
        (["--config", str(recipe)], (True, False)),
        (["--config", str(recipe), "--use_cpu", "false"], (False, False)),
        (["--config", str(recipe), "--use_cpu"], (True, False)),
        (["--config", str(recipe), "--bf16", "true"], (True, True)),
        (["--config", STAPO_RECIPE], (True, False)),
    ):
        _, training_args, _ = parse_args(argv)
        assert (training_args.use_cpu, training_args.bf16) == expected, argv


def test_with_an_accelerator_the_defaults_stay_trls(monkeypatch, tmp_path, caplog):
    # Where an accelerator is visible (simulated here: the probe answers yes), use_cpu stays transformers' False and
    # nothing is logged; bf16 is given, since this CPU machine could not honour TRL's True.
    monkeypatch.setattr("stapo_trl.config.has_accelerator", lambda: True)
    with caplog.at_level(logging.INFO, logger="stapo_trl.config"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = STAPOConfig(output_dir=str(tmp_path), report_to=[], bf16=False)
    assert args.use_cpu is False and not [r for r in caplog.records if r.name == "stapo_trl.config"]


# ---------------------------------------------------------------------------------------------------------------
# The README's Python example and CPU multi-process command, run as printed
# ---------------------------------------------------------------------------------------------------------------


def test_readme_python_snippet_is_the_example_file():
    source = EXAMPLE.read_text()
    assert source in _code_blocks("python"), "README.md must show examples/python_api.py verbatim"
    # The one-import switch, and the instruction the built-in model was trained with (or every reward is 0).
    assert "from stapo_trl import STAPOTrainer as GRPOTrainer" in source
    assigned = {node.targets[0].id: node.value for node in ast.parse(source).body if isinstance(node, ast.Assign)}
    assert ast.literal_eval(assigned["INSTRUCTION"]) == INSTRUCTION


def test_python_api_example_runs_as_printed_and_stapo_plot_reads_its_folder(tiny_math_model_path, tmp_path):
    from stapo_trl.cli.plot import main as plot_main

    # The file as printed, in a fresh folder; `builtin:tiny-math` resolves to the session's model (no rebuild).
    env = subprocess_env(
        STAPO_TRL_CACHE=str(_cache_root(tiny_math_model_path)), PYTHONPATH=str(REPO), MPLBACKEND="Agg"
    )
    output = run_subprocess([sys.executable, str(EXAMPLE)], timeout=300, env=env, cwd=tmp_path)
    # Neither transformers' deprecation of TRL's default `gradient_checkpointing` at config time nor of the
    # `*gradient_checkpointing*` methods TRL calls while training reaches a Python-API user (issue 12, item 12).
    assert "FutureWarning" not in output and "is deprecated" not in output, output[-3000:]
    out = tmp_path / "outputs" / "python-api"
    rows = [row for row in read_metrics(str(out)) if "reward" in row]
    assert [row["step"] for row in rows] == list(range(2, 21, 2))
    assert max(row["reward"] for row in rows) > 0.0  # the prompts carry the model's instruction
    assert all("s2t/silenced_ratio" in row for row in rows)
    assert read_token_records(str(out)), "spurious_tokens.jsonl is empty"
    plot_main([str(out)])  # stapo-plot outputs/python-api
    assert (out / "training_curves.png").stat().st_size > 10_000


def _readme_command(marker: str) -> list[str]:
    """The one command of the README bash block that contains `marker`, continuation lines joined, comments dropped."""
    block = next(block for block in _code_blocks("bash") if marker in block)
    lines = [line for line in block.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]
    (command,) = [line for line in lines if marker in line]
    return shlex.split(command)


def test_readme_cpu_two_process_command_trains_on_two_ranks(tiny_math_model_path, tmp_path):
    command = _readme_command("cpu_2proc.yaml")
    assert command[:2] == ["accelerate", "launch"] and "--output_dir" in command, command
    out = tmp_path / "demo-2proc"
    # The printed command with overrides appended, as the README says: `accelerate launch` becomes this Python's
    # `-m accelerate.commands.launch`, a free port goes right after `launch` (a shared machine), and the recipe keys
    # shrink the run (last value wins).
    overrides = [
        "--max_steps", "2",  # why: two optimizer steps on a rollout batch of both ranks
        "--logging_steps", "2",
        "--eval_before_after", "false",  # why: the 300-problem evaluation is the single-process demo's job
        "--save_strategy", "no",
        "--disable_tqdm", "true",
        "--log_level", "info",  # why: the main process logs the total train batch size, which shows two ranks
        "--output_dir", str(out),  # why: not into the checkout's outputs/
    ]  # fmt: skip
    env = subprocess_env(STAPO_TRL_CACHE=str(_cache_root(tiny_math_model_path)))
    output = run_distributed(
        lambda port: (
            [sys.executable, "-m", "accelerate.commands.launch", "--main_process_port", str(port)]
            + command[2:]
            + overrides
        ),
        timeout=900,
        env=env,
    )
    check_two_rank_demo_run(output, out)  # 8 completions per rank x 2 ranks = 16 per step, metrics of both steps
    assert (out / "spurious_tokens.jsonl").is_file()
