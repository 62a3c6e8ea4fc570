"""A run's datasets checked when the trainer is built: chat template, empty datasets, prompt groups, reward columns."""

import functools
import json
import re
import shutil
import warnings

import pytest
from datasets import Dataset
from testing_utils import STAPO_RECIPE, error_line, tiny_stapo_config, zero_reward

from stapo_trl import STAPOTrainer
from stapo_trl.rewards import format_reward, math_accuracy_reward


CHAT = [{"prompt": [{"role": "user", "content": f"{i}+{i}"}], "solution": str(2 * i)} for i in range(8)]
TEXT = [{"prompt": f"{i}+{i}=", "solution": str(2 * i)} for i in range(8)]


@pytest.fixture(scope="module")
def model_without_chat_template(tiny_random_model_path, tmp_path_factory) -> str:  # as google/gemma-3-270m ships
    folder = tmp_path_factory.mktemp("no-template") / "model"
    shutil.copytree(tiny_random_model_path, folder)
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return str(folder)


def build(model, tmp_path, train, eval_rows=None, record=None, **overrides):
    args = tiny_stapo_config(tmp_path / "out", max_steps=1, **overrides)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always" if record is not None else "ignore")
        train = train if isinstance(train, Dataset) else Dataset.from_list(train)
        eval_dataset = None if eval_rows is None else Dataset.from_list(eval_rows)
        trainer = STAPOTrainer(model, zero_reward, args=args, train_dataset=train, eval_dataset=eval_dataset)
    if record is not None:
        record += [str(w.message) for w in caught]
    return trainer


@pytest.mark.parametrize(
    "train, eval_rows, name",
    [(CHAT, None, "train_dataset"), (TEXT, CHAT, "eval_dataset")],
    ids=["chat-train", "chat-eval-only"],
)
def test_python_api_refuses_chat_prompts_without_a_template_when_the_trainer_is_built(
    model_without_chat_template, tmp_path, train, eval_rows, name
):
    with pytest.raises(ValueError) as info:  # was: TRL's error at the first step, after the run files
        build(model_without_chat_template, tmp_path, train, eval_rows, eval_strategy="no")
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"The prompts of {name!r} are chat messages, but the tokenizer ")
    assert "has no chat template" in message and "processing_class=tokenizer" in message
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # no run file left behind


def test_plain_text_prompts_train_without_a_template(model_without_chat_template, tmp_path):
    trainer = build(model_without_chat_template, tmp_path, TEXT)
    trainer.train()
    assert trainer.state.global_step == 1


def test_stapo_eval_refuses_a_model_without_a_template_unless_told_to_feed_text(
    model_without_chat_template, tmp_path, capsys
):
    from transformers import AutoTokenizer

    from stapo_trl.cli.eval import main
    from stapo_trl.evaluation.generation import build_prompt_text

    tokenizer = AutoTokenizer.from_pretrained(model_without_chat_template)
    with pytest.raises(ValueError, match="^The evaluation prompts are chat messages, but the tokenizer of "):
        build_prompt_text(tokenizer, "1+1")
    assert build_prompt_text(tokenizer, "1+1", use_chat_template=False).startswith("1+1\n")
    argv = ["--model", model_without_chat_template, "--benchmarks", "tiny-math", "--backend", "hf", "--limit", "2",
            "--samples", "1", "--max-new-tokens", "8"]  # fmt: skip
    with pytest.raises(SystemExit) as info:
        main([*argv, "--output", str(tmp_path / "a.json")])
    assert info.value.code == 2 and "stapo-eval's prompts are chat messages" in (
        line := error_line(capsys, "stapo-eval")
    )
    assert "no chat template" in line and "--no-chat-template" in line
    assert main([*argv, "--no-chat-template", "--output", str(tmp_path / "b.json")]) == 0  # was: silently this


TEMPLATES = {  # what jinja refuses: nothing of the template is applied, no code outside it runs
    "sandbox": ("chat_template.jinja", "{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError: access to "
                "attribute '__class__' of 'str' object is unsafe."),  # reported: a traceback in stapo-train and -eval
    "syntax": ("chat_template.jinja", "{% for m in messages %}{{ m.content }}", "TemplateSyntaxError: Unexpected end "
               "of template. Jinja was looking for the following tags: 'endfor' or 'else'. The innermost block that "
               "needs to be closed is 'for'."),
    "raise": ("tokenizer_config.json", "{{ raise_exception('Only system prompts are supported') }}", "TemplateError: "
              "Only system prompts are supported"),  # transformers' own way for a template to refuse messages
}  # fmt: skip


