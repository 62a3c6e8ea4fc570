"""The real `stapo-train` on two CPU processes under the project's accelerate configs (DDP, DeepSpeed ZeRO-2 and
ZeRO-3): training, resuming, input errors, Ctrl-C, and the documented two-process command. All `slow`.

Two processes on a 2-core CPU test correctness, not speed. What actually starts two ranks here is an accelerate config
with `distributed_type: MULTI_GPU` and `use_cpu: true` (recipes/accelerate_configs/cpu_2proc.yaml) or torchrun;
`accelerate launch --cpu --num_processes 2` and MULTI_CPU configs silently start one, so every test checks that two
ranks really ran. Each subprocess has a timeout (a hung collective fails the test instead of the suite) and its output
is printed when it fails.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from testing_utils import (
    PORT_TAKEN,
    REPO,
    SMALL_TWO_RANK_DEMO,
    STAPO_RECIPE,
    builtin_cache_root,
    check_two_rank_demo_run,
    free_port,
    read_jsonl,
    readme_code_blocks,
    run_distributed,
    subprocess_env,
)


pytestmark = pytest.mark.slow  # two processes each: 10 s to several minutes on 2 cores, with the load and DeepSpeed

ACCELERATE_CONFIGS = REPO / "recipes" / "accelerate_configs"


def _deepspeed_env() -> dict[str, str]:
    # why: the first DeepSpeed launch JIT-builds a CPU communication op (~1 minute); a persistent folder caches it
    extensions = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.expanduser("~/.cache/stapo_trl/torch_extensions")
    return subprocess_env(TORCH_EXTENSIONS_DIR=extensions, DS_BUILD_OPS="0")


def _accelerate_cmd(config: str, port: int) -> list[str]:
    return [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ACCELERATE_CONFIGS / config),
        # why: a shared machine; the default 29500 may belong to another job
        "--main_process_port", str(port),
    ]  # fmt: skip


def test_demo_recipe_trains_on_two_cpu_processes(tiny_math_model_path, tmp_path):
    from stapo_trl.cli.eval import main as stapo_eval

    out = tmp_path / "demo-2proc"
    # why: 9 problems x 2 samples split unevenly (5 and 4, the last one padded) over the two ranks
    evaluation = ["--eval_before_after", "true", "--eval_num_problems", "9", "--eval_num_samples", "2"]
    output = run_distributed(
        lambda port: _accelerate_cmd("cpu_2proc.yaml", port) + [
            "-m", "stapo_trl.cli.train", "--config", str(STAPO_RECIPE),
            "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out), *SMALL_TWO_RANK_DEMO, *evaluation,
        ],
        timeout=900,
    )  # fmt: skip
    check_two_rank_demo_run(output, out)
    card = (out / "README.md").read_text()  # written by the main process only
    assert "STAPO" in card and "2602.15620" in card and "| `s2t_prob_threshold` |" in card
    # The evaluation split over two processes gives one process's numbers: a seed per sample, not per process.
    record = json.loads((out / "eval.json").read_text())
    assert record["num_processes"] == 2 and record["num_problems"] == 9
    for when in ("before", "after"):
        results = tmp_path / f"{when}.json"
        assert stapo_eval([*shlex.split(record["stapo_eval_command"][when])[1:], "--output", str(results)]) == 0
        table = json.loads(results.read_text())["results"]["t1.0-p1.0"]["tiny-math"]
        assert (table["avg@2"], table["pass@k"]["2"]) == (record[f"accuracy_{when}"], record[f"pass@2_{when}"])


def test_an_input_error_under_accelerate_ends_each_process_with_status_2(tmp_path):
    """`python -m stapo_trl.cli.train` on every rank exits 2 on a range error (it exited 1) with one line; the
    launcher's own status is accelerate's (1, with torch's summary naming the ranks' exit codes)."""
    for _ in range(2):  # a second port when another job took the first meanwhile
        cmd = _accelerate_cmd("cpu_2proc.yaml", free_port()) + [
            "-m", "stapo_trl.cli.train", "--config", str(STAPO_RECIPE), "--output_dir", str(tmp_path / "out"),
            "--s2t_entropy_quantile", "1.5",
        ]  # fmt: skip
        result = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=600)
        output = result.stdout + result.stderr
        if not any(marker in output for marker in PORT_TAKEN):
            break
    assert result.returncode != 0, output[-3000:]
    assert "exitcode  : 2 (pid:" in output, output[-3000:]  # the root cause: a rank that exited with status 2
    assert "exitcode  : 1 (pid:" not in output, output[-3000:]
    message = "stapo-train: error: --s2t_entropy_quantile: s2t_entropy_quantile=1.5 must be in [0, 1]"
    assert any(line.startswith(message) for line in output.splitlines()), output[-3000:]
    assert not (tmp_path / "out").exists()


def test_demo_recipe_trains_with_deepspeed_zero2_on_two_cpu_processes(tiny_math_model_path, tmp_path):
    pytest.importorskip("deepspeed")
    out = tmp_path / "demo-zero2"
    output = run_distributed(
        lambda port: _accelerate_cmd("zero2_cpu_2proc.yaml", port) + [
            "-m", "stapo_trl.cli.train", "--config", str(STAPO_RECIPE),
            "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out), *SMALL_TWO_RANK_DEMO,
        ],
        timeout=1500,
        env=_deepspeed_env(),
    )  # fmt: skip
    check_two_rank_demo_run(output, out)
    # DeepSpeed's CPU communication op is loaded (built or from the cache) only when the DeepSpeed engine runs.
    assert "deepspeed_shm_comm_op" in output, output[-3000:]


def _untied_head_copy(model_path: str, out: Path) -> Path:
    """Save a copy of `model_path` whose LM head is its own parameter (same values as the tied embedding).

    Qwen3-8B and -14B do not tie their embeddings: their `lm_head.weight` is a ZeRO-3 parameter that only the fused LM
    head reads (never the module's forward), so the test runs that path, not the tiny model's tied one.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_path)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(out)
    return out


