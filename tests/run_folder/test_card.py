"""`stapo_trl.run_folder.card`: TRL's card with the S2T section, the uploaded card, the quick start, the license."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from datasets import Dataset
from huggingface_hub import ModelCard
from testing_utils import STAPO_RECIPE, addition_rows, no_activation_checkpointing, run_card_quick_start, write_jsonl
from trl import GRPOConfig

from stapo_trl import STAPOConfig, STAPOTrainer
from stapo_trl.cli.args import parse_args
from stapo_trl.cli.run import _push_to_hub
from stapo_trl.cli.train import main
from stapo_trl.models.names import BUILTIN_MODELS
from stapo_trl.run_folder.card import base_model_name, public_base_model_name, public_dataset_name
from stapo_trl.trainer.trainers import GRPOBaselineTrainer


KEY_FIELDS = tuple("learning_rate num_generations per_device_train_batch_size gradient_accumulation_steps "
                   "steps_per_generation temperature max_completion_length beta loss_type "
                   "epsilon_high".split())  # fmt: skip
S2T_FIELDS = ("s2t_mode", "s2t_prob_threshold", "s2t_entropy_quantile")
ROWS = [{"step": 4, "s2t/num_silenced": 3, "s2t/num_candidates": 40, "s2t/num_loss_tokens": 1000},
        {"step": 8, "s2t/num_silenced": 0, "s2t/num_candidates": 10, "s2t/num_loss_tokens": 1000}]  # fmt: skip
EVAL = {"metric": "avg@2", "num_problems": 16, "split": "test", "temperature": 0.6, "top_p": 0.95,
        "accuracy_before": 0.25, "accuracy_after": 0.5}  # fmt: skip


def _card_trainer(model_path: str, output_dir: Path | str, trainer_name: str = "stapo", **config):
    config_class = GRPOConfig if trainer_name in ("grpo", "stapo-with-grpo-config") else STAPOConfig
    trainer_class = GRPOBaselineTrainer if trainer_name == "grpo" else STAPOTrainer
    args = config_class(output_dir=str(output_dir), use_cpu=True, bf16=False, report_to="none", num_generations=8,
        **no_activation_checkpointing(), per_device_train_batch_size=8, max_completion_length=8, **config)  # fmt: skip
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1"}]] * 8})
    return trainer_class(model=model_path, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                         train_dataset=dataset)  # fmt: skip


_table = lambda card: dict(re.findall(r"^\| `(\w+)` \|.*\| `(.*)` \|$", card, re.M))  # noqa: E731


@pytest.mark.parametrize("trainer_name, public, dataset, config", [
    ("stapo", False, "org/math-17k", {"s2t_prob_threshold": 0.003, "s2t_entropy_quantile": 0.8}),
    ("stapo", True, "org/math-17k", {}), ("off", False, None, {"s2t_mode": "off"}),
    ("stapo-with-grpo-config", False, None, {"epsilon_high": 0.28}), ("grpo", True, "local", {}),
    ("grpo", True, "builtin:tiny-math", {}),
])  # fmt: skip
def test_the_card_states_the_run(tiny_math_model_path, tmp_path, trainer_name, public, dataset, config):
    out = tmp_path / "outputs" / "demo-run"
    trainer = _card_trainer(tiny_math_model_path, out, trainer_name, hub_model_id="me/stapo-demo", save_strategy="no",
                            **config)  # fmt: skip
    trainer.state.global_step, trainer.state.log_history = 8, ROWS
    trainer.eval_record = EVAL if trainer_name != "off" else None
    data = write_jsonl(tmp_path / "train.jsonl", addition_rows(8)) if dataset == "local" else dataset
    for _ in range(2):  # written anew: one section, not two
        trainer.create_model_card(model_name="stapo-demo" if public else None, dataset_name=data, tags=["stapo_trl"],
                                  public=public)  # fmt: skip
    card, name = (out / "README.md").read_text(), "GRPO" if trainer_name == "grpo" else "STAPO"
    assert ("datasets: org/math-17k" in card.split("---")[1]) == (dataset == "org/math-17k")
    procedure = card.split("## Training procedure", 1)[1].split("### Framework versions", 1)[0]
    assert procedure.lstrip("\n").startswith(f"This model was trained with {name}")  # no blank badge lines
    assert "**Steps trained**: 8 optimizer steps" in procedure and card.count("### STAPO run") == 1
    fields = KEY_FIELDS + (S2T_FIELDS if name == "STAPO" else ())
    values = [getattr(trainer.s2t, f[4:]) if f.startswith("s2t_") else getattr(trainer.args, f) for f in fields]
    assert (shown := [_table(procedure)[f] for f in fields]) == [str(getattr(v, "value", v)) for v in values]
    assert ("@article{liu2026stapo" in card) == (name == "STAPO")  # TRL's part
    if trainer_name == "stapo" and not public:
        assert shown[-3:] == ["low_entropy", "0.003", "0.8"]
        pooled = "3 of 2,000 loss tokens silenced over the run, a silenced ratio of 0.0015 (pooled: Σ silenced / Σ "
        accuracy = "**Held-out accuracy** (avg@2 over 16 problems of the `test` split, T = 0.6, top-p 0.95): 25.0 % "
        assert pooled + "loss tokens over 2 logged rows); candidates (A > 0, p < τ_p): 50." in procedure
        assert accuracy + "before training, 50.0 % after." in procedure
    elif trainer_name == "stapo-with-grpo-config":  # the paper's S2T values
        assert shown[-4:] == ["0.28", "low_entropy", "0.002", "0.75"] and "no S2T mask" not in card
    elif trainer_name == "off":
        assert "**S2T mask**: off (`s2t_mode: off`): no token was silenced; 50 of 2,000 loss tokens were " in procedure
        assert "with the S2T mask off" in procedure and "**Held-out accuracy**: not measured" in procedure
    elif trainer_name == "grpo":
        assert "**S2T mask**: none (plain GRPO" in procedure and "no S2T mask" in procedure
    if public:  # what push_to_hub uploads
        for leak in (str(tmp_path), tiny_math_model_path, "builtin:", "/tmp", "huggingface.co/None"):
            assert leak not in card, leak
        assert "the tiny-math demo model built by stapo_trl" in card and 'model="me/stapo-demo"' in card
    else:
        assert "Base model: `builtin:tiny-math`" in card and f'model="{out}"' in card
    title = "stapo-demo" if public else "demo-run"
    loaded = ModelCard.load(out / "README.md")
    assert loaded.data.model_name == title and f"# Model Card for {title}" in loaded.text
    for broken in ("Model Card for None", "[None]", "huggingface.co/None", 'model="None"', "licence: license"):
        assert broken not in loaded.content, broken


@pytest.mark.parametrize("where, output_dir", [
    ("local-folder", "relative-run"), ("absolute-folder", "./nested/relative-run"), ("builtin", "../up/relative-run"),
])  # fmt: skip
def test_card_hides_local_paths(tiny_random_model_path, tmp_path, monkeypatch, where, output_dir):
    work = tmp_path / "work"  # holds a model folder of the user's own (no stapo_builtin.json)
    shutil.copytree(tiny_random_model_path, work / "my-sft-model", ignore=shutil.ignore_patterns("stapo_*"))
    monkeypatch.chdir(work)
    model = {"local-folder": "my-sft-model", "absolute-folder": str(work / "my-sft-model")}.get(where)
    args = STAPOConfig(output_dir=output_dir, report_to="none", per_device_train_batch_size=8, num_generations=8,
                       max_completion_length=8, max_steps=1)  # fmt: skip
    prompt = [{"role": "user", "content": "47+38\nPlease reason step by step."}]
    STAPOTrainer(model or tiny_random_model_path, lambda completions, **kw: [0.0] * len(completions), args=args,
                 train_dataset=Dataset.from_dict({"prompt": [prompt] * 8})).create_model_card()  # fmt: skip
    card = ((out := (work / output_dir).resolve()) / "README.md").read_text()
    for leak in (str(work / "my-sft-model"), "my-sft-model", tiny_random_model_path, "[None]"):
        assert leak not in card, leak
    assert ("Base model: `builtin:tiny-random`" if where == "builtin" else "Base model: a local model") in card
    assert json.dumps(prompt) in card.split("## Quick start", 1)[1] and "time machine" not in card
    assert f'model="{out}"' in card


def test_cards_name_a_builtin_by_its_hub_origin_with_its_license_and_a_local_data_file_as_no_hub_dataset():
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


def test_python_api_card_loads_the_checkpoint_the_run_saved(tiny_math_model_path, tmp_path):
    out = tmp_path / "python-api"
    (trainer := _card_trainer(tiny_math_model_path, out, max_steps=1, save_steps=1)).train()
    card = out / "README.md"
    assert f'model="{out / "checkpoint-1"}"' in card.read_text()
    run_card_quick_start(card, expect="pipeline(")  # loads what the card names, and answers
    trainer.save_model()
    trainer.create_model_card()
    assert f'model="{out}"' in card.read_text()
    trainer.create_model_card(public=True)  # what push_to_hub uploads: no hub_model_id, so the model's name
    text = card.read_text()
    assert "# Model Card for python-api" in text and 'model="python-api"' in text and str(out) not in text


@pytest.mark.slow  # a stapo-train run with its evaluation
def test_failed_push_keeps_local_results_and_says_how_to_push_later(tmp_path, tiny_math_model_path, capsys):
    run = tmp_path / "demo-stapo"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--output_dir", str(run),
            "--max_steps", "8", "--logging_steps", "4", "--save_strategy", "no", "--disable_tqdm", "true",
            "--eval_num_problems", "16", "--eval_num_samples", "2", "--hub_model_id", "me/x"]  # fmt: skip
    main(argv)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    script_args, args, _ = parse_args(argv)
    trainer = STAPOTrainer(model=tiny_math_model_path, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                           args=args, train_dataset=Dataset.from_dict({"prompt": ["1+1"] * 16}))  # fmt: skip
    args.push_to_hub, args.hub_model_id = True, "me/stapo-demo"  # as if the Hub had been reachable at the start
    _push_to_hub(trainer, script_args, args, json.loads((run / "eval.json").read_text()))
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("Push to hub_model_id='me/stapo-demo' failed (")
    assert printed[-1].endswith(f"push them later with `hf upload me/stapo-demo {run}`.")
    for name in ("model.safetensors", "eval.json", "metrics.jsonl"):
        assert (run / name).read_bytes() == before[name], name
