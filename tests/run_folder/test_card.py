"""The model card (`stapo_trl.run_folder.card`, through `huggingface_hub.ModelCard`): the paper and the S2T values, the
"Training procedure" of real short runs, the card `push_to_hub` uploads (no local path, no `builtin:` name, never
"Model Card for None" nor a checkpoint folder as the Hub id), a quick start that asks a training prompt, and the base
model's Hub origin and license.

The run tests run `stapo-train` in-process on the demo recipe at a reduced size and check the card against the run's
own files: the recipe values as parsed, the pooled silenced ratio recomputed here from `metrics.jsonl`, `eval.json`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from testing_utils import (
    GRPO_RECIPE,
    STAPO_RECIPE,
    addition_rows,
    no_activation_checkpointing,
    run_card_quick_start,
    write_jsonl,
)


# The card must give these recipe values (it gave none of the run's settings).
KEY_FIELDS = (
    "learning_rate", "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
    "steps_per_generation", "temperature", "max_completion_length", "beta", "loss_type",
)  # fmt: skip
S2T_FIELDS = ("s2t_mode", "s2t_prob_threshold", "s2t_entropy_quantile")


def _argv(recipe: str, model_path: str, out: Path, *extra: str) -> list[str]:
    return [
        "--config", recipe, "--model_name_or_path", model_path, "--output_dir", str(out),
        "--max_steps", "8", "--logging_steps", "4", "--save_strategy", "no", "--disable_tqdm", "true",
        "--eval_num_problems", "16", "--eval_num_samples", "2", *extra,
    ]  # fmt: skip


# why: τ_p 0.05 instead of the paper's 0.002, so that the mask fires within 8 steps (a non-zero ratio to check).
STAPO_EXTRA = ("--s2t_prob_threshold", "0.05", "--hub_model_id", "me/stapo-demo")


@pytest.fixture(scope="module")
def stapo_run(tmp_path_factory, tiny_math_model_path):
    """A real 8-step STAPO run with before/after evaluation: (its output folder, its argv)."""
    from stapo_trl.cli.train import main

    out = tmp_path_factory.mktemp("card") / "demo-stapo"
    argv = _argv(STAPO_RECIPE, tiny_math_model_path, out, *STAPO_EXTRA)
    main(argv)
    return out, argv


def _assert_loads(path: Path, title: str) -> None:
    """The card loads with huggingface_hub, names its model, and never says "None" where a name belongs."""
    from huggingface_hub import ModelCard

    card = ModelCard.load(path)
    assert card.data.model_name == title and f"# Model Card for {title}" in card.text
    for broken in ("Model Card for None", "[None]", "huggingface.co/None", 'model="None"'):
        assert broken not in card.content, broken


def _procedure(card: str) -> str:
    """TRL's "## Training procedure" section of a card, up to its "### Framework versions"."""
    return card.split("## Training procedure", 1)[1].split("### Framework versions", 1)[0]


