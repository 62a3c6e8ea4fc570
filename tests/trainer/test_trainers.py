"""The library's `STAPOTrainer`: ablation modes, pooled `s2t/` log rows, non-finite warning, any `GRPOConfig`."""

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import trl
from datasets import Dataset
from testing_utils import PROMPTS, REPO, KeepsLogpGrad, hand_scored_batch, policy_forward, text_reward, zero_reward
from trl import GRPOConfig

from stapo_trl import STAPOConfig, STAPOTrainer, core
from stapo_trl.cli.callbacks import add_command_callbacks
from stapo_trl.data import format_prompt
from stapo_trl.diagnostics.token_records import token_records
from stapo_trl.rewards import math_accuracy_reward
from stapo_trl.run_folder.logs import SpuriousTokenLogger


pytestmark = pytest.mark.filterwarnings("ignore")
SETTINGS = dict(use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=4, num_generations=2,
                max_completion_length=8, logging_steps=1, save_strategy="no", seed=0)  # fmt: skip


def make_trainer(model_path, tmp_path, trainer_cls=STAPOTrainer, reward=zero_reward, config_cls=STAPOConfig, **kwargs):
    args = config_cls(output_dir=str(tmp_path / "run"), **SETTINGS | kwargs)
    trainer = trainer_cls(model_path, reward_funcs=reward, args=args, train_dataset=PROMPTS)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # set by train() only
    return trainer


def test_all_low_prob_gives_silenced_tokens_zero_gradient_and_only_training_masks_reach_the_logger(tmp_path,
        tiny_random_model_path):  # fmt: skip
    # The mask from the loss's own forward; tau_p = 1, all_low_prob: every A > 0 token silenced, rows 1 (A = -0.5, 3
    # tokens) and 3 (A = 0, 2) kept. Ratio 1, surrogate -A: dapo loss (3 * 0.5 + 0) / 5 = 0.3 (GRPO's (1.5-5-8) / 14).
    probe = type("LogpProbe", (KeepsLogpGrad, STAPOTrainer), {})  # keeps the training forward's log-probs
    trainer = make_trainer(tiny_random_model_path, tmp_path, probe, s2t_prob_threshold=1.0, s2t_mode="all_low_prob")
    trainer.add_callback(logger := SpuriousTokenLogger(trainer))
    inputs = hand_scored_batch(trainer.model.config.vocab_size)
    trainer.model.eval()
    with torch.no_grad():
        trainer._compute_loss(trainer.model, dict(inputs))
    assert logger._pending is None and "s2t/num_silenced" not in trainer._metrics["train"]
    assert trainer._metrics["eval"]["s2t/num_silenced"] == [9.0]
    trainer.model.train()
    logps, _ = policy_forward(trainer, inputs)
    loss = trainer._compute_loss(trainer.model, inputs)
    assert loss.item() == pytest.approx(0.3, abs=1e-6)
    loss.backward()
    expected = torch.zeros(4, 5)  # d loss / d log p = -A / K on kept tokens, exactly 0 elsewhere
    expected[1, :3] = 0.5 / 5
    torch.testing.assert_close(trainer.probe_logps.grad, expected)
    assert not trainer.probe_logps.grad[[0, 2]].any()  # exactly 0
    metrics = trainer._metrics["train"]
    assert [metrics[f"s2t/num_{k}"] for k in ("silenced", "candidates", "loss_tokens")] == [[9.0], [9.0], [14.0]]
    silenced = (inputs["advantages"][:, None] > 0) & inputs["completion_mask"].bool()  # the diagnostics of the mask
    assert metrics["s2t/silenced_prob_mean"] == [pytest.approx(logps[silenced].exp().mean().item(), rel=1e-5)]
    pending = token_records(logger._pending, trainer.processing_class)  # the 9 silenced (rows 0 and 2: 5 + 4)
    assert [(r["completion_index"], r["position"], r["kind"]) for r in pending] == [
        (i, t, "silenced") for i, n in ((0, 5), (2, 4)) for t in range(n)]  # fmt: skip
    # Every token silenced (all advantages positive): a finite zero loss, still connected to the graph.
    trainer.model.zero_grad()
    inputs["advantages"] = torch.tensor([1.0, 0.5, 2.0, 3.0])
    loss = trainer._compute_loss(trainer.model, inputs)
    assert torch.isfinite(loss) and loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    assert grads and all(torch.count_nonzero(g) == 0 for g in grads)
    assert metrics["s2t/num_silenced"][-1] == 14.0