def _small_demo_cmd(config: str, port: int, model: Path, out: Path, *args: str) -> list[str]:
    """`stapo-train` of the demo recipe under the accelerate `config` at the size of the ZeRO-3 test."""
    return _accelerate_cmd(config, port) + [
        "-m", "stapo_trl.cli.train", "--config", str(STAPO_RECIPE), "--model_name_or_path", str(model),
        "--output_dir", str(out),
        # why: 8 completions per rank x 2 ranks x steps_per_generation 4 = 64 completions, 8 prompt groups of 8
        "--per_device_train_batch_size", "8",
        # why: two log rows per rollout batch of 4 optimizer updates
        "--logging_steps", "2",
        # why: tau_p = 1 makes every positive-advantage token a candidate, so the mask silences tokens within a few
        # steps (the paper's 0.002 finds ~1 candidate per 1,000 tokens on this model) and the diagnostics have some
        "--s2t_prob_threshold", "1.0",
        "--save_strategy", "steps", "--save_steps", "4",
        "--report_to", "none", "--disable_tqdm", "true",
        # why: "Total train batch size ..." and "Detected DeepSpeed ZeRO-3" are info-level
        "--log_level", "info",
        *args,
    ]  # fmt: skip


def test_demo_recipe_trains_and_resumes_with_deepspeed_zero3_on_two_cpu_processes(tiny_math_model_path, tmp_path):
    """ZeRO-3 (parameters partitioned, `zero3_init_flag`) on an untied LM head: the rollout batch's captured no-grad
    forward, the diagnostics, the held-out evaluation's gathered `generate`, the 16-bit model save and a resume from
    the ZeRO-3 checkpoint."""
    pytest.importorskip("deepspeed")
    import torch
    from safetensors.torch import load_file

    model = _untied_head_copy(tiny_math_model_path, tmp_path / "untied")
    out = tmp_path / "demo-zero3"
    env = _deepspeed_env()
    # why: 8 problems x 1 sample run the before/after evaluation's generate (under ZeRO-3) in about a second
    evaluation = ["--eval_before_after", "true", "--eval_num_problems", "8", "--eval_num_samples", "1"]
    output = run_distributed(
        lambda port: _small_demo_cmd("zero3_cpu_2proc.yaml", port, model, out, "--max_steps", "4", *evaluation),
        timeout=1500,
        env=env,
    )

    assert "Detected DeepSpeed ZeRO-3: activating zero.init()" in output, output[-3000:]
    assert "Total train batch size (w. parallel, distributed & accumulation) = 16" in output, output[-3000:]
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    rows = [row for row in read_jsonl(out / "metrics.jsonl") if "loss" in row]
    assert [row["step"] for row in rows] == [2, 4]
    for row in rows:  # each row sums the masks of its two optimizer updates (GA 1)
        assert row["s2t/num_loss_tokens"] > 0 and row["s2t/num_nonfinite"] == 0
        assert 0 < row["s2t/num_silenced"] < row["s2t/num_candidates"] < row["s2t/num_loss_tokens"], row
        assert row["s2t/silenced_ratio"] == row["s2t/num_silenced"] / row["s2t/num_loss_tokens"]
        # The diagnostics: entropy quantiles in order, silenced-token means.
        quantiles = [row[f"s2t/entropy_p{q}"] for q in (10, 50, 80, 95)]
        assert 0.0 < quantiles[0] <= quantiles[1] <= quantiles[2] <= quantiles[3] < math.log(vocab), quantiles
        assert 0.0 < row["s2t/silenced_prob_mean"] < 1.0
        assert 0.0 <= row["s2t/silenced_entropy_mean"] < row["s2t/entropy_threshold"]

    # spurious_tokens.jsonl: the silenced tokens obey the rule (p < tau_p, H < tau_h, A > 0).
    records = read_jsonl(out / "spurious_tokens.jsonl")
    silenced = [r for r in records if r["kind"] == "silenced"]
    assert silenced and {r["step"] for r in records} <= {2, 4}, {r["step"] for r in records}
    for r in silenced:
        assert r["advantage"] > 0 and r["prob"] < 1.0 and r["entropy"] < r["entropy_threshold"], r

    # The same run under plain DDP (full parameters on every rank): the 4 steps train on one rollout batch, scored
    # by one forward of the initial weights, so its mask, diagnostics and spurious-token records are the same numbers
    # (measured: bit for bit); the losses differ only by the gradient reduction order.
    ddp = tmp_path / "demo-ddp"
    args = ["--max_steps", "4", "--save_strategy", "no", "--eval_before_after", "false"]
    run_distributed(lambda port: _small_demo_cmd("cpu_2proc.yaml", port, model, ddp, *args), timeout=900)
    ddp_rows = [row for row in read_jsonl(ddp / "metrics.jsonl") if "loss" in row]
    assert [row["step"] for row in ddp_rows] == [2, 4]
    for row, ddp_row in zip(rows, ddp_rows, strict=True):
        s2t_keys = sorted(key for key in row if key.startswith("s2t/"))
        assert s2t_keys == sorted(key for key in ddp_row if key.startswith("s2t/"))
        assert {k: row[k] for k in s2t_keys} == pytest.approx({k: ddp_row[k] for k in s2t_keys}, rel=1e-9, abs=0)
        assert row["loss"] == pytest.approx(ddp_row["loss"], rel=1e-4)
    ddp_silenced = [r for r in read_jsonl(ddp / "spurious_tokens.jsonl") if r["kind"] == "silenced"]
    fields = ("step", "process_index", "completion_index", "position", "token_id", "prob", "entropy")
    assert [[r[f] for f in fields] for r in silenced] == [[r[f] for f in fields] for r in ddp_silenced]

    evaluation = json.loads((out / "eval.json").read_text())
    assert evaluation["num_problems"] == 8 and 0.0 <= evaluation["accuracy_after"] <= 1.0
    # Weights: full tensors in the saved files (ZeRO-3 gathers them for the 16-bit save), every one trained, the
    # untied LM head included.
    initial = load_file(model / "model.safetensors")
    step4 = load_file(out / "checkpoint-4" / "model.safetensors")
    assert "lm_head.weight" in initial and set(step4) == set(initial)
    for name, tensor in initial.items():
        assert step4[name].shape == tensor.shape, name
        assert not torch.equal(step4[name], tensor), f"{name} did not change in 4 steps"
    assert sorted(p.name for p in (out / "checkpoint-4" / "global_step4").glob("zero_pp_rank_*_optim_states.pt")) == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]

    # Resume: same folder, max_steps 8. It continues from checkpoint-4 (DeepSpeed loads each rank's partition) and
    # reaches step 8, logging the mask of the new rollout batch.
    output = run_distributed(
        lambda port: _small_demo_cmd(
            "zero3_cpu_2proc.yaml", port, model, out, "--max_steps", "8", "--eval_before_after", "false"
        ),
        timeout=900,
        env=env,
    )
    assert "Resuming training from" in output and "checkpoint-4" in output, output[-3000:]
    assert "Resuming training from checkpoint with epoch 0 and global step 4" in output, output[-3000:]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 8
    rows = [row for row in read_jsonl(out / "metrics.jsonl") if "loss" in row]
    assert [row["step"] for row in rows] == [2, 4, 6, 8]
    assert rows[2]["s2t/num_silenced"] > 0 and "s2t/silenced_entropy_mean" in rows[2]
    step8 = load_file(out / "checkpoint-8" / "model.safetensors")
    assert all(not torch.equal(step8[name], step4[name]) for name in step4)


