"""Input errors of every command: exit status 2 and one line, written in one piece, naming what the user wrote; the
upstream warnings `quiet_upstream` silences, by message, category and module only."""

import errno
import signal
import sys
import warnings
from types import SimpleNamespace

import pytest
from safetensors import SafetensorError
from testing_utils import GRPO_RECIPE, STAPO_RECIPE, error_line, write_metrics_run, write_recipe
from transformers import AutoModelForCausalLM, Trainer

from stapo_trl.cli.args import parse_args
from stapo_trl.cli.callbacks import SaveOnSignal
from stapo_trl.cli.dry_run import main as dry_run_main
from stapo_trl.cli.errors import InputError, full_disk_in_one_line, quiet_upstream
from stapo_trl.cli.eval import main as _eval
from stapo_trl.cli.plot import main as _plot
from stapo_trl.cli.train import main as _train
from stapo_trl.run_folder.logs import MetricsLogCallback


def _dry_run(argv):
    _train(["--max_train_samples", "64", *argv, "--dry-run"])


PROGS = {_train: "stapo-train", _dry_run: "stapo-train --dry-run", _eval: "stapo-eval", _plot: "stapo-plot"}
KEY = "recipe key {key} in {recipe}: "
FIX = " Fix the value in the recipe, or override it on the command line with --{key}."
NO_REWARD = "names no reward: give at least one, one of ['format', 'math_accuracy'] or a dotted path"
SEED = "must be in [0, 2**32 - 1] (numpy's seed range)."
NOTHING = "Nothing to draw: plot a run folder that logged at least one step, or leave this one out."
METRICS = {  # run folders for stapo-plot: {tmp}/NAME/metrics.jsonl
    "empty": "", "blank": "\n   \n", "corrupt": '{"step": 1, "rew\n[1, 2]\n', "steps": '{"step": 1, "epoch": 0.1}\n',
    "cmp/arm/seed0": '{"step": 1, "reward": 0.1}\n', "cmp/arm/seed1": "",
}  # fmt: skip