def model_with_template(tiny_random_model_path, tmp_path, kind) -> tuple[str, str]:  # (model, the refusal)
    file, text, reason = TEMPLATES[kind]
    model = tmp_path / "model"
    shutil.copytree(tiny_random_model_path, model)
    (model / "chat_template.jinja").unlink()
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / file).write_text(json.dumps(config | {"chat_template": text}) if file.endswith(".json") else text)
    return str(model), f"The chat template {model / file} cannot be applied ({reason}): fix or replace it."


@pytest.mark.parametrize("kind", list(TEMPLATES))
def test_a_chat_template_jinja_refuses_is_one_line_naming_its_file(kind, tiny_random_model_path, tmp_path):
    from transformers import AutoTokenizer

    from stapo_trl.data import check_chat_template

    model, line = model_with_template(tiny_random_model_path, tmp_path, kind)
    with pytest.raises(ValueError) as raised:
        check_chat_template(AutoTokenizer.from_pretrained(model), Dataset.from_list(CHAT), model)
    assert str(raised.value) == line
    if kind == "sandbox":  # the reported case, when the trainer is built
        with pytest.raises(ValueError) as raised:
            build(model, tmp_path, CHAT)
        assert str(raised.value) == line


@pytest.mark.slow  # stapo-train, its dry run and stapo-eval
@pytest.mark.parametrize("kind", ["none", "sandbox"])
def test_the_commands_refuse_a_template_missing_or_refused_in_one_line(
    no_model_built, model_without_chat_template, tiny_random_model_path, tmp_path, capsys, kind
):
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.eval import main as eval_main
    from stapo_trl.cli.train import main as train_main

    model, line = model_with_template(tiny_random_model_path, tmp_path, kind) if kind != "none" else (
        model_without_chat_template, "The prompts of 'builtin:tiny-math' are chat messages, but the tokenizer of "
    )  # fmt: skip
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", model, "--output_dir", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as raised:
        train_main(argv)
    assert raised.value.code == 2 and error_line(capsys, "stapo-train").startswith(f"stapo-train: error: {line}")
    assert kind != "none" or "builtin:gemma3-270m adds Gemma's" in str(raised.value)
    assert dry_run_main(argv) == 2 and any(s.startswith(f"  - {line}") for s in capsys.readouterr().out.splitlines())
    if kind == "sandbox":  # stapo-eval's missing template: test_stapo_eval_refuses_a_model_without_a_template_...
        with pytest.raises(SystemExit) as raised:
            eval_main(["--model", model, "--benchmarks", "tiny-math", "--limit", "2", "--max-new-tokens", "8",
                       "--backend", "hf", "--output", str(tmp_path / "a.json")])  # fmt: skip
        assert (raised.value.code, error_line(capsys, "stapo-eval")) == (2, f"stapo-eval: error: {line}")


@pytest.mark.parametrize(
    "train, eval_rows, name",
    [
        (Dataset.from_list([]), None, "train_dataset"),  # the reported case: got "Column 'prompt' not found"
        (Dataset.from_dict({"prompt": [], "solution": []}), None, "train_dataset"),  # columns but no rows
        (Dataset.from_list(CHAT), {"held_out": Dataset.from_list([])}, "eval_dataset['held_out']"),
    ],
    ids=["no-columns", "columns-no-rows", "empty-eval"],
)
def test_an_empty_dataset_is_called_empty(tiny_random_model_path, tmp_path, train, eval_rows, name):
    from stapo_trl.data import check_prompt_column

    for prompt_optional in (False, True):  # an environment's reset() supplies prompts, not rows
        with pytest.raises(ValueError, match="^" + re.escape(f"Dataset {name!r} is empty (0 rows): give it prompts")):
            dataset, what = (train, name) if eval_rows is None else (eval_rows, "eval_dataset")
            check_prompt_column(dataset, what, prompt_optional=prompt_optional)
    if name == "train_dataset" and not len(train.column_names):  # the trainer checks its datasets when built
        with pytest.raises(ValueError, match=r"^Dataset 'train_dataset' is empty \(0 rows\)"):
            build(tiny_random_model_path, tmp_path, train)