def test_benchmark_eval_runs_under_zero3_on_every_rank(tiny_math_model_path, tmp_path):
    """`benchmark_eval` is TRL's evaluation, which generates on every rank: under ZeRO-3 (sharded parameters) on two
    processes it logs the benchmark's avg@k at its step."""
    pytest.importorskip("deepspeed")
    out = tmp_path / "zero3-eval"
    # why: 8 problems x 2 samples = 16 completions, one full eval batch of 8 per rank, at step 2
    benchmark = ["--benchmark_eval", "tiny-math", "--benchmark_eval_steps", "2", "--benchmark_eval_limit", "8"]
    benchmark += ["--benchmark_eval_samples", "2", "--per_device_eval_batch_size", "8"]
    run_distributed(
        lambda port: _small_demo_cmd("zero3_cpu_2proc.yaml", port, Path(tiny_math_model_path), out, "--max_steps", "2",
                                     "--save_strategy", "no", "--eval_before_after", "false", *benchmark),
        timeout=900,
        env=_deepspeed_env(),
    )  # fmt: skip
    (row,) = [row for row in read_jsonl(out / "metrics.jsonl") if "eval_reward" in row]
    assert row["step"] == 2 and 0.0 <= row["eval_rewards/math_accuracy_reward/mean"] <= 1.0, row
    assert row["eval_completions/mean_length"] > 10, row  # real completions, generated with gathered parameters