def hand_micro_batch(advantages, lengths):  # 2 completions of up to 3 tokens, p 0.001
    completion_mask = (torch.arange(3)[None] < torch.tensor(lengths)[:, None]).long()  # (2, 3)
    return {"prompt_ids": torch.full((2, 2), 5), "prompt_mask": torch.ones(2, 2, dtype=torch.long),
            "completion_ids": torch.full((2, 3), 7), "completion_mask": completion_mask,
            "advantages": torch.tensor(advantages), "num_items_in_batch": completion_mask.sum(),
            "old_per_token_logps": torch.full((2, 3), math.log(0.001)),
            "s2t_entropies": torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])}  # fmt: skip


def two_updates_row(trainer, batches):  # the log row of the second pass over 4 buffered micro-batches (GA 2)
    trainer._buffered_inputs = batches
    for step in range(4, 8):
        trainer._step = step
        trainer._prepare_inputs(None)
    trainer.log({})
    return trainer.state.log_history[-1]


def test_non_finite_p_or_h_is_warned_once_and_counted_and_a_log_row_pools_its_masks(tiny_random_model_path, tmp_path):
    trainer = make_trainer(tiny_random_model_path, tmp_path, steps_per_generation=4, gradient_accumulation_steps=2,
                           num_iterations=2)  # fmt: skip
    batches = [hand_micro_batch([1.0, -1.0], [3, 3 - (i == 3)]) for i in range(4)]  # batch 3: row 1 has 2 tokens
    batches[0]["s2t_entropies"][0, 0] = float("nan")  # a candidate's position (A > 0)
    batches[1]["s2t_entropies"][1, 2] = float("nan")  # a loss token with A < 0: counted too
    batches[2]["s2t_entropies"][0, 1] = float("inf")
    batches[3]["old_per_token_logps"][0, 2] = float("-inf")
    batches[3]["s2t_entropies"][1, 2] = float("nan")  # padding: not a loss token, not counted
    with pytest.warns(UserWarning, match="non-finite") as record:
        row = two_updates_row(trainer, batches)  # two masks with non-finite values: one warning
    assert sum("non-finite" in str(w.message) for w in record) == 1
    assert row["s2t/num_nonfinite"] == 4 and row["s2t/num_loss_tokens"] == 23
    assert row["s2t/num_candidates"] == 12 - 3  # the A > 0 rows' 12 tokens, less the 3 non-finite ones
    assert math.isfinite(row["s2t/entropy_p50"])  # non-finite values stay out of the quantiles too
    # The next rows start afresh. Update 1: 12 loss tokens, the A > 0 rows' 6 silenced; update 2: 4, 1 silenced.
    trainer.s2t = dataclasses.replace(trainer.s2t, mode="all_low_prob")
    batches = [hand_micro_batch([1.0, -1.0], [3, 3])] * 2 + [hand_micro_batch([1.0, -1.0], [1, 1])]
    row = two_updates_row(trainer, [*batches, hand_micro_batch([-1.0, -1.0], [1, 1])])
    assert (row["s2t/num_silenced"], row["s2t/num_candidates"], row["s2t/num_loss_tokens"]) == (7, 7, 16)
    assert row["s2t/silenced_ratio"] == row["s2t/candidate_ratio"] == pytest.approx(7 / 16)  # not the mean, 0.375
    assert row["s2t/num_nonfinite"] == 0 and row["s2t/silenced_prob_mean"] == pytest.approx(0.001)
    row = two_updates_row(trainer, [hand_micro_batch([-1.0, 1.0], [2, 2]) for _ in range(4)])
    assert (row["s2t/num_silenced"], row["s2t/num_loss_tokens"], row["s2t/silenced_ratio"]) == (8, 16, 0.5)


def held_tensors(obj, skip=(), path="", seen=None):  # paths of >= 2-D tensors reachable through containers, objects
    if id(obj) in (seen := set() if seen is None else seen) or seen.add(id(obj)):
        return []
    if torch.is_tensor(obj):
        return [path] if obj.dim() >= 2 else []
    if isinstance(obj, (dict, list, tuple, set, frozenset)) or type(obj).__name__ == "deque":
        children = [(f"{path}[{k!r}]", v) for k, v in (obj.items() if isinstance(obj, dict) else enumerate(obj))]
    elif path == "" or type(obj).__module__.startswith("stapo_trl") or hasattr(type(obj), "__dataclass_fields__"):
        children = [(f"{path}.{key}", value) for key, value in vars(obj).items() if key not in skip]
    else:
        return []
    return [found for child_path, child in children for found in held_tensors(child, (), child_path, seen)]