@pytest.mark.parametrize(
    "grad_accum, dry_run, warned",
    [(1, False, True), pytest.param(1, True, True, marks=pytest.mark.slow),  # a dry run each: ~2 s
     pytest.param(2, True, False, marks=pytest.mark.slow)],
    ids=["half-group", "half-group-as-the-dry-run", "whole-group-over-2-micro-steps-as-the-dry-run"],
)  # fmt: skip
def test_the_run_warns_of_partial_prompt_groups_as_its_dry_run_does(
    tiny_random_model_path, tmp_path, grad_accum, dry_run, warned
):
    from stapo_trl.cli.dry_run import dry_run_recipe

    # num_generations 8: the rollout batch holds whole groups (8 completions), an optimizer update may not (4 or 8)
    geometry = dict(per_device_train_batch_size=4, gradient_accumulation_steps=grad_accum, steps_per_generation=2,
                    num_generations=8)  # fmt: skip
    caught = []
    build(tiny_random_model_path, tmp_path, CHAT * 2, record=caught, **geometry)
    run = [message for message in caught if "splits prompt groups" in message]
    assert bool(run) == warned and all("an update of 4 completions splits prompt groups" in m for m in run), run
    if dry_run:
        report = dry_run_recipe(["--config", STAPO_RECIPE, *[f"--{k}={v}" for k, v in geometry.items()]], 1)
        assert run == [w for w in report.warnings if "splits prompt groups" in w]


def difficulty_reward(completions, difficulty, **kwargs):
    return [float(d) for d in difficulty]


def test_missing_columns_and_reward_names_fail_at_construction_naming_function_column_and_columns(
    no_model_built, tiny_random_model_path, tmp_path
):
    # A Hub id never fetched: the checks come before TRL loads anything (was: a KeyError at the first step).
    from stapo_trl.rewards import resolve_reward_names

    def construct(reward, train, eval_dataset=None, model="Qwen/Qwen3-1.7B-Base"):
        STAPOTrainer(model, reward, args=tiny_stapo_config(tmp_path / "out"), train_dataset=Dataset.from_list(train),
                     eval_dataset=eval_dataset and {"held_out": Dataset.from_list(eval_dataset)})  # fmt: skip

    no_prompt, no_solution = [{"question": "12+34=", "solution": "46"}], [{"prompt": "12+34=", "answer": "46"}]
    with_solution = [{"prompt": "12+34=", "solution": "46"}]
    with pytest.raises(ValueError, match=r"^Column 'prompt' not found in dataset 'train_dataset'\. Available columns"):
        construct(math_accuracy_reward, no_prompt)
    # A reward named is that function, checked (was taken for a Hub reward model: a minute of network retries).
    assert resolve_reward_names("math_accuracy").__wrapped__ is math_accuracy_reward
    resolved = resolve_reward_names(["format", "org/reward-model"])
    assert [resolved[0].__wrapped__, resolved[1]] == [format_reward, "org/reward-model"]
    with pytest.raises(ValueError, match=r"Unknown reward 'math_acc'\. Valid names: \['format', 'math_accuracy'\]"):
        construct("math_acc", no_prompt)
    for reward in ("math_accuracy", math_accuracy_reward):  # by name or by function
        with pytest.raises(ValueError, match=r"^Column 'solution' not found in dataset 'train_dataset'.*\['prompt', "
                           r"'answer'\].*'math_accuracy_reward' needs it"):  # fmt: skip
            construct(reward, no_solution)
    # Several rewards and several eval datasets: the first function with a missing argument, the dataset by key.
    with pytest.raises(ValueError, match=r"Column 'solution' not found in dataset \"eval_dataset\['held_out'\]\""):
        construct([format_reward, math_accuracy_reward], with_solution, no_solution)
    with pytest.raises(ValueError, match=r"Column 'difficulty' not found .* 'difficulty_reward' needs it"):
        construct([difficulty_reward], with_solution)
    # `prompt` is a column, but TRL passes it as `prompts`: an argument named `prompt` is never filled.
    with pytest.raises(ValueError, match=r"takes an argument 'prompt', which TRL never fills.*`prompts`"):
        construct(lambda prompt, completions: [], with_solution)
    # Filled arguments pass the check and construction goes on (to the guard): a column, a default, a bound
    # partial argument, TRL's own arguments and **kwargs.
    for reward in (
        math_accuracy_reward,
        functools.partial(difficulty_reward, difficulty=[1]),
        lambda completions, difficulty=0, **kwargs: [],
        lambda prompts, completions, completion_ids, trainer_state, log_metric, log_extra: [],
    ):
        with pytest.raises(AssertionError, match="a trainer was constructed"):  # a local model: no Hub check
            construct(reward, with_solution, model=tiny_random_model_path)
