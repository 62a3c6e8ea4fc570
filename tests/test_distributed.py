"""Multi-process tests on CPU: the real `stapo-train` under the project's accelerate configs, and the S2T collectives.

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
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from testing_utils import PORT_TAKEN, check_two_rank_demo_run, free_port, run_distributed, run_torchrun, subprocess_env

from stapo_trl.runfiles.metrics_log import read_token_records


REPO = Path(__file__).resolve().parents[1]
ACCELERATE_CONFIGS = REPO / "recipes" / "accelerate_configs"
DEMO_RECIPE = REPO / "recipes" / "demo" / "stapo.yaml"

# The demo recipe, shrunk for a 2-process CPU run.
SMALL_DEMO = [
    # why: 2 optimizer steps are enough to see a generation batch scored, masked and trained on by both ranks
    "--max_steps", "2",
    # why: 8 completions per rank x 2 ranks x steps_per_generation 4 = 64 completions, 8 prompt groups of 8
    "--per_device_train_batch_size", "8",
    # why: one log row for both steps, pooling the s2t/* counts of both updates' masks (one mask per optimizer
    # update)
    "--logging_steps", "2",
    "--eval_before_after", "false",
    "--save_strategy", "no",
    "--report_to", "none",
    "--disable_tqdm", "true",
    # why: the main process logs "Total train batch size (w. parallel, distributed & accumulation)" at info level
    "--log_level", "info",
]  # fmt: skip


def _accelerate_cmd(config: str, port: int) -> list[str]:
    return [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ACCELERATE_CONFIGS / config),
        # why: a shared machine; the default 29500 may belong to another job
        "--main_process_port", str(port),
    ]  # fmt: skip


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# Worker source: the names of this process's gloo threads (Linux), to see whether a process group is still alive.
GLOO_THREADS = textwrap.dedent(
    r"""
    import os

    def gloo_threads():
        names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
        return sorted(n for n in names if "gloo" in n)
    """
)


# ---------------------------------------------------------------------------------------------------------------
# The configs themselves
# ---------------------------------------------------------------------------------------------------------------


def test_accelerate_configs_are_what_they_claim():
    import yaml

    configs = {path.stem: yaml.safe_load(path.read_text()) for path in ACCELERATE_CONFIGS.glob("*.yaml")}
    assert set(configs) >= {"ddp", "zero2", "zero3", "cpu_2proc", "zero2_cpu_2proc", "zero3_cpu_2proc"}
    for name in ("ddp", "zero2", "zero3"):
        assert configs[name]["num_processes"] == 8 and configs[name]["mixed_precision"] == "bf16"
        assert configs[name]["use_cpu"] is False
    assert configs["ddp"]["distributed_type"] == "MULTI_GPU"
    assert configs["zero2"]["distributed_type"] == configs["zero3"]["distributed_type"] == "DEEPSPEED"
    assert configs["zero2"]["deepspeed_config"]["zero_stage"] == 2
    assert configs["zero3"]["deepspeed_config"]["zero_stage"] == 3
    # The CPU forms that really start two ranks (MULTI_CPU or --cpu would start one).
    for name in ("cpu_2proc", "zero2_cpu_2proc", "zero3_cpu_2proc"):
        assert configs[name]["use_cpu"] is True and configs[name]["num_processes"] == 2
        assert configs[name]["mixed_precision"] == "no"
    assert configs["cpu_2proc"]["distributed_type"] == "MULTI_GPU"
    assert (
        configs["zero2_cpu_2proc"]["distributed_type"] == configs["zero3_cpu_2proc"]["distributed_type"] == "DEEPSPEED"
    )
    assert configs["zero2_cpu_2proc"]["deepspeed_config"]["zero_stage"] == 2
    # The CPU ZeRO-3 test config takes the GPU config's ZeRO-3 path: same stage, partitioned init, 16-bit final save.
    for key in ("zero_stage", "zero3_init_flag", "zero3_save_16bit_model", "offload_param_device"):
        assert configs["zero3_cpu_2proc"]["deepspeed_config"][key] == configs["zero3"]["deepspeed_config"][key], key
    assert configs["zero3"]["deepspeed_config"]["zero3_init_flag"] is True


# ---------------------------------------------------------------------------------------------------------------
# The demo recipe on two CPU processes
# ---------------------------------------------------------------------------------------------------------------


def test_demo_recipe_trains_on_two_cpu_processes(tiny_math_model_path, tmp_path):
    out = tmp_path / "demo-2proc"
    output = run_distributed(
        lambda port: _accelerate_cmd("cpu_2proc.yaml", port) + [
            "-m", "stapo_trl.cli.train", "--config", str(DEMO_RECIPE),
            "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out), *SMALL_DEMO,
        ],
        timeout=900,
    )  # fmt: skip
    check_two_rank_demo_run(output, out)
    card = (out / "README.md").read_text()  # written by the main process only
    assert "STAPO" in card and "2602.15620" in card and "| `s2t_prob_threshold` |" in card


def test_an_input_error_under_accelerate_ends_each_process_with_status_2(tmp_path):
    """Issue 23, item 1: `python -m stapo_trl.cli.train` on every rank exits 2 on a range error (it exited 1) with one
    line; the launcher's own status is accelerate's (1, with torch's summary naming the ranks' exit codes)."""
    for _ in range(2):  # a second port when another job took the first meanwhile
        cmd = _accelerate_cmd("cpu_2proc.yaml", free_port()) + [
            "-m", "stapo_trl.cli.train", "--config", str(DEMO_RECIPE), "--output_dir", str(tmp_path / "out"),
            "--s2t_entropy_quantile", "1.5",
        ]  # fmt: skip
        result = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=600)
        output = result.stdout + result.stderr
        if not any(marker in output for marker in PORT_TAKEN):
            break
    assert result.returncode != 0, output[-3000:]
    assert "exitcode  : 2 (pid:" in output, output[-3000:]  # the root cause: a rank that exited with status 2
    assert "exitcode  : 1 (pid:" not in output, output[-3000:]
    message = (
        "stapo-train: error: --s2t_entropy_quantile: s2t_entropy_quantile=1.5 must be in [0, 1]; the paper: 0.75."
    )
    assert message in output.splitlines(), output[-3000:]
    assert not (tmp_path / "out").exists()


# stapo-train stopped by an input error on two ranks: the process group it created (with the config) must be gone
# with gloo's threads when the error ends the command, or the exit can abort (SIGABRT instead of status 2).
INPUT_ERROR_WORKER = GLOO_THREADS + textwrap.dedent(
    r"""
    import os, sys
    import torch.distributed as dist
    from stapo_trl.cli.train import main

    try:
        main(sys.argv[1:])
    except SystemExit as e:
        print(f"exit {e.code}; group: {dist.is_initialized()}; gloo threads left: {gloo_threads()}", flush=True)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread names from /proc")