@pytest.mark.parametrize("command, argv, expected", [
        (_train, ["--s2t_entropy_quantile", "1.5"], "s2t_entropy_quantile=1.5 must be in [0, 1]"),
        (_train, ["--s2t_entropy_quantile", "abc"], "--s2t_entropy_quantile: invalid float value: 'abc' ("  # the flag
                 "s2t_entropy_quantile takes a number). See `stapo-train --help-fields` for every field.\n"),
        (_eval, ["--model", "m", "--samples", "0"], "--samples must be >= 1"),
        (_eval, ["--model", "m", "--gpu-memory-utilization", "1.5"], "must be in (0, 1]"),
        (_plot, ["{tmp}/no-run"], "No metrics.jsonl in"),
        (_plot, ["{tmp}/cmp"], "No metrics.jsonl in"),  # seed folders one level too deep
        (_plot, ["{run}", "--labels", "a", "b"], "--labels: got 2 label(s) for 1 OUTPUT_DIR(s)"),
        (_plot, ["{run}", "--smoothing", "0"], "--smoothing 0: the moving-average window"),
        (_plot, ["{run}", "--smoothing", "-3"], "--smoothing -3: the moving-average window must be >= 1 logged step."),
        (_plot, ["{tmp}/empty"], "{tmp}/empty/metrics.jsonl is empty: the run has not reached its first logging step "
                                 f"(logging_steps) yet, or stopped before it. {NOTHING}"),
        (_plot, ["{tmp}/blank"], "{tmp}/blank/metrics.jsonl is empty: the run has not reached its first logging step"),
        (_plot, ["{tmp}/corrupt"], "{tmp}/corrupt/metrics.jsonl holds no metrics row (see the warning above for its "
                                   f"lines). {NOTHING}"),
        (_plot, ["{tmp}/steps"], f"{{tmp}}/steps/metrics.jsonl holds no logged metric, only steps. {NOTHING}"),
        (_plot, ["{tmp}/cmp/arm", "--out", "{tmp}/cmp.png"], "{tmp}/cmp/arm/seed1/metrics.jsonl is empty"),
        *[(_plot, ["{run}", "--out", f"{{tmp}}/{out}"], f"--out {{tmp}}/{out}: '{out[-4:]}' is not a figure format "
           "(.png, .pdf, .svg, .jpg, .jpeg): name a file with one of these extensions, or a folder (a path without an "
           "extension) for every figure.") for out in ("curves.xyz", "figs/curves.txt", "curves.png.bak")],
        (_train, ["--temperature", "-1"], "error: --temperature: temperature="),
        (_dry_run, ["--s2t_entropy_quantile", "1.5"], "error: --s2t_entropy_quantile: s2t_entropy_quantile="),
        (_dry_run, ["--temperature", "-1"], "error: --temperature: temperature="),
        (_train, ["--learning_rate", "-1e-4"], "error: --learning_rate: learning_rate=-0.0001 must be >= 0"),
        (_train, ["--temperature", "-5E-1"], "error: --temperature: temperature=-0.5 must be > 0"),
        (_train, ["--s2t_entropy_quantile", "-2.5e+0"], "error: --s2t_entropy_quantile: s2t_entropy_quantile=-2.5 "),
        (_train, ["--config", "{tmp}"], "is a folder: give the path of a recipe YAML file in it"),
        (_dry_run, ["--config", "{tmp}"], "is a folder"),
        (_train, ["compare", GRPO_RECIPE, STAPO_RECIPE], "`stapo-train compare` is gone: train each"),
        (_train, ["--seed", str(2**32)], f"--seed: seed=4294967296 {SEED}"),
        (_train, ["--seed", "-1"], f"--seed: seed=-1 {SEED}"),
        (_train, ["--data_seed", str(2**32)], "--data_seed: data_seed=4294967296 must be in [0, 2**32 - 1]"),
        (_train, ["--output_dir", ""], "output_dir='' is empty: give the folder the run writes its"),
        (_train, ["--output_dir", __file__], f"output_dir={__file__!r} is a file: give a folder"),
        (_train, ["--reward_funcs", ""], f"reward_funcs=[''] {NO_REWARD} `pkg.module.function`"),
        (_train, ["--reward_funcs", "math_acuracy"], "Unknown reward 'math_acuracy'. Valid names: ['format', "
                                                     "'math_accuracy'], or a dotted path `pkg.module.function`."),
        (_train, ["--model_name_or_path", "./no/such/model"], "'./no/such/model' does not exist"),
        (_train, ["--model_name_or_path", "./no/model", "--dataset_name", "./no/data.jsonl"], "'./no/model' does not"),
        (_train, ["--model_name_or_path", "outputs/no-such"], "Model 'outputs/no-such' is not a local directory, and "
                 "not in the local Hugging Face cache while offline, HF_HUB_OFFLINE=1 (no download)."),
        (_train, ["--model_name_or_path", "builtin:huge-math"], "Unknown built-in model 'builtin:huge-math'. Known "
                                                                "built-in models: builtin:tiny-math, "),
        (_train, ["--dataset_name", "builtin:huge-math"], "No built-in dataset 'builtin:huge-math' with a split "
                                                          "'train'; built-in ones: builtin:tiny-math (splits"),
        (_train, ["--max_steps", "0"], "--max_steps: max_steps=0 is not a number of optimizer steps: give a positive"),
        (_train, ["--torch_num_threads", "0"], "torch_num_threads=0 must be >= 1"),
        (_train, ["--eval_num_problems", "0"], "eval_num_problems=0 must be >= 1"),  # eval.json held NaN
        (_train, ["--s2t_mod", "off"], "--s2t_mod: did you mean s2t_mode"),  # no argparse prefix matching
        (_train, ["--benchmark_eval", "aime99"], "Unknown benchmark 'aime99'. Valid benchmarks: aime24, aime25, "),
        (_dry_run, ["--max_train_samples", "3"], "error: 1 check(s) failed (the plan above lists them): "),
        (_dry_run, ["--dataset_name", "{tmp}/empty.jsonl"], "check(s) failed (the plan above lists them): "
                   "dataset_name='{tmp}/empty.jsonl': dataset file '{tmp}/empty.jsonl' is empty: it holds no rows."),
        (_dry_run, ["--model_name_or_path", "{tmp}/no-model"], "Model directory '{tmp}/no-model' does not exist"),
        (_dry_run, ["--reward_funcs", "math_acuracy"], "check(s) failed (the plan above lists them): Unknown reward "
                                                       "'math_acuracy'. Valid names: "),
        (_train, ["recipe", "s2t_entropy_quantile: abc"], KEY + "invalid float value: 'abc' (s2t_entropy_quantile "
                                                                "takes a number)." + FIX),
        (_train, ["recipe", "s2t_entropy_quantile: 1.5"], KEY + "s2t_entropy_quantile=1.5 must be in [0, 1]; the "
                                                                "paper: 0.75." + FIX),
        (_train, ["recipe", "lr_scheduler_type: cosinus"], KEY + "lr_scheduler_type='cosinus' is not one of 'linear'"),
        (_train, ["recipe", "num_generations: 8.5"], KEY + "num_generations=8.5 is not an integer." + FIX),
        (_train, ["recipe", "s2t_mode: off"], KEY + "s2t_mode=False is not one of 'low_entropy', "),
        (_train, ["recipe", "s2t_mode: off"], "YAML reads an unquoted off/on/no/yes as false/true: quote it"),
        (_train, ["recipe", "report_to: tensorbord"], KEY + "report_to='tensorbord': tensorbord is not supported, "),
        (_train, ["recipe", "learning_rate: -1"], KEY + "learning_rate=-1 must be >= 0"),
        (_train, ["recipe", "max_steps: {steps: 10}"], KEY + "max_steps={{'steps': 10}} is not an integer." + FIX),
        (_train, ["recipe", "trainer: stapoo"], KEY + "trainer='stapoo' is not one of 'stapo', 'grpo'." + FIX),
        (_train, ["recipe", "reward_funcs: []"], f"reward_funcs=[] {NO_REWARD}"),
        (_train, ["recipe", "reward_funcs: null"], f"reward_funcs=None {NO_REWARD}"),
])  # fmt: skip
def test_every_input_error_exits_2_with_one_line_in_one_write(
    no_model_built, tmp_path, monkeypatch, command, argv, expected
):
    monkeypatch.chdir(tmp_path)
    for name, text in METRICS.items():
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "metrics.jsonl").write_text(text)
    (tmp_path / "empty.jsonl").write_text("")
    fill = {"tmp": tmp_path, "run": write_metrics_run(tmp_path / "run")}
    if argv[0] == "recipe":
        fill |= {"recipe": write_recipe(tmp_path, argv[1]), "key": argv[1].split(":")[0]}
        argv = ["--config", "{recipe}", "--output_dir", "out"]
    argv = [a.format(**fill) for a in argv]
    if command in (_train, _dry_run) and "--config" not in argv and argv[0] != "compare":
        argv = ["--config", STAPO_RECIPE, "--output_dir", "out", *argv]
    before = sorted(tmp_path.rglob("*"))
    monkeypatch.setattr(sys, "stderr", SimpleNamespace(write=(writes := []).append, flush=lambda: None))  # as written
    with pytest.raises(SystemExit) as excinfo:
        command(argv)
    assert excinfo.value.code == 2
    (line,) = [w for w in writes if "error:" in w]
    assert line == writes[-1] and line.startswith(f"{PROGS[command]}: error: ") and line.count("\n") == 1
    assert expected.format(**fill) in line, line
    assert sorted(tmp_path.rglob("*")) == before  # nothing written: no figure, no folder, no lock


