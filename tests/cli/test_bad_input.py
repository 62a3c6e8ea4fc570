"""Input that ended a command with a traceback, or was taken silently: one line each (the measured case, two more)."""

import json
import shutil
from pathlib import Path

import pytest
import transformers
import trl
from testing_utils import PROMPTS, STAPO_RECIPE, addition_rows, error_line, tiny_stapo_config, write_hostile_pickle

from stapo_trl import STAPOConfig, STAPOTrainer
from stapo_trl.cli.eval import main as _eval
from stapo_trl.cli.train import main as _train


def SLOW(*values):  # a training step each (~4 s): the measured case of each kind stays in the default suite
    return pytest.param(*values, marks=pytest.mark.slow)


def _refused(capsys, argv, prog="stapo-train", command=_train, code=2):
    with pytest.raises(SystemExit) as excinfo:
        command(argv)
    assert excinfo.value.code == code
    return error_line(capsys, prog)


DEMO = Path(STAPO_RECIPE).read_text().splitlines()
END = len(DEMO) + 2  # the line of a text appended after the demo recipe and a blank line
LR = next(n for n, line in enumerate(DEMO, start=1) if line.startswith("learning_rate:"))


@pytest.mark.parametrize("added, key, lines", [
        ("learning_rate: 3.0e-4", "learning_rate", (LR, END)),  # measured: the last one won
        ("env:\n  OMP_NUM_THREADS: '1'\n  OMP_NUM_THREADS: '2'", "OMP_NUM_THREADS", (END + 1, END + 2)),
        ("model_init_kwargs: {revision: main, revision: v2}", "revision", (END, END)),
])  # fmt: skip
def test_a_recipe_key_given_twice_is_one_line(tmp_path, capsys, no_model_built, added, key, lines):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("\n".join(DEMO) + "\n\n" + added + "\n")
    line = _refused(capsys, ["--config", str(recipe), "--output_dir", str(tmp_path / "out")])
    assert line == (f"stapo-train: error: Recipe {str(recipe)!r}: key {key} is given twice (lines {lines[0]} and "
                    f"{lines[1]}): keep one of them.")  # fmt: skip
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("old, new", [
        (b"why: no download", b"why: no d\xffownload"),  # measured: no file named (in a comment)
        (b"output_dir: outputs/demo-stapo", b"output_dir: outputs/d\xe9mo-stapo"),  # Latin-1
        (b"seed: 0", b"s\xc3eed: 0"),  # a cut multi-byte character, in a key
])  # fmt: skip
def test_a_recipe_that_is_not_utf8_is_one_line_naming_the_file_and_line(tmp_path, capsys, no_model_built, old, new):
    data = Path(STAPO_RECIPE).read_bytes()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_bytes(data.replace(old, new))
    at = next(i for i, (a, b) in enumerate(zip(old, new)) if a != b)
    start = data.index(old) + at
    row, column = data[:start].count(b"\n") + 1, start - data.rfind(b"\n", 0, start)
    line = _refused(capsys, ["--config", str(recipe)])
    assert line == (f"stapo-train: error: Recipe {str(recipe)!r} is not UTF-8 text: byte 0x{new[at]:02x} at line "
                    f"{row}, column {column}. Save it as UTF-8 (an editor's 'encoding' "
                    "setting).")  # fmt: skip


@pytest.mark.parametrize("reward_funcs", [None, [], ()])
def test_the_python_api_refuses_no_reward_at_construction_in_trls_words(
    tmp_path, tiny_random_model_path, no_model_built, reward_funcs
):
    args = tiny_stapo_config(tmp_path / "run")
    with pytest.raises(ValueError, match="^No reward source provided. Pass `reward_funcs`, or an `environment_"
                       "factory` whose environment defines a `get_reward` method") as raised:  # fmt: skip
        STAPOTrainer(tiny_random_model_path, reward_funcs, args=args, train_dataset=PROMPTS)
    assert str(raised.value).endswith(f'(reward_funcs={reward_funcs!r}; e.g. "math_accuracy", a reward model id).')