@pytest.mark.parametrize(
    "argv",
    [
        ["--s2t_entropy_quantile", "1.5"],  # at config time (the group exists once the config does)
        pytest.param(["--reward_funcs", "math_acuracy"], marks=pytest.mark.slow),  # when the run is prepared
        pytest.param(["--dataset_name", "/nonexistent/train.jsonl"], marks=pytest.mark.slow),  # the data
    ],
    ids=["range", "reward-name", "dataset"],
)
def test_an_input_error_on_two_ranks_leaves_no_process_group(tmp_path, argv):
    base = ["--config", str(DEMO_RECIPE), "--output_dir", str(tmp_path / "out")]
    output = run_torchrun(INPUT_ERROR_WORKER, tmp_path / "worker.py", *base, *argv, nproc=2, timeout=300)
    assert output.count("exit 2; group: False; gloo threads left: []") == 2, output[-3000:]


@pytest.mark.slow
def test_demo_recipe_trains_with_deepspeed_zero2_on_two_cpu_processes(tiny_math_model_path, tmp_path):
    pytest.importorskip("deepspeed")
    out = tmp_path / "demo-zero2"
    # why: the first DeepSpeed launch JIT-builds a CPU communication op (~1 minute); a persistent folder caches it
    extensions = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.expanduser("~/.cache/stapo_trl/torch_extensions")
    output = run_distributed(
        lambda port: _accelerate_cmd("zero2_cpu_2proc.yaml", port) + [
            "-m", "stapo_trl.cli.train", "--config", str(DEMO_RECIPE),
            "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out), *SMALL_DEMO,
        ],
        timeout=1500,
        env=subprocess_env(TORCH_EXTENSIONS_DIR=extensions, DS_BUILD_OPS="0"),
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
        "-m", "stapo_trl.cli.train", "--config", str(DEMO_RECIPE), "--model_name_or_path", str(model),
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


@pytest.mark.slow
def test_demo_recipe_trains_and_resumes_with_deepspeed_zero3_on_two_cpu_processes(tiny_math_model_path, tmp_path):
    """ZeRO-3 (parameters partitioned, `zero3_init_flag`) on an untied LM head: the rollout batch's captured no-grad
    forward, the diagnostics, the held-out evaluation's gathered `generate`, the 16-bit model save and a resume from
    the ZeRO-3 checkpoint."""
    pytest.importorskip("deepspeed")
    import torch
    from safetensors.torch import load_file

    model = _untied_head_copy(tiny_math_model_path, tmp_path / "untied")
    out = tmp_path / "demo-zero3"
    # why: the first DeepSpeed launch JIT-builds a CPU communication op (~1 minute); a persistent folder caches it
    extensions = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.expanduser("~/.cache/stapo_trl/torch_extensions")
    env = subprocess_env(TORCH_EXTENSIONS_DIR=extensions, DS_BUILD_OPS="0")
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
    rows = [row for row in _read_jsonl(out / "metrics.jsonl") if "loss" in row]
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
    records = _read_jsonl(out / "spurious_tokens.jsonl")
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
    ddp_rows = [row for row in _read_jsonl(ddp / "metrics.jsonl") if "loss" in row]
    assert [row["step"] for row in ddp_rows] == [2, 4]
    for row, ddp_row in zip(rows, ddp_rows, strict=True):
        s2t_keys = sorted(key for key in row if key.startswith("s2t/"))
        assert s2t_keys == sorted(key for key in ddp_row if key.startswith("s2t/"))
        assert {k: row[k] for k in s2t_keys} == pytest.approx({k: ddp_row[k] for k in s2t_keys}, rel=1e-9, abs=0)
        assert row["loss"] == pytest.approx(ddp_row["loss"], rel=1e-4)
    ddp_silenced = [r for r in _read_jsonl(ddp / "spurious_tokens.jsonl") if r["kind"] == "silenced"]
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
    assert "resuming training from" in output and "checkpoint-4" in output, output[-3000:]
    assert "Resuming training from checkpoint with epoch 0 and global step 4" in output, output[-3000:]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 8
    rows = [row for row in _read_jsonl(out / "metrics.jsonl") if "loss" in row]
    assert [row["step"] for row in rows] == [2, 4, 6, 8]
    assert rows[2]["s2t/num_silenced"] > 0 and "s2t/silenced_entropy_mean" in rows[2]
    step8 = load_file(out / "checkpoint-8" / "model.safetensors")
    assert all(not torch.equal(step8[name], step4[name]) for name in step4)


@pytest.mark.slow
def test_benchmark_eval_is_refused_under_zero3_before_the_model_is_built(tiny_math_model_path, tmp_path):
    """The in-training benchmark evaluation generates on rank 0 alone, which sharded parameters cannot do: under
    ZeRO-3 `stapo-train` stops with one line naming `benchmark_eval`, before it loads any model."""
    pytest.importorskip("deepspeed")
    extensions = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.expanduser("~/.cache/stapo_trl/torch_extensions")
    env = subprocess_env(TORCH_EXTENSIONS_DIR=extensions, DS_BUILD_OPS="0")
    for _ in range(2):  # a second port when another job took the first meanwhile
        cmd = _small_demo_cmd(
            "zero3_cpu_2proc.yaml", free_port(), Path(tiny_math_model_path), tmp_path / "refused",
            "--max_steps", "4", "--benchmark_eval", "tiny-math",
        )  # fmt: skip
        result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        output = result.stdout + result.stderr
        if not any(marker in output for marker in PORT_TAKEN):
            break
    assert result.returncode != 0, output[-3000:]
    message = (
        "stapo-train: error: benchmark_eval='tiny-math' cannot run under DeepSpeed ZeRO-3: its in-training evaluation "
        "generates on rank 0 alone, and sharded parameters need every rank in generate. Unset benchmark_eval and "
        "evaluate the saved checkpoints with stapo-eval (or train under ZeRO-2 / DDP)."
    )
    # One line per rank that got to print before the launcher stopped the other; no model was loaded.
    assert message in output, output[-3000:]
    assert "Detected DeepSpeed ZeRO-3" not in output, output[-3000:]


# A product trainer trained on two ranks (DDP), then `trainer.end()`: afterwards no function default may hold the
# default process group, destroy_process_group() must have stopped gloo's threads (they used to survive, held by a
# function default or by the DDP wrapper, and abort ~1 exit in 15; see stapo_trl/integrations/process_group.py), and the model
# must still generate on each process.
GROUP_RELEASE_WORKER = GLOO_THREADS + textwrap.dedent(
    r"""
    import gc, os, sys, types
    import torch
    import torch.distributed as dist
    from datasets import Dataset
    from stapo_trl import STAPOConfig, STAPOTrainer
    from stapo_trl.trainer import GRPOBaselineTrainer

    model_path, out, which = sys.argv[1:4]
    args = STAPOConfig(output_dir=out, use_cpu=True, bf16=False, report_to="none", max_completion_length=8,
                       per_device_train_batch_size=4, num_generations=4, max_steps=1, save_strategy="no",
                       beta=0.04 if which == "grpo" else 0.0)  # with beta, GRPOTrainer prepares a reference model
    trainer_class = GRPOBaselineTrainer if which == "grpo" else STAPOTrainer
    trainer = trainer_class(model=model_path, reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
                            args=args, train_dataset=Dataset.from_dict({"prompt": ["1+1="] * 16}))
    trainer.train()
    print("wrapper during training:", type(trainer.model_wrapped).__name__, flush=True)
    group = dist.distributed_c10d._get_default_group()
    holders = [f"{f.__module__}.{f.__qualname__}" for f in gc.get_objects() if isinstance(f, types.FunctionType)
               and any(d is group for d in (f.__defaults__ or ()) + tuple((f.__kwdefaults__ or {}).values()))]
    print("functions holding the group in a default:", holders, flush=True)
    assert gloo_threads(), "no gloo threads while the group exists: the check below would prove nothing"
    del group
    trainer.end()
    print("gloo threads after trainer.end():", gloo_threads(), flush=True)
    ids = trainer.processing_class("1+1=", return_tensors="pt").input_ids
    with torch.no_grad():
        print("generated after end:", trainer.model.generate(ids, max_new_tokens=2, do_sample=False).shape[1] - ids.shape[1], flush=True)
    """
)


def _check_group_released(output: str) -> None:
    assert "wrapper during training: DistributedDataParallel" in output, output[-3000:]
    assert output.count("functions holding the group in a default: []") == 2, output[-3000:]
    assert output.count("gloo threads after trainer.end(): []") == 2, output[-3000:]
    assert output.count("generated after end: 2") == 2, output[-3000:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread names from /proc")
@pytest.mark.parametrize("which", ["stapo", pytest.param("grpo", marks=pytest.mark.slow)])
def test_trainer_end_after_two_rank_training_releases_gloo(tiny_random_model_path, tmp_path, which):
    script = tmp_path / "group_release_worker.py"
    output = run_torchrun(GROUP_RELEASE_WORKER, script, tiny_random_model_path, str(tmp_path), which, nproc=2)
    _check_group_released(output)


# `stapo-train`'s run, in process on two ranks: the process group it ends must be released too.
CLI_GROUP_RELEASE_WORKER = GLOO_THREADS + textwrap.dedent(
    r"""
    import os, sys
    from stapo_trl.cli.args import parse_args
    from stapo_trl.cli.run import train

    train(*parse_args(sys.argv[1:]))
    print("gloo threads after stapo-train:", gloo_threads(), flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread names from /proc")
def test_stapo_train_on_two_ranks_releases_gloo(tiny_math_model_path, tmp_path):
    out = tmp_path / "run"
    argv = ["--config", str(DEMO_RECIPE), "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out)]
    output = run_torchrun(CLI_GROUP_RELEASE_WORKER, tmp_path / "cli_worker.py", *argv, *SMALL_DEMO, nproc=2)
    assert output.count("gloo threads after stapo-train: []") == 2, output[-3000:]
    assert (out / "model.safetensors").exists()


# ---------------------------------------------------------------------------------------------------------------
# Diagnostics on two ranks: metrics all-reduce and token-record gather in a real training run
# ---------------------------------------------------------------------------------------------------------------

DIAGNOSTICS_WORKER = textwrap.dedent(
    r"""
    import json, os, sys, warnings
    from datasets import Dataset
    from stapo_trl import STAPOConfig, STAPOTrainer
    from stapo_trl.runfiles.callbacks import SpuriousTokenLogger

    def length_reward(completions, **kwargs):
        return [float(len(c[0]["content"] if isinstance(c, list) else c) % 4) for c in completions]

    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i % 7}"}]} for i in range(64)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = STAPOConfig(
            output_dir=sys.argv[2], use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=4,
            num_generations=4, max_completion_length=8, max_steps=4, logging_steps=1, save_strategy="no", seed=0,
            s2t_prob_threshold=0.05, steps_per_generation=2,
        )
        trainer = STAPOTrainer(sys.argv[1], reward_funcs=length_reward, args=args, train_dataset=prompts)
    trainer.add_callback(SpuriousTokenLogger(trainer, max_silenced=1000, max_kept_candidates=1000, max_reference=0))
    trainer.train()
    logged = [{k: v for k, v in h.items() if k.startswith("s2t/")} for h in trainer.state.log_history if "loss" in h]
    with open(os.path.join(sys.argv[2], f"rank{trainer.accelerator.process_index}.json"), "w") as f:
        json.dump(logged, f)
    trainer.end()
    """
)


@pytest.mark.slow
def test_two_processes_gather_records_from_both_and_agree_on_metrics(tiny_random_model_path, tmp_path):
    """Every rank takes part in every collective (metrics all-reduce, records gather): no hang, one file."""
    out = tmp_path / "out"
    out.mkdir()
    run_torchrun(DIAGNOSTICS_WORKER, tmp_path / "run.py", tiny_random_model_path, str(out), nproc=2)
    rank0, rank1 = (json.loads((out / f"rank{i}.json").read_text()) for i in range(2))
    assert rank0 == rank1  # reduced metrics are the same on every process
    records = read_token_records(out)
    # Scope optimizer_step, GA 1: one mask per step; each logged once with the silenced tokens of both processes.
    for entry, step in zip(rank0, [1, 2, 3, 4], strict=True):
        silenced = [r for r in records if r["step"] == step and r["silenced"]]
        assert len(silenced) == entry["s2t/num_silenced"]
    assert {r["process_index"] for r in records} == {0, 1}
    assert {r["step"] for r in records} <= {1, 2, 3, 4} and sum(e["s2t/num_silenced"] for e in rank0) > 0


# ---------------------------------------------------------------------------------------------------------------
# The paper's geometry on two ranks: tau_h per optimizer update over both ranks' rows, and the
# like-for-like baseline (a threshold that never fires = s2t_mode off, step by step)
# ---------------------------------------------------------------------------------------------------------------

PAPER_GEOMETRY_WORKER = textwrap.dedent(
    r"""
    import json, os, sys, warnings
    import torch
    from datasets import Dataset
    from stapo_trl import STAPOConfig, STAPOTrainer

    def length_reward(completions, **kwargs):
        return [float(len(c[0]["content"] if isinstance(c, list) else c) % 4) for c in completions]

    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i % 7}"}]} for i in range(64)])
    model_path, out = sys.argv[1], sys.argv[2]
    result = {}
    # steps_per_generation = 4 x GA: one rollout batch feeds 4 optimizer updates of GA 2 micro-batches each.
    for name, s2t in [("off", {"s2t_mode": "off"}), ("never", {"s2t_prob_threshold": 1e-30}),
                      ("stapo", {"s2t_prob_threshold": 0.05})]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = STAPOConfig(
                output_dir=os.path.join(out, name), use_cpu=True, bf16=False, report_to=[], logging_steps=1,
                per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=4,
                gradient_accumulation_steps=2, steps_per_generation=8, learning_rate=1e-2, save_strategy="no",
                seed=0, **s2t,
            )
            trainer = STAPOTrainer(model_path, reward_funcs=length_reward, args=args, train_dataset=prompts)
        updates = []
        original = trainer._compute_s2t_mask

        def record(logps, entropies, advantages, loss_mask, completion_ids, original=original, updates=updates):
            built = original(logps, entropies, advantages, loss_mask, completion_ids)
            updates.append({"tau": built.entropy_threshold if built.num_candidates else None,
                            "local": entropies[built.candidate].double().tolist(),
                            "silenced": int(built.silenced.sum())})
            return built

        trainer._compute_s2t_mask = record
        trainer.train()
        rows = [{k: v for k, v in h.items() if isinstance(v, float)} for h in trainer.state.log_history if "loss" in h]
        params = [float(p.double().sum()) for p in trainer.model.parameters()]
        result[name] = {"rows": rows, "params": params, "updates": updates}
    with open(os.path.join(out, f"rank{trainer.accelerator.process_index}.json"), "w") as f:
        json.dump(result, f)
    trainer.end()
    """
)


def test_paper_geometry_on_two_ranks_tau_h_per_update_and_like_for_like_baseline(tiny_random_model_path, tmp_path):
    import numpy as np

    out = tmp_path / "out"
    out.mkdir()
    run_torchrun(PAPER_GEOMETRY_WORKER, tmp_path / "run.py", tiny_random_model_path, str(out), nproc=2)
    ranks = [json.loads((out / f"rank{i}.json").read_text()) for i in range(2)]
    # The baseline and its never-firing twin: the same losses, gradient norms, TRL metrics and weights, step by step.
    for seen in ranks:
        off, never = seen["off"], seen["never"]
        assert len(off["rows"]) == len(never["rows"]) == 4
        for row_off, row_never in zip(off["rows"], never["rows"], strict=True):
            shared = {
                k for k in row_off if not k.startswith("s2t/") or k in ("s2t/num_loss_tokens", "s2t/num_silenced")
            }
            shared -= {"step_time", "epoch"}  # wall-clock, not the objective
            assert {"loss", "grad_norm", "entropy", "clip_ratio/region_mean"} <= shared
            for key in shared:  # every TRL metric of the row (reward only on rows that generated)
                assert row_never[key] == pytest.approx(row_off[key], rel=1e-5, abs=1e-7), key
            assert row_never["s2t/num_silenced"] == row_off["s2t/num_silenced"] == 0
        assert never["params"] == pytest.approx(off["params"], rel=1e-6, abs=1e-6)
    # STAPO: one mask per optimizer update; tau_h = the 0.75-quantile of the union of both ranks' candidates of that
    # update (numpy's linear interpolation as the independent reference), identical on both ranks.
    stapo = [seen["stapo"]["updates"] for seen in ranks]
    assert len(stapo[0]) == len(stapo[1]) == 4
    assert sum(update["silenced"] for rank in stapo for update in rank) > 0
    for update_0, update_1 in zip(*stapo, strict=True):
        union = update_0["local"] + update_1["local"]
        assert update_0["tau"] == update_1["tau"]
        if union:
            assert update_0["tau"] == pytest.approx(float(np.quantile(np.array(union), 0.75)), abs=1e-12)


@pytest.mark.slow
def test_ctrl_c_on_two_processes_saves_one_checkpoint_on_every_rank_and_resumes(tiny_math_model_path, tmp_path):
    """Ctrl-C in a terminal signals the launcher's process group; torch's launcher forwards SIGINT to each worker
    (they run in their own sessions) and kills them after TORCH_ELASTIC_SHUTDOWN_TIMEOUT. The workers agree on the
    step through the all-reduced flag, save one checkpoint together (both ranks' RNG states), and the main process
    prints one message with the launch-aware resume command; rerunning the same launch line finishes the run."""
    out = tmp_path / "run"
    train_args = [
        "-m", "stapo_trl.cli.train", "--config", str(DEMO_RECIPE), "--model_name_or_path", tiny_math_model_path,
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
            losses += line.startswith("{'loss'")
            if losses == 2:
                break
        assert losses == 2, "".join(lines)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does: the launcher's process group
        output = "".join(lines) + proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    interrupted = [line for line in output.splitlines() if line.startswith("Interrupted at step")]
    assert len(interrupted) == 1, output[-5000:]  # one message per run, from the main process
    step = int(interrupted[0].split()[3].rstrip(":"))
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
    assert f"resuming training from {checkpoint}" in resumed, resumed[-3000:]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == step + 2
    assert (out / "model.safetensors").exists()