def test_help_of_every_command_states_the_exit_status(capsys):
    for command in (_train, _eval, _plot, dry_run_main):
        with pytest.raises(SystemExit, match="^0$"):
            sys.exit(command(["--help"]))
        assert "Exit status: 0 on success; 2 on an input error" in " ".join(capsys.readouterr().out.split())


def test_a_command_line_value_overrides_a_bad_recipe_value(tmp_path):
    bad = write_recipe(tmp_path, "s2t_entropy_quantile: abc\nnum_generations: 8.5")
    _, training_args, _ = parse_args(
        ["--config", bad, "--s2t_entropy_quantile", "0.5", "--num_generations", "8", "--output_dir", str(tmp_path)]
    )
    assert training_args.s2t_entropy_quantile == 0.5 and training_args.num_generations == 8


def test_gradient_checkpointing_future_warning_is_silenced_precisely(tiny_math_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_math_model_path)
    deprecated = "`is_gradient_checkpointing` is deprecated and will be removed in v6. Use X."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.is_gradient_checkpointing  # noqa: B018 (the property warns)
        with quiet_upstream():
            model.is_gradient_checkpointing  # noqa: B018
            model.gradient_checkpointing_enable()  # TRL's generation unwrap calls the old names too
            model.gradient_checkpointing_disable()
            warnings.warn("another FutureWarning", FutureWarning, stacklevel=1)  # other messages still show
            warnings.warn_explicit(deprecated, FutureWarning, "mylib.py", 1, module="mylib")  # other modules too
            warnings.warn_explicit(deprecated, UserWarning, "utils.py", 1, module="transformers.modeling_utils")
        model.is_gradient_checkpointing  # noqa: B018 (the filter ends with the block)
    old, other = ("FutureWarning", deprecated[:41]), ("FutureWarning", "another FutureWarning")
    shown = [(w.category.__name__, str(w.message)[:41]) for w in caught]
    assert shown == [old, other, old, ("UserWarning", old[1]), old]


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.33.0"])
def test_trl_vllm_range_warning_is_silenced_by_its_text_and_module_inside_the_block(version):
    text = (f"TRL currently supports vLLM versions from 0.22.0 to 0.31.0. You have version {version} installed. We "
            "recommend installing a supported version to avoid compatibility issues.")  # fmt: skip

    def shown(module: str, inside: bool) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with quiet_upstream() if inside else warnings.catch_warnings():
                warnings.warn_explicit(text, UserWarning, "import_utils.py", 1, module=module)
        return [str(w.message) for w in caught]

    assert shown("trl.import_utils", inside=False) == [text] == shown("my_project", inside=True)  # outside TRL: shown
    assert shown("trl.import_utils", inside=True) == ([] if version != "0.33.0" else [text])


