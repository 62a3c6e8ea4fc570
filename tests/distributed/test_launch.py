"""The real `stapo-train` on two CPU processes under the project's accelerate configs (DDP, ZeRO-2, ZeRO-3)."""

import json
import math
import os
import shlex
import sys
from pathlib import Path

import pytest
from testing_utils import (
    REPO,
    SMALL_TWO_RANK_DEMO,
    STAPO_RECIPE,
    accelerate_launch,
    builtin_cache_root,
    check_two_rank_demo_run,
    read_jsonl,
    readme_code_blocks,
    run_subprocess,
    subprocess_env,
)


pytestmark = pytest.mark.slow


def _deepspeed_env() -> dict[str, str]:  # a persistent folder caches DeepSpeed's JIT-built CPU op (~1 minute)
    extensions = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.expanduser("~/.cache/stapo_trl/torch_extensions")
    return subprocess_env(TORCH_EXTENSIONS_DIR=extensions, DS_BUILD_OPS="0")


def _stapo_train(config: str, model, out: Path, *args: str, timeout=900, env=None) -> str:
    argv = ["-m", "stapo_trl.cli.train", "--config", STAPO_RECIPE, "--model_name_or_path", str(model),
            "--output_dir", str(out), *args]  # fmt: skip
    return run_subprocess(lambda port: [*accelerate_launch(port, config), *argv], timeout=timeout, env=env)


def test_demo_recipe_trains_with_deepspeed_zero2_on_two_cpu_processes(tiny_math_model_path, tmp_path):
    pytest.importorskip("deepspeed")
    out = tmp_path / "demo-zero2"
    output = _stapo_train("zero2_cpu_2proc.yaml", tiny_math_model_path, out, *SMALL_TWO_RANK_DEMO, timeout=1500,
                          env=_deepspeed_env())  # fmt: skip
    check_two_rank_demo_run(output, out)
    assert "deepspeed_shm_comm_op" in output, output[-3000:]


# 64 completions per rollout batch, 2 log rows per 4 updates, tau_p = 1: every A > 0 token a candidate; info level
SMALL_DEMO = ["--per_device_train_batch_size", "8", "--logging_steps", "2", "--s2t_prob_threshold", "1.0",
              "--save_strategy", "steps", "--save_steps", "4", "--report_to", "none", "--disable_tqdm", "true",
              "--log_level", "info"]  # fmt: skip