def test_ctrl_c_on_two_processes_saves_one_checkpoint_on_every_rank_and_resumes(tiny_math_model_path, tmp_path):
    """Ctrl-C in a terminal signals the launcher's process group; torch's launcher forwards SIGINT to each worker
    (they run in their own sessions) and kills them after TORCH_ELASTIC_SHUTDOWN_TIMEOUT. The workers agree on the
    step through the all-reduced flag, save one checkpoint together (both ranks' RNG states), and the main process
    prints one message with the launch-aware resume command; rerunning the same launch line finishes the run."""
    out = tmp_path / "run"
    train_args = [
        "-m", "stapo_trl.cli.train", "--config", str(STAPO_RECIPE), "--model_name_or_path", tiny_math_model_path,
        "--output_dir", str(out), "--per_device_train_batch_size", "8", "--logging_steps", "1",
        "--save_strategy", "no", "--eval_before_after", "false", "--report_to", "none", "--disable_tqdm", "true",
    ]  # fmt: skip
    port = free_port()
    env = subprocess_env(TORCH_ELASTIC_SHUTDOWN_TIMEOUT="300")
    proc = subprocess.Popen(
        _accelerate_cmd("cpu_2proc.yaml", port) + train_args + ["--max_steps", "5000"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    lines, losses = [], 0
    try:
        for line in proc.stdout:  # two optimizer steps logged: training is under way on both ranks
            lines.append(line)
            losses += line.startswith("step ")
            if losses == 2:
                break
        assert losses == 2, "".join(lines)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does: the launcher's process group
        output = "".join(lines) + proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    interrupted = [line for line in output.splitlines() if line.startswith("Interrupted by SIGINT at step")]
    assert len(interrupted) == 1, output[-5000:]  # one message per run, from the main process
    step = int(interrupted[0].split()[5].rstrip(":"))
    assert 2 <= step < 5000
    assert "Resume with the same command: the same launch command, i.e. accelerate launch" in interrupted[0]
    assert interrupted[0].endswith(" ".join(train_args[1:] + ["--max_steps", "5000"]))
    checkpoint = out / f"checkpoint-{step}"
    assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "optimizer.pt"} <= set(
        p.name for p in checkpoint.iterdir()
    )
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == step
    assert not (out / "model.safetensors").exists()  # the run is not finished
    # The same launch line (a near end, to keep the test short) resumes from that checkpoint and finishes.
    resumed = run_distributed(
        lambda port: _accelerate_cmd("cpu_2proc.yaml", port) + train_args + ["--max_steps", str(step + 2)],
        timeout=600,
    )
    assert f"Resuming training from {checkpoint}" in resumed, resumed[-3000:]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == step + 2
    assert (out / "model.safetensors").exists()


def _documented_command(marker: str) -> list[str]:
    """The one command of the `docs/training_at_scale.md` bash block that contains `marker`, continuation lines joined,
    comments dropped."""
    block = next(
        block for block in readme_code_blocks("bash", REPO / "docs" / "training_at_scale.md") if marker in block
    )
    lines = [line for line in block.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]
    (command,) = [line for line in lines if marker in line]
    return shlex.split(command)


def test_documented_cpu_two_process_command_trains_on_two_ranks(tiny_math_model_path, tmp_path):
    command = _documented_command("cpu_2proc.yaml")
    assert command[:2] == ["accelerate", "launch"] and "--output_dir" in command, command
    out = tmp_path / "demo-2proc"
    # The printed command with overrides appended, as the page says: `accelerate launch` becomes this Python's
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
    env = subprocess_env(STAPO_TRL_CACHE=str(builtin_cache_root(tiny_math_model_path)))
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