def test_ctrl_c_is_one_write_and_a_full_disk_one_line_naming_the_folder_and_the_resume(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stderr", SimpleNamespace(write=(writes := []).append, flush=lambda: None))
    SaveOnSignal()._handle(signal.SIGINT, None)
    (line,) = [w for w in writes if "Ctrl-C: saving a checkpoint at the end of this step" in w]
    assert line.endswith("\n") and line.count("\n") == 1, writes
    for error in (OSError(errno.ENOSPC, "No space left on device"),
                  SafetensorError("I/O error: No space left on device (os error 28)")):  # fmt: skip
        with pytest.raises(InputError) as raised, full_disk_in_one_line("stapo-train", str(tmp_path)):
            raise error
        assert raised.value.code == 1 and str(raised.value) == (
            f"stapo-train: error: no space left on the disk of output_dir={str(tmp_path)!r} ({type(error).__name__}: "
            f"{error}). Free some space, then rerun the same command: it resumes from the start (no complete "
            "checkpoint)."
        )
    with pytest.raises(OSError, match="Permission denied"), full_disk_in_one_line("stapo-train", str(tmp_path)):
        raise OSError(errno.EACCES, "Permission denied")  # another failure keeps its traceback


@pytest.mark.slow  # trains, fails, trains again; the line alone: the test above
@pytest.mark.parametrize("owner, method, full", [
        (MetricsLogCallback, "write_rows", OSError(errno.ENOSPC, "No space left on device")),
        (Trainer, "save_model", SafetensorError("Error while serializing: I/O error: No space left on device (os "
                                                "error 28)")),
])  # fmt: skip
def test_a_full_disk_ends_the_run_with_one_line_and_the_rerun_resumes(
    tmp_path, tiny_math_model_path, monkeypatch, capsys, caplog, owner, method, full
):
    out, original, calls = tmp_path / "run", getattr(owner, method), []
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out),
            "--max_steps", "3", "--save_steps", "1", "--logging_steps", "1", "--eval_before_after", "false",
            "--disable_tqdm", "true", "--save_total_limit", "5"]  # fmt: skip

    def full_at_the_second(self, *args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise full
        return original(self, *args, **kwargs)

    monkeypatch.setattr(owner, method, full_at_the_second)
    with pytest.raises(SystemExit) as excinfo:
        _train(argv)
    assert excinfo.value.code == 1
    line = error_line(capsys, "stapo-train")
    assert line.startswith(f"stapo-train: error: no space left on the disk of output_dir={str(out)!r} ("), line
    assert line.endswith(f"rerun the same command: it resumes from {out / 'checkpoint-1'}."), line
    monkeypatch.undo()
    _train(argv)
    assert f"Resuming training from {out / 'checkpoint-1'}." in caplog.text