def test_an_ablation_mode_trains_logs_its_diagnostics_and_retains_no_batch_tensor_and_undefined_ones_are_left_out(
        tiny_random_model_path, tmp_path, builtin_cache_dir, monkeypatch):  # fmt: skip
    # The paper's geometry: 4 updates per rollout batch, p and H from TRL's old-log-prob forward; 2 rollout batches.
    trainer = make_trainer(tiny_random_model_path, tmp_path, reward=text_reward, max_steps=8, learning_rate=1e-2,
                           steps_per_generation=4, logging_steps=4, s2t_prob_threshold=0.05,
                           s2t_mode="high_entropy")  # fmt: skip
    logger = SpuriousTokenLogger(trainer, max_silenced=3, max_kept_candidates=2, max_reference=2)
    trainer.add_callback(logger)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert all(not torch.equal(before[name], p) for name, p in trainer.model.named_parameters())
    rows = [row for row in trainer.state.log_history if "loss" in row]
    assert len(rows) == 2
    for row in rows:
        quantiles = [row[f"s2t/entropy_p{q}"] for q in (10, 50, 80, 95)]
        assert quantiles == sorted(quantiles) and 0 < quantiles[0] <= math.log(trainer.model.config.vocab_size)
        assert row["s2t/num_silenced"] <= row["s2t/num_candidates"] <= row["s2t/num_loss_tokens"]
        assert not row["s2t/num_silenced"] or 0 < row["s2t/silenced_prob_mean"] < 0.05
    assert 0 < sum(row["s2t/num_silenced"] for row in rows) < sum(row["s2t/num_candidates"] for row in rows)
    assert logger._pending is None and logger.silenced_counts  # written at the logging steps
    # No 2-D batch tensor kept by the trainer (but TRL's rollout buffer) nor by a callback (the caps: diagnostics)
    assert held_tensors(trainer, skip={"_buffered_inputs"}) == []
    for callback in trainer.callback_handler.callbacks:
        assert held_tensors(callback, skip={"trainer"}) == [], type(callback).__name__
    # tau_p = 1e-30: no candidate, so tau_h and the silenced-token means are undefined (NaN) at every step. Step 3
    # (logging_steps 2) is logged only by the end-of-training summary (train_result.metrics).
    monkeypatch.setenv("STAPO_TRL_CACHE", str(builtin_cache_dir))  # where the fixture built it
    trainer = make_trainer("builtin:tiny-random", tmp_path / "undefined", reward=text_reward, max_steps=3,
                           logging_steps=2, s2t_prob_threshold=1e-30)  # fmt: skip
    assert trainer.model.config._name_or_path == tiny_random_model_path
    result = trainer.train()
    logged = [h for h in trainer.state.log_history if "s2t/silenced_ratio" in h]
    assert len(logged) == 2  # step 2, and step 3 inside the summary
    for entry in logged:
        assert entry["s2t/num_candidates"] == 0 and entry["s2t/silenced_ratio"] == 0
        assert not {"s2t/entropy_threshold", "s2t/silenced_prob_mean", "s2t/silenced_entropy_mean"} & entry.keys()
        assert entry["s2t/entropy_p50"] > 0 and None not in entry.values()  # defined: every loss token has an entropy
    assert None not in result.metrics.values()
    trainer.log_metrics("train", result.metrics)  # formats every value: fails on a None


OpenR1StyleConfig = dataclasses.make_dataclass("OpenR1StyleConfig", [  # a user's config as open-r1 writes one
    ("system_prompt", str | None, None), ("s2t_mode", str, "all_low_prob"), ("s2t_write_run_files", bool, True)],
    bases=(GRPOConfig,))  # fmt: skip
MATH_PROMPTS = Dataset.from_list([{"prompt": format_prompt(f"{a}+{a + 3}"), "solution": str(2 * a + 3)}
                                  for a in range(10, 34)])  # fmt: skip