def test_the_python_api_refuses_an_empty_output_dir_before_writing(tmp_path, tiny_random_model_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = dict(output_dir="", use_cpu=True, bf16=False, per_device_train_batch_size=4, num_generations=2)
    for args in (STAPOConfig(**settings), trl.GRPOConfig(**settings)):  # checked where the run writes: the trainer
        with pytest.raises(ValueError, match=r"^output_dir='' is empty: give the folder the run writes"):
            STAPOTrainer(tiny_random_model_path, len, args=args, train_dataset=PROMPTS)  # any reward: refused first
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("second_file", [
        '{rows3}\n{{"problem": "1+1", "answer": "2"\n{rows1}\n',  # measured
        '{rows3}\n{{"problem": "1+1"',  # cut short by a copy
])  # fmt: skip
def test_a_dataset_folder_with_one_bad_line_is_one_line(tmp_path, capsys, no_model_built, second_file):
    folder, rows = tmp_path / "data", [json.dumps(row) for row in addition_rows(8)]
    folder.mkdir()
    (folder / "a.jsonl").write_text("\n".join(rows) + "\n")
    (folder / "b.jsonl").write_text(second_file.format(rows3="\n".join(rows[:3]), rows1=rows[4]))
    argv = ["--config", STAPO_RECIPE, "--dataset_name", str(folder), "--output_dir", str(tmp_path / "o")]
    assert _refused(capsys, argv) == (f"stapo-train: error: dataset folder {str(folder)!r} could not be read: "
                                      "b.jsonl line 4 is not a JSON object")  # fmt: skip


EVAL = ["--benchmarks", "tiny-math", "--backend", "hf", "--limit", "2", "--samples", "1", "--max-new-tokens", "48"]


@pytest.fixture(scope="module")
def checkpointed_run(tmp_path_factory, tiny_math_model_path):
    out = tmp_path_factory.mktemp("eval-run") / "run"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--max_steps", "1"]
    argv += ["--save_steps", "1", "--eval_before_after", "false", "--disable_tqdm", "true", "--max_train_samples", "8"]
    _train([*argv, "--s2t_write_run_files", "false", "--output_dir", str(out)])  # why: no run files, no figures
    return out


NO_MODEL = "Model directory '{folder}' holds no model (no "
INCOMPLETE = "Model directory '{checkpoint}' is not a complete checkpoint ("


@pytest.mark.parametrize("case, expected", [
        ("empty-folder", NO_MODEL + "config.json): give a folder saved by save_pretrained"),
        ("run-without-final-model", NO_MODEL + "config.json): it is a run folder without its final model: give its "
                                               "newest complete checkpoint, {folder}/checkpoint-1."),
        ("config-without-weights", NO_MODEL + "weights (*.safetensors)): "),
        ("half-written", INCOMPLETE + "no trainer_state.json: its save"),
        ("model-cut", INCOMPLETE + "model.safetensors damaged: "),
        ("removed-while-loading", "--model {checkpoint} could not be loaded ("),  # rotated away (save_total_limit)
])  # fmt: skip
def test_stapo_eval_on_a_folder_without_a_complete_model_is_one_line(
    checkpointed_run, tmp_path, capsys, monkeypatch, case, expected
):
    run, folder = shutil.copytree(checkpointed_run, tmp_path / "run"), tmp_path / "model"
    checkpoint = run / "checkpoint-1"
    folder.mkdir()
    if case == "run-without-final-model":  # a run stopped before its final save: checkpoints only
        shutil.copytree(checkpoint, folder / "checkpoint-1")
    elif case == "config-without-weights":
        shutil.copy(run / "config.json", folder / "config.json")
    elif case == "half-written":
        (checkpoint / "trainer_state.json").unlink()
    elif case == "model-cut":
        (checkpoint / "model.safetensors").write_bytes((checkpoint / "model.safetensors").read_bytes()[:50_000])
    elif case == "removed-while-loading":  # after the checks, as the model loads
        load = transformers.AutoModelForCausalLM.from_pretrained.__func__

        def rotated_away(cls, path, *args, **kwargs):
            shutil.rmtree(checkpoint)
            return load(cls, path, *args, **kwargs)

        monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(rotated_away))
    model = checkpoint if "{checkpoint}" in expected else folder
    line = _refused(capsys, ["--model", str(model), *EVAL], prog="stapo-eval", command=_eval)
    assert line.startswith(f"stapo-eval: error: {expected.format(folder=folder, checkpoint=checkpoint)}"), line