def _pooled_from_metrics(out: Path) -> tuple[int, int, int, float]:
    """(Σ silenced, Σ loss tokens, Σ candidates, Σ silenced / Σ loss tokens) over the rows of metrics.jsonl."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [row for row in rows if "s2t/num_loss_tokens" in row]
    silenced = int(sum(row["s2t/num_silenced"] for row in rows))
    loss_tokens = int(sum(row["s2t/num_loss_tokens"] for row in rows))
    candidates = int(sum(row["s2t/num_candidates"] for row in rows))
    return silenced, loss_tokens, candidates, silenced / loss_tokens


def _assert_settings_rows(procedure: str, args, fields) -> None:
    lines = procedure.splitlines()
    for name in fields:
        row = [line for line in lines if line.startswith(f"| `{name}` |")]
        assert len(row) == 1, (name, procedure)
        value = getattr(args, name)
        assert row[0].endswith(f"| `{getattr(value, 'value', value)}` |"), (name, row[0])


def _assert_procedure_matches_the_run(procedure: str, out: Path, argv: list[str]) -> None:
    from stapo_trl.cli.args import parse_args

    _, args, _ = parse_args(argv)
    _assert_settings_rows(procedure, args, KEY_FIELDS + S2T_FIELDS)
    step = json.loads((out / "trainer_state.json").read_text())["global_step"]
    assert step == args.max_steps
    assert f"**Steps trained**: {step} optimizer steps" in procedure
    silenced, loss_tokens, candidates, ratio = _pooled_from_metrics(out)
    assert silenced > 0, "the test run should silence something"
    assert f"{silenced:,} of {loss_tokens:,} loss tokens silenced over the run" in procedure
    assert f"a silenced ratio of {ratio:.3g} (pooled" in procedure
    assert f"candidates (A > 0, p < τ_p): {candidates:,}." in procedure
    evaluation = json.loads((out / "eval.json").read_text())
    before, after = (f"{100 * evaluation[key]:.1f} %" for key in ("accuracy_before", "accuracy_after"))
    assert f"{before} before training, {after} after" in procedure
    assert f"{evaluation['metric']} over {evaluation['num_problems']} problems" in procedure


def _trainer_after_the_run(run: Path, argv: list[str], model_path: str):
    """The trainer `push_to_hub` would hold after the run in `run`: the run's arguments (with `run` as its output_dir),
    its base model, and the run's trainer state. Returns (trainer, script arguments)."""
    from datasets import Dataset
    from transformers.trainer_callback import TrainerState

    from stapo_trl import STAPOTrainer
    from stapo_trl.cli.args import parse_args

    script_args, args, _ = parse_args([*argv, "--output_dir", str(run)])
    trainer = STAPOTrainer(
        model=model_path,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["1+1"] * 16}),
    )
    trainer.state = TrainerState.load_from_json(str(run / "trainer_state.json"))
    return trainer, script_args


def test_end_of_run_card_fills_the_training_procedure(stapo_run):
    out, argv = stapo_run
    card = (out / "README.md").read_text()
    procedure = _procedure(card)
    assert procedure.lstrip("\n").startswith("This model was trained with STAPO")  # no blank badge lines left
    _assert_procedure_matches_the_run(procedure, out, argv)
    _assert_loads(out / "README.md", "demo-stapo")


def test_uploaded_card_fills_the_training_procedure_without_local_names(stapo_run, tmp_path, tiny_math_model_path):

    out, argv = stapo_run
    run = tmp_path / "uploaded" / "demo-stapo"
    shutil.copytree(out, run)  # the fixture's card stays as the end of the run wrote it
    trainer, _ = _trainer_after_the_run(run, argv, tiny_math_model_path)
    evaluation = json.loads((run / "eval.json").read_text())
    trainer.eval_record = evaluation  # as stapo-train sets it after its evaluation
    # What push_to_hub's create_model_card writes before the upload.
    trainer.create_model_card(
        model_name="stapo-demo", dataset_name="builtin:tiny-math", tags=["stapo_trl"], public=True
    )
    card = (run / "README.md").read_text()
    _assert_procedure_matches_the_run(_procedure(card), run, argv)
    for leak in (str(tmp_path), str(out), tiny_math_model_path, "builtin:", "/tmp"):
        assert leak not in card, (leak, card)
    assert "the tiny-math demo model built by stapo_trl" in card
    _assert_loads(run / "README.md", "stapo-demo")


def test_baseline_card_says_the_s2t_mask_was_off(tmp_path, tiny_math_model_path):
    from stapo_trl.cli.args import parse_args
    from stapo_trl.cli.train import main

    out = tmp_path / "demo-grpo"
    argv = _argv(GRPO_RECIPE, tiny_math_model_path, out, "--max_steps", "4", "--eval_before_after", "false")
    main(argv)
    _, args, _ = parse_args(argv)
    assert args.s2t_mode == "off"
    procedure = _procedure((out / "README.md").read_text())
    _assert_settings_rows(procedure, args, KEY_FIELDS + S2T_FIELDS)
    silenced, loss_tokens, candidates, _ = _pooled_from_metrics(out)
    assert silenced == 0
    assert (
        f"**S2T mask**: off (`s2t_mode: off`): no token was silenced; {candidates:,} of {loss_tokens:,} loss tokens "
        "were candidates" in procedure
    )
    assert "trained with `stapo_trl.STAPOTrainer` with the S2T mask off" in procedure
    assert "**Held-out accuracy**: not measured" in procedure and "**Steps trained**: 4 optimizer steps" in procedure