def test_any_grpo_config_gives_its_extras_and_a_plain_one_the_run_files_checks_and_ctrl_c_save(tmp_path,
        tiny_random_model_path, tiny_math_model_path):  # fmt: skip
    from testing_utils import SignalAtStep

    trainer = make_trainer(tiny_random_model_path, tmp_path / "own", reward=text_reward, config_cls=OpenR1StyleConfig,
                           max_steps=2, s2t_write_run_files=False)  # fmt: skip
    assert trainer.s2t.mode == "all_low_prob"  # the library's ablations, where the config has them
    trainer.train()  # trains, silencing every candidate
    rows = [row for row in trainer.state.log_history if "loss" in row]
    assert len(rows) == 2 and sum(r["s2t/num_silenced"] for r in rows) == sum(r["s2t/num_candidates"] for r in rows)
    assert not (tmp_path / "own" / "run" / "metrics.jsonl").exists()  # the config's own s2t_write_run_files=False
    with pytest.raises(ValueError, match=r"s2t_mode='all_low_prob' is not one of \['low_entropy', 'off'\]"):
        core.STAPOTrainer(tiny_random_model_path, zero_reward, args=trainer.args, train_dataset=PROMPTS)
    trainer.args.s2t_write_run_files = "no"  # a field of the user's class, of the wrong type: refused at construction
    with pytest.raises(ValueError, match=r"^s2t_write_run_files='no' must be a bool"):
        STAPOTrainer(tiny_random_model_path, reward_funcs=zero_reward, args=trainer.args, train_dataset=PROMPTS)
    args = GRPOConfig(output_dir=str(tmp_path / "run"), **SETTINGS | dict(per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=48, max_steps=4))  # fmt: skip
    with pytest.raises(ValueError, match="prompt"):  # the library's construction checks, with a GRPOConfig too
        STAPOTrainer(tiny_math_model_path, math_accuracy_reward, args, MATH_PROMPTS.remove_columns("prompt"))
    trainer = STAPOTrainer(tiny_math_model_path, math_accuracy_reward, args=args, train_dataset=MATH_PROMPTS)
    trainer.add_callback(SignalAtStep(2, signal.SIGINT))
    add_command_callbacks(trainer)  # the one line that gives a script stapo-train's stop signals
    with pytest.raises(KeyboardInterrupt) as excinfo:
        trainer.train()
    assert excinfo.value.step == 2 and (tmp_path / "run" / "checkpoint-2" / "trainer_state.json").is_file()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "s2t/num_loss_tokens" in row] == [1, 2]
    records = [json.loads(line) for line in (tmp_path / "run" / "spurious_tokens.jsonl").read_text().splitlines()]
    assert records  # the per-token records, with the paper's tau_p (the config has none)


@pytest.mark.slow  # a new Python process (~10 s of imports) training two steps
def test_trls_own_grpo_script_trains_with_the_trainer_import_changed(tiny_math_model_path, tmp_path):
    source = (Path(trl.__file__).parent / "scripts" / "grpo.py").read_text()
    original = "from trl import GRPOTrainer, get_dataset, get_peft_config, get_quantization_config"
    assert source.count(original) == 1
    changed = "from stapo_trl import STAPOTrainer as GRPOTrainer\n    " + original.replace("GRPOTrainer, ", "")
    (tmp_path / "script.py").write_text(source.replace(original, changed))
    (tmp_path / "data").mkdir()
    MATH_PROMPTS.to_json(tmp_path / "data" / "train.jsonl")
    (tmp_path / "rewards.py").write_text("from stapo_trl.rewards import math_accuracy_reward\n\n\ndef accuracy("
        "completions, solution, **kwargs):\n    return math_accuracy_reward(completions, solution=solution, "
        "**kwargs)\n")  # fmt: skip
    argv = ["--model_name_or_path", tiny_math_model_path, "--dataset_name", str(tmp_path / "data"), "--output_dir",
            str(tmp_path / "out"), *"--reward_funcs rewards.accuracy --use_cpu true --bf16 false --report_to none "
            "--max_steps 2 --logging_steps 1 --per_device_train_batch_size 8 --num_generations 4 "
            "--max_completion_length 48 --save_strategy no --steps_per_generation 4 "
            "--gradient_accumulation_steps 2".split()]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    result = subprocess.run([sys.executable, "script.py", *argv], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "STAPO with s2t_prob_threshold=0.002" in result.stderr  # the one line: GRPOConfig has no S2T field
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "s2t/num_loss_tokens" in row] == [1, 2]
    assert (tmp_path / "out" / "model.safetensors").is_file()