def test_demo_recipe_trains_and_resumes_with_deepspeed_zero3_on_two_cpu_processes(tiny_math_model_path, tmp_path):
    pytest.importorskip("deepspeed")
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # the model with an untied LM head (Qwen3-8B, -14B: a ZeRO-3 parameter only the fused head reads)
    model, out = tmp_path / "untied", tmp_path / "demo-zero3"
    untied = AutoModelForCausalLM.from_pretrained(tiny_math_model_path)
    untied.config.tie_word_embeddings = False
    untied.lm_head.weight = torch.nn.Parameter(untied.get_input_embeddings().weight.detach().clone())
    untied.save_pretrained(model)
    AutoTokenizer.from_pretrained(tiny_math_model_path).save_pretrained(model)

    env, zero3 = _deepspeed_env(), "zero3_cpu_2proc.yaml"
    evaluation = ["--eval_before_after", "true", "--eval_num_problems", "8", "--eval_num_samples", "1"]
    output = _stapo_train(zero3, model, out, *SMALL_DEMO, "--max_steps", "4", *evaluation, timeout=1500, env=env)

    assert "Detected DeepSpeed ZeRO-3: activating zero.init()" in output, output[-3000:]
    assert "Total train batch size (w. parallel, distributed & accumulation) = 16" in output, output[-3000:]
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    rows = [row for row in read_jsonl(out / "metrics.jsonl") if "loss" in row]
    assert [row["step"] for row in rows] == [2, 4]
    for row in rows:  # each row sums the masks of its two optimizer updates (GA 1)
        assert row["s2t/num_loss_tokens"] > 0 and row["s2t/num_nonfinite"] == 0
        assert 0 < row["s2t/num_silenced"] < row["s2t/num_candidates"] < row["s2t/num_loss_tokens"], row
        assert row["s2t/silenced_ratio"] == row["s2t/num_silenced"] / row["s2t/num_loss_tokens"]
        quantiles = [row[f"s2t/entropy_p{q}"] for q in (10, 50, 80, 95)]
        assert 0.0 < quantiles[0] <= quantiles[1] <= quantiles[2] <= quantiles[3] < math.log(vocab), quantiles
        assert 0.0 < row["s2t/silenced_prob_mean"] < 1.0
        assert 0.0 <= row["s2t/silenced_entropy_mean"] < row["s2t/entropy_threshold"]

    records = read_jsonl(out / "spurious_tokens.jsonl")
    silenced = [r for r in records if r["kind"] == "silenced"]
    assert silenced and {r["step"] for r in records} <= {2, 4}, {r["step"] for r in records}
    for r in silenced:
        assert r["advantage"] > 0 and r["prob"] < 1.0 and r["entropy"] < r["entropy_threshold"], r

    # The same run under DDP: one rollout batch scored by the initial weights, so the same masks and records.
    ddp = tmp_path / "demo-ddp"
    args = ["--max_steps", "4", "--save_strategy", "no", "--eval_before_after", "false"]
    _stapo_train("cpu_2proc.yaml", model, ddp, *SMALL_DEMO, *args)
    ddp_rows = [row for row in read_jsonl(ddp / "metrics.jsonl") if "loss" in row]
    for row, ddp_row in zip(rows, ddp_rows, strict=True):  # steps 2 and 4, as `rows`
        s2t_keys = sorted(key for key in row if key.startswith("s2t/"))
        assert s2t_keys == sorted(key for key in ddp_row if key.startswith("s2t/"))
        assert {k: row[k] for k in s2t_keys} == pytest.approx({k: ddp_row[k] for k in s2t_keys}, rel=1e-9, abs=0)
        assert row["loss"] == pytest.approx(ddp_row["loss"], rel=1e-4)
    ddp_silenced = [r for r in read_jsonl(ddp / "spurious_tokens.jsonl") if r["kind"] == "silenced"]
    fields = ("step", "process_index", "completion_index", "position", "token_id", "prob", "entropy")
    assert [[r[f] for f in fields] for r in silenced] == [[r[f] for f in fields] for r in ddp_silenced]

    evaluation = json.loads((out / "eval.json").read_text())
    assert evaluation["num_problems"] == 8 and 0.0 <= evaluation["accuracy_after"] <= 1.0
    initial, step4 = load_file(model / "model.safetensors"), load_file(out / "checkpoint-4" / "model.safetensors")
    assert "lm_head.weight" in initial and set(step4) == set(initial)
    for name, tensor in initial.items():
        assert step4[name].shape == tensor.shape and not torch.equal(step4[name], tensor), f"{name} did not change"
    optim = sorted(p.name for p in (out / "checkpoint-4" / "global_step4").glob("zero_pp_rank_*_optim_states.pt"))
    assert optim == [f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in (0, 1)]

    # Resume to step 8 from checkpoint-4; TRL's evaluation at step 8 generates on every rank, parameters gathered.
    resume = ["--max_steps", "8", "--eval_before_after", "false", "--benchmark_eval", "tiny-math",
              "--benchmark_eval_steps", "4", "--benchmark_eval_limit", "8", "--benchmark_eval_samples", "2",
              "--per_device_eval_batch_size", "8"]  # fmt: skip
    output = _stapo_train(zero3, model, out, *SMALL_DEMO, *resume, env=env)
    assert "Resuming training from" in output and "checkpoint-4" in output, output[-3000:]
    assert "Resuming training from checkpoint with epoch 0 and global step 4" in output, output[-3000:]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 8
    rows = [row for row in read_jsonl(out / "metrics.jsonl") if "loss" in row]
    assert [row["step"] for row in rows] == [2, 4, 6, 8]
    assert rows[2]["s2t/num_silenced"] > 0 and "s2t/silenced_entropy_mean" in rows[2]
    step8 = load_file(out / "checkpoint-8" / "model.safetensors")
    assert all(not torch.equal(step8[name], step4[name]) for name in step4)
    (row,) = [row for row in read_jsonl(out / "metrics.jsonl") if "eval_reward" in row]
    assert row["step"] == 8 and 0.0 <= row["eval_rewards/math_accuracy_reward/mean"] <= 1.0, row
    assert row["eval_completions/mean_length"] > 10, row  # real completions, not an empty generation


def test_documented_cpu_two_process_command_trains_and_evaluates(tiny_math_model_path, tmp_path, monkeypatch):
    from stapo_trl.cli.eval import main as stapo_eval

    blocks = readme_code_blocks("bash", REPO / "docs" / "training_at_scale.md")
    lines = next(b for b in blocks if "cpu_2proc.yaml" in b).replace("\\\n", " ").splitlines()
    (command,) = [shlex.split(line) for line in lines if "cpu_2proc.yaml" in line and not line.startswith("#")]
    assert command[:2] == ["accelerate", "launch"] and "--output_dir" in command, command
    out = tmp_path / "demo-2proc"
    # The printed command, overrides appended, a free port; 9 problems x 2 samples split 5 and 4 (padded) over 2 ranks
    overrides = [*SMALL_TWO_RANK_DEMO, "--eval_before_after", "true", "--eval_num_problems", "9",
                 "--eval_num_samples", "2", "--output_dir", str(out)]  # fmt: skip
    monkeypatch.setenv("STAPO_TRL_CACHE", str(builtin_cache_root(tiny_math_model_path)))  # the before-evaluation's
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--main_process_port"]
    output = run_subprocess(lambda port: [*launch, str(port), *command[2:], *overrides], timeout=900)
    check_two_rank_demo_run(output, out)
    assert (out / "spurious_tokens.jsonl").is_file()
    card = (out / "README.md").read_text()  # written by the main process only
    assert "STAPO" in card and "2602.15620" in card and "| `s2t_prob_threshold` |" in card
    record = json.loads((out / "eval.json").read_text())
    assert record["num_processes"] == 2 and record["num_problems"] == 9
    for when in ("before", "after"):
        results = tmp_path / f"{when}.json"
        assert stapo_eval([*shlex.split(record["stapo_eval_command"][when])[1:], "--output", str(results)]) == 0
        table = json.loads(results.read_text())["results"]["t1.0-p1.0"]["tiny-math"]
        assert (table["avg@2"], table["pass@k"]["2"]) == (record[f"accuracy_{when}"], record[f"pass@2_{when}"])