def test_failed_push_at_the_end_keeps_the_local_results_and_says_how_to_push_later(
    stapo_run, tmp_path, tiny_math_model_path, capsys
):
    """A push that fails after training (here: the Hub is unreachable, HF_HUB_OFFLINE) is one message with the
    `hf upload` command; the model, the card and eval.json stay as the run wrote them."""

    from stapo_trl.cli.run import _push_to_hub

    out, argv = stapo_run
    run = tmp_path / "demo-stapo"
    shutil.copytree(out, run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    trainer, script_args = _trainer_after_the_run(run, argv, tiny_math_model_path)
    args = trainer.args
    args.push_to_hub, args.hub_model_id = True, "me/stapo-demo"  # as if the Hub had been reachable at the start
    _push_to_hub(trainer, script_args, args, json.loads((run / "eval.json").read_text()))
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("Push to hub_model_id='me/stapo-demo' failed (")
    assert printed[-1].endswith(f"push them later with `hf upload me/stapo-demo {run}`.")
    for name in ("model.safetensors", "eval.json", "metrics.jsonl"):
        assert (run / name).read_bytes() == before[name], name
    assert "## Training procedure" in (run / "README.md").read_text()


@pytest.mark.parametrize("where", ["local-folder", "absolute-folder", "builtin"])
def test_python_api_card_names_no_local_path_and_asks_a_training_prompt(
    tiny_random_model_path, tmp_path, monkeypatch, where
):
    # The card written from the Python API named the base model by its local path and kept TRL's generic quick start
    # ("If you had a time machine...").
    from datasets import Dataset

    from stapo_trl import STAPOConfig, STAPOTrainer

    model = tiny_random_model_path
    if where != "builtin":  # a model folder of the user's own (not a built-in: no stapo_builtin.json)
        shutil.copytree(tiny_random_model_path, tmp_path / "my-sft-model", ignore=shutil.ignore_patterns("stapo_*"))
        model = str(tmp_path / "my-sft-model")
        if where == "local-folder":
            monkeypatch.chdir(tmp_path)
            model = "my-sft-model"
    args = STAPOConfig(output_dir=str(tmp_path / "run"), report_to="none", per_device_train_batch_size=8,
                       num_generations=8, max_completion_length=8, max_steps=1)  # fmt: skip
    prompt = [{"role": "user", "content": "47+38\nPlease reason step by step."}]
    trainer = STAPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                           train_dataset=Dataset.from_dict({"prompt": [prompt] * 8}))  # fmt: skip
    trainer.create_model_card()
    card = (tmp_path / "run" / "README.md").read_text()
    for leak in (str(tmp_path / "my-sft-model"), "my-sft-model", tiny_random_model_path, "[None]"):
        assert leak not in card, leak
    expected = "Base model: `builtin:tiny-random`" if where == "builtin" else "Base model: a local model"
    assert expected in card
    assert json.dumps(prompt) in card.split("## Quick start", 1)[1]  # the run's own prompt, not TRL's question
    assert "time machine" not in card


@pytest.mark.parametrize(
    "name, public, license_text",
    [
        ("builtin:gemma3-270m", "google/gemma-3-270m (dequantized from a GGUF file by stapo_trl: gemma3-270m)",
         "Gemma Terms of Use"),
        ("builtin:smollm2-135m-math", "HuggingFaceTB/SmolLM2-135M-Instruct (dequantized from a GGUF file, then "
         "SFT-warmed on two-digit addition by stapo_trl: smollm2-135m-math)", "Apache-2.0"),
        ("builtin:tiny-math", "the tiny-math demo model built by stapo_trl", None),
    ],
)  # fmt: skip
def test_cards_name_a_real_builtin_by_its_hub_origin_and_carry_its_license(tmp_path, name, public, license_text):
    # A model trained from google/gemma-3-270m must carry Gemma's terms wherever its card goes; and an uploaded card
    # names the Hub model the built-in was made from (no builtin: name, which means nothing on the Hub).
    from stapo_trl.models.names import BUILTIN_MODELS
    from stapo_trl.run_folder.card import public_base_model_name

    assert public_base_model_name(name) == public
    license_ = BUILTIN_MODELS[name.removeprefix("builtin:")].get("license")
    assert (license_text in license_) if license_text else license_ is None