def test_stapo_eval_reads_no_pickle_of_a_checkpoint(checkpointed_run, tmp_path, capsys):
    # A hostile training_args.bin is left alone (the model is evaluated), a hostile optimizer.pt is refused.
    checkpoint, marker = shutil.copytree(checkpointed_run, tmp_path / "run") / "checkpoint-1", tmp_path / "code-ran"
    write_hostile_pickle(checkpoint / "training_args.bin", marker)
    _eval(["--model", str(checkpoint), *EVAL])
    assert json.loads((checkpoint / "stapo_eval.json").read_text())["results"]
    write_hostile_pickle(checkpoint / "optimizer.pt", marker)
    line = _refused(capsys, ["--model", str(checkpoint), *EVAL], prog="stapo-eval", command=_eval)
    assert "(optimizer.pt refused by a safe load: Trying to load unsupported GLOBAL posix.system" in line
    assert not marker.exists()


NO_SIGNAL = ("No reward at step 1: no reward function ({}) gave any of the 64 completions a value (every one None or "
             "NaN), so the step has no learning signal. Make the reward functions return a number for the completions "
             "they can judge (None only for those they cannot).")  # fmt: skip
RAISED = "reward function fragile at step 1 raised {} ({{where}}.py:4, in fragile)"
RETURNED = "Reward function fragile returned {} at step 1, but 64 were expected (one"  # a prefix


@pytest.mark.parametrize("rewards, code, expected", [
        ({"fragile": "[1 / 0] * len(completions)"}, 1, RAISED.format("ZeroDivisionError: division by zero")),
        SLOW({"fragile": "[float(kwargs['difficulty'])] * len(completions)"}, 1,
             RAISED.format("KeyError: 'difficulty'")),
        SLOW({"fragile": "'not a list'"}, 1, RETURNED.format("'not a list'") + " per prompt-"),
        SLOW({"fragile": "[1.0] * (len(completions) - 1)"}, 1, RETURNED.format("63 rewards")),
        ({"nothing": "[None] * len(completions)"}, 2, NO_SIGNAL.format("nothing")),  # reported: trained on, exit 0
        SLOW({"not_a_number": "[math.nan] * len(completions)"}, 2, NO_SIGNAL.format("not_a_number")),
        SLOW({"nothing": "[None] * len(completions)", "not_a_number": "[math.nan] * len(completions)"}, 2,
             NO_SIGNAL.format("nothing, not_a_number")),
])  # fmt: skip
def test_a_reward_that_raises_or_gives_nothing_is_one_line_naming_it_and_the_step(
    tmp_path, capsys, monkeypatch, tiny_math_model_path, rewards, code, expected
):
    monkeypatch.chdir(tmp_path)
    module = f"rewards_{tmp_path.name}"  # one module per test: an imported one stays in sys.modules
    source = "".join(f"\ndef {name}(completions, **kwargs):\n    return {body}\n" for name, body in rewards.items())
    (tmp_path / f"{module}.py").write_text("import math\n" + source)
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--max_steps", "3",
            "--reward_funcs", *(f"{module}.{name}" for name in rewards), "--eval_before_after", "false",
            "--output_dir", "out", "--max_train_samples", "64", "--disable_tqdm", "true"]  # fmt: skip
    line, full = _refused(capsys, argv, code=code), f"stapo-train: error: {expected.format(where=tmp_path / module)}"
    assert line == full or "returned" in full and line.startswith(full), line
