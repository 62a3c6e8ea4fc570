"""`stapo_trl.run_folder.card`: TRL's card with the S2T section, the uploaded card, the quick start, the license."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from testing_utils import STAPO_RECIPE, addition_rows, no_activation_checkpointing, run_card_quick_start, write_jsonl


KEY_FIELDS = (
    "learning_rate", "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
    "steps_per_generation", "temperature", "max_completion_length", "beta", "loss_type",
)  # fmt: skip
S2T_FIELDS = ("s2t_mode", "s2t_prob_threshold", "s2t_entropy_quantile")
ROWS = [
    {"step": 4, "s2t/num_silenced": 3, "s2t/num_candidates": 40, "s2t/num_loss_tokens": 1000},
    {"step": 8, "s2t/num_silenced": 0, "s2t/num_candidates": 10, "s2t/num_loss_tokens": 1000},
]
EVAL = {"metric": "avg@2", "num_problems": 16, "split": "test", "temperature": 0.6, "top_p": 0.95,
        "accuracy_before": 0.25, "accuracy_after": 0.5}  # fmt: skip


def _card_trainer(model_path: str, output_dir: Path, trainer_name: str = "stapo", **config):
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


def _assert_loads(path: Path, title: str) -> None:
    from huggingface_hub import ModelCard

    card = ModelCard.load(path)
    assert card.data.model_name == title and f"# Model Card for {title}" in card.text
    for broken in ("Model Card for None", "[None]", "huggingface.co/None", 'model="None"', "licence: license"):
        assert broken not in card.content, broken


def _table(card: str) -> dict[str, str]:
    return dict(re.findall(r"^\| `(\w+)` \|.*\| `(.*)` \|$", card, re.M))


@pytest.mark.parametrize(
    "trainer_name, public, dataset",
    [("stapo", False, "org/math-17k"), ("stapo", True, "org/math-17k"), ("off", False, None), ("grpo", True, "local"),
     ("grpo", True, "builtin:tiny-math")],
)  # fmt: skip
def test_the_training_procedure_states_the_runs_settings_counts_and_accuracy(
    tiny_math_model_path, tmp_path, trainer_name, public, dataset
):
    config = {"s2t_mode": "off"} if trainer_name == "off" else {}
    out = tmp_path / "outputs" / "demo-run"
    name = "grpo" if trainer_name == "grpo" else "stapo"
    trainer = _card_trainer(
        tiny_math_model_path, out, name, hub_model_id="me/stapo-demo", save_strategy="no", **config
    )
    trainer.state.global_step, trainer.state.log_history = 8, ROWS
    trainer.eval_record = EVAL if trainer_name != "off" else None
    data = write_jsonl(tmp_path / "train.jsonl", addition_rows(8)) if dataset == "local" else dataset
    trainer.create_model_card(model_name="stapo-demo" if public else None, dataset_name=data, tags=["stapo_trl"],
                              public=public)  # fmt: skip
    card = (out / "README.md").read_text()
    assert ("datasets: org/math-17k" in card.split("---")[1]) == (dataset == "org/math-17k")
    procedure = card.split("## Training procedure", 1)[1].split("### Framework versions", 1)[0]
    assert procedure.lstrip("\n").startswith(f"This model was trained with {name.upper()}")  # no blank badge lines
    assert "**Steps trained**: 8 optimizer steps" in procedure
    fields = KEY_FIELDS + (S2T_FIELDS if trainer_name != "grpo" else ())
    values = [getattr(trainer.args, field) for field in fields]
    assert [_table(procedure)[field] for field in fields] == [str(getattr(v, "value", v)) for v in values]
    if trainer_name == "stapo":
        pooled = "3 of 2,000 loss tokens silenced over the run, a silenced ratio of 0.0015 (pooled: Σ silenced / Σ "
        accuracy = "**Held-out accuracy** (avg@2 over 16 problems of the `test` split, T = 0.6, top-p 0.95): 25.0 % "
        assert pooled + "loss tokens over 2 logged rows); candidates (A > 0, p < τ_p): 50." in procedure
        assert accuracy + "before training, 50.0 % after." in procedure
    elif trainer_name == "off":
        assert "**S2T mask**: off (`s2t_mode: off`): no token was silenced; 50 of 2,000 loss tokens were " in procedure
        assert "with the S2T mask off" in procedure and "**Held-out accuracy**: not measured" in procedure
    else:
        assert "**S2T mask**: none (plain GRPO" in procedure and "no S2T mask" in procedure
    if public:  # what push_to_hub uploads
        for leak in (str(tmp_path), tiny_math_model_path, "builtin:", "/tmp", "huggingface.co/None"):
            assert leak not in card, leak
        assert "the tiny-math demo model built by stapo_trl" in card and 'model="me/stapo-demo"' in card
    else:
        assert "Base model: `builtin:tiny-math`" in card and f'model="{out}"' in card
    _assert_loads(out / "README.md", "stapo-demo" if public else "demo-run")


@pytest.mark.parametrize("where", ["local-folder", "absolute-folder", "builtin"])
def test_python_api_card_names_no_local_path_and_asks_a_training_prompt(
    tiny_random_model_path, tmp_path, monkeypatch, where
):
    from datasets import Dataset

    from stapo_trl import STAPOConfig, STAPOTrainer

    model = tiny_random_model_path
    if where != "builtin":  # a model folder of the user's own (no stapo_builtin.json)
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
    assert ("Base model: `builtin:tiny-random`" if where == "builtin" else "Base model: a local model") in card
    assert json.dumps(prompt) in card.split("## Quick start", 1)[1] and "time machine" not in card


def test_cards_name_a_builtin_by_its_hub_origin_with_its_license_and_a_local_data_file_as_no_hub_dataset():
    from stapo_trl.models.names import BUILTIN_MODELS
    from stapo_trl.run_folder.card import base_model_name, public_base_model_name, public_dataset_name

    for name, public, license_text in [
        ("builtin:gemma3-270m", "google/gemma-3-270m (dequantized from a GGUF file by stapo_trl: gemma3-270m)",
         "Gemma Terms of Use"),
        ("builtin:smollm2-135m-math", "HuggingFaceTB/SmolLM2-135M-Instruct (dequantized from a GGUF file, then "
         "SFT-warmed on two-digit addition by stapo_trl: smollm2-135m-math)", "Apache-2.0"),
        ("builtin:tiny-math", "the tiny-math demo model built by stapo_trl", None),
        ("Qwen/Qwen3-1.7B-Base", "Qwen/Qwen3-1.7B-Base", None),
    ]:  # fmt: skip
        assert public_base_model_name(name) == public and base_model_name(name) == name
        license_ = BUILTIN_MODELS.get(name.removeprefix("builtin:"), {}).get("license")
        assert (license_text in license_) if license_text else license_ is None
    names = ["data/train.csv", "train.CSV", "train.jsonl", "org/math-17k"]
    assert [public_dataset_name(name) for name in names] == [None, None, None, "org/math-17k"]


@pytest.mark.parametrize(
    "trainer_name, config, values",
    [
        ("stapo", {"s2t_prob_threshold": 0.003, "s2t_entropy_quantile": 0.8}, ["0.003", "0.8", "low_entropy"]),
        ("stapo-with-grpo-config", {"epsilon_high": 0.28}, ["0.002", "0.75", "low_entropy"]),
    ],
)
def test_card_names_stapo_cites_the_paper_and_states_the_s2t_values_it_ran_with(
    tiny_random_model_path, tmp_path, trainer_name, config, values
):
    trainer = _card_trainer(tiny_random_model_path, tmp_path, trainer_name, **config)
    trainer.create_model_card(dataset_name=None, tags=["stapo_trl"])
    trainer.create_model_card(dataset_name=None, tags=["stapo_trl"])  # written anew: one section, not two
    card = (tmp_path / "README.md").read_text()
    assert "trained with STAPO" in card and "huggingface.co/papers/2602.15620" in card  # TRL's part
    assert "@article{liu2026stapo" in card and "- stapo" in card and card.count("### STAPO run") == 1
    names = (*S2T_FIELDS[1:], "s2t_mode", "loss_type", "epsilon_high")
    assert [_table(card)[name] for name in names] == [*values, "dapo", "0.28"]
    assert "Base model: `builtin:tiny-random`" in card and "no S2T mask" not in card
    assert card.index("### STAPO run") < card.index("### Framework versions")
    _assert_loads(tmp_path / "README.md", tmp_path.name)


def test_python_api_card_loads_the_checkpoint_the_run_saved(tiny_math_model_path, tmp_path):
    out = tmp_path / "python-api"
    trainer = _card_trainer(tiny_math_model_path, out, max_steps=1, save_steps=1)
    trainer.train()
    card = out / "README.md"
    assert f'model="{out / "checkpoint-1"}"' in card.read_text()
    run_card_quick_start(card, expect="pipeline(")  # loads what the card names, and answers
    trainer.save_model()
    trainer.create_model_card()
    assert f'model="{out}"' in card.read_text()
    trainer.create_model_card(public=True)  # what push_to_hub uploads: no hub_model_id, so the model's name
    text = card.read_text()
    assert "# Model Card for python-api" in text and 'model="python-api"' in text and str(out) not in text


@pytest.mark.parametrize("output_dir", ["relative-run", "./nested/relative-run", "../up/relative-run"])
def test_a_local_cards_quick_start_loads_from_any_working_directory(
    tiny_math_model_path, tmp_path, monkeypatch, output_dir
):
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    _card_trainer(tiny_math_model_path, output_dir).create_model_card()
    out = (tmp_path / "work" / output_dir).resolve()
    assert f'model="{out}"' in (out / "README.md").read_text()


def _argv(recipe: str, model_path: str, out: Path, *extra: str) -> list[str]:
    return [
        "--config", recipe, "--model_name_or_path", model_path, "--output_dir", str(out),
        "--max_steps", "8", "--logging_steps", "4", "--save_strategy", "no", "--disable_tqdm", "true",
        "--eval_num_problems", "16", "--eval_num_samples", "2", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def stapo_run(tmp_path_factory, tiny_math_model_path):
    from stapo_trl.cli.train import main

    out = tmp_path_factory.mktemp("card") / "demo-stapo"
    argv = _argv(STAPO_RECIPE, tiny_math_model_path, out, "--s2t_prob_threshold", "0.05", "--hub_model_id", "me/x")
    main(argv)
    return out, argv


@pytest.mark.slow  # uses the real run
def test_failed_push_at_the_end_keeps_the_local_results_and_says_how_to_push_later(
    stapo_run, tmp_path, tiny_math_model_path, capsys
):
    from datasets import Dataset

    from stapo_trl import STAPOTrainer
    from stapo_trl.cli.args import parse_args
    from stapo_trl.cli.run import _push_to_hub

    out, argv = stapo_run
    run = tmp_path / "demo-stapo"
    shutil.copytree(out, run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    script_args, args, _ = parse_args([*argv, "--output_dir", str(run)])
    trainer = STAPOTrainer(model=tiny_math_model_path, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                           args=args, train_dataset=Dataset.from_dict({"prompt": ["1+1"] * 16}))  # fmt: skip
    args.push_to_hub, args.hub_model_id = True, "me/stapo-demo"  # as if the Hub had been reachable at the start
    _push_to_hub(trainer, script_args, args, json.loads((run / "eval.json").read_text()))
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("Push to hub_model_id='me/stapo-demo' failed (")
    assert printed[-1].endswith(f"push them later with `hf upload me/stapo-demo {run}`.")
    for name in ("model.safetensors", "eval.json", "metrics.jsonl"):
        assert (run / name).read_bytes() == before[name], name