def _card_trainer(model_path: str, output_dir: Path, trainer_name: str = "stapo", **config):
    """A trainer whose card is written: `STAPOTrainer`, or the plain-TRL baseline (`trainer_name="grpo"`)."""
    from datasets import Dataset
    from trl import GRPOConfig

    from stapo_trl import STAPOConfig, STAPOTrainer
    from stapo_trl.trainer.trainers import GRPOBaselineTrainer

    config_class, trainer_class = {
        "stapo": (STAPOConfig, STAPOTrainer),
        "stapo-with-grpo-config": (GRPOConfig, STAPOTrainer),
        "grpo": (GRPOConfig, GRPOBaselineTrainer),
    }[trainer_name]
    args = config_class(
        output_dir=str(output_dir), use_cpu=True, bf16=False, report_to="none", **no_activation_checkpointing(),
        per_device_train_batch_size=8, num_generations=8, max_completion_length=8, **config,
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
    out = tmp_path / "outputs" / "demo-run"
    data = write_jsonl(tmp_path / "train.jsonl", addition_rows(8))
    dataset_name = data if dataset_name == "local" else dataset_name
    trainer = _card_trainer(tiny_random_model_path, out, trainer_name, hub_model_id="me/stapo-demo")
    # What push_to_hub does right before its upload: create_model_card(model_name=..., **push_to_hub's kwargs).
    trainer.create_model_card(
        model_name="stapo-demo", dataset_name=dataset_name, tags=["stapo_trl", trainer_name], public=True
    )
    card = (out / "README.md").read_text()
    for leak in (str(tmp_path), data, "builtin:", "[None]", "huggingface.co/None", tiny_random_model_path):
        assert leak not in card, (leak, card)
    assert "the tiny-random demo model built by stapo_trl" in card
    assert 'model="me/stapo-demo"' in card
    front_matter = card.split("---")[1]
    assert ("datasets:" in front_matter) == (hub_dataset is not None)
    if hub_dataset is not None:
        assert hub_dataset in front_matter


def test_model_card_names_stapo_cites_the_paper_and_lists_the_s2t_values(tiny_random_model_path, tmp_path):
    trainer = _card_trainer(tiny_random_model_path, tmp_path, s2t_prob_threshold=0.003, s2t_entropy_quantile=0.8)
    trainer.create_model_card(dataset_name=None, tags=["stapo_trl"])
    trainer.create_model_card(dataset_name=None, tags=["stapo_trl"])  # written anew: one section, not two
    card = (tmp_path / "README.md").read_text()
    # TRL's part, from _name / _paper / _tag_names.
    assert "trained with STAPO" in card and "huggingface.co/papers/2602.15620" in card
    assert "@article{liu2026stapo" in card and "- stapo" in card
    # Ours: the S2T values, the objective and the base model (a builtin: model is named, not a broken Hub link).
    assert card.count("### STAPO run") == 1
    for row in ("| `s2t_prob_threshold` |", "`0.003`", "| `s2t_entropy_quantile` |", "`0.8`", "`low_entropy`",
                "| `loss_type` |", "`dapo`", "| `epsilon_high` |", "`0.28`"):  # fmt: skip
        assert row in card, row
    assert "Base model: `builtin:tiny-random`" in card
    assert "[None](https://huggingface.co/None)" not in card
    # No hub_model_id (push_to_hub off): the quick start loads the saved model from output_dir, not "None".
    assert 'model="None"' not in card and f'model="{tmp_path}"' in card and "licence: license" not in card
    assert card.index("### STAPO run") < card.index("### Framework versions")
    _assert_loads(tmp_path / "README.md", tmp_path.name)


@pytest.mark.parametrize(
    "trainer_name, config, s2t_rows",
    [
        # A plain GRPOConfig: the paper's S2T values, which the trainer ran with (the card said "no S2T mask").
        ("stapo-with-grpo-config", {}, ("`0.002`", "`0.75`", "`low_entropy`")),
        ("stapo-with-grpo-config", {"epsilon_high": 0.28}, ("`0.002`", "`0.75`", "`low_entropy`")),
        ("stapo", {"s2t_mode": "off"}, ("`0.002`", "`0.75`", "`off`")),
    ],
)
def test_card_states_the_s2t_values_the_trainer_ran_with_whatever_the_config_class(
    tiny_random_model_path, tmp_path, trainer_name, config, s2t_rows
):
    trainer = _card_trainer(tiny_random_model_path, tmp_path, trainer_name, **config)
    trainer.create_model_card(dataset_name=None, tags=["stapo_trl"])
    section = (tmp_path / "README.md").read_text().split("### STAPO run")[1]
    assert "no S2T mask" not in section and "plain GRPO" not in section
    for row in ("| `s2t_prob_threshold` |", "| `s2t_entropy_quantile` |", "| `s2t_mode` |", *s2t_rows):
        assert row in section, row


def test_python_api_card_loads_the_checkpoint_the_run_saved(tiny_math_model_path, tmp_path):
    """The reported case: a Python-API run's card said `pipeline(..., model="<output_dir>")`, a folder with only
    `checkpoint-N/` in it (the Python API never calls `save_model`). With `save_total_limit=1` only the newest checkpoint
    is left: the card names it. After `save_model`, the card loads `output_dir`."""
    out = tmp_path / "python-api"
    trainer = _card_trainer(tiny_math_model_path, out, max_steps=2, save_steps=1, save_total_limit=1)
    trainer.train()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-2"]
    card = out / "README.md"
    assert f'model="{out / "checkpoint-2"}"' in card.read_text()
    run_card_quick_start(card, expect="pipeline(")  # loads what the card names, and answers
    trainer.save_model()
    trainer.create_model_card()
    assert f'model="{out}"' in card.read_text()
    run_card_quick_start(card, expect="pipeline(")
    trainer.create_model_card(public=True)  # what push_to_hub uploads: no hub_model_id, so the model's name
    text = card.read_text()
    assert "# Model Card for python-api" in text and 'model="python-api"' in text and str(out) not in text


@pytest.mark.parametrize("name,expected", [("Qwen/Qwen3-1.7B-Base", "Qwen/Qwen3-1.7B-Base")])
def test_base_model_name_of_hub_ids_is_unchanged(name, expected):
    from stapo_trl.run_folder.card import base_model_name

    assert base_model_name(name) == expected


def test_full_model_card_quick_start_asks_a_training_prompt(tiny_math_model_path, tmp_path):
    # The built-in model's card used to ask it a chat question it was never trained on.
    from stapo_trl.data import INSTRUCTION
    from stapo_trl.run_folder.card import quick_start_code

    prompt = [{"role": "user", "content": f"47+38\n{INSTRUCTION}"}]
    card = tmp_path / "README.md"
    card.write_text(
        "## Quick start\n\n```python\n"
        + quick_start_code(tiny_math_model_path, prompt, adapter=False, max_new_tokens=48)
        + "\n```\n"
    )
    run_card_quick_start(card, expect="pipeline(")
    assert INSTRUCTION.splitlines()[0][:20] in card.read_text()


@pytest.mark.parametrize(
    "name, public",
    [("data/train.csv", None), ("train.CSV", None), ("train.jsonl", None), ("org/math-17k", "org/math-17k")],
)
def test_uploaded_card_names_a_local_data_file_missing_here_as_no_hub_dataset(name, public):
    """A local file the run trained on, written on another machine than the data (so not found here), is no Hub id:
    CSV files load as JSON and Parquet ones do, so a `.csv` name is a local file too."""
    from stapo_trl.run_folder.card import public_dataset_name

    assert public_dataset_name(name) == public


@pytest.mark.parametrize("output_dir", ["relative-run", "./nested/relative-run", "../up/relative-run"])
def test_a_local_cards_quick_start_loads_from_any_working_directory(
    tiny_math_model_path, tmp_path, monkeypatch, output_dir
):
    # Reported: a run with a relative output_dir wrote `model="outputs/python-api/checkpoint-30"`, which loads only from
    # the folder the run started in. The local card names the model by its absolute path.
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    trainer = _card_trainer(tiny_math_model_path, output_dir, max_steps=1, save_steps=1)
    trainer.train()
    out = (workdir / output_dir).resolve()
    assert f'model="{out / "checkpoint-1"}"' in (out / "README.md").read_text()
