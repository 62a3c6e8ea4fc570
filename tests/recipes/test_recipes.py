"""The recipes and scripts/launch.sh: each recipe passes its dry run for the process count it is laid out for."""

import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from testing_utils import GRPO_RECIPE, RECIPES_DIR, REPO, STAPO_RECIPE, run_card_quick_start
from trl import ModelConfig, get_peft_config

from stapo_trl import STAPOConfig, STAPOTrainer
from stapo_trl.cli.args import parse_args
from stapo_trl.cli.dry_run import dry_run_recipe, read_launch_settings
from stapo_trl.cli.run import prepare, torch_threads
from stapo_trl.cli.script_args import STAPOScriptArguments
from stapo_trl.data import INSTRUCTION


RECIPES = sorted(p for p in RECIPES_DIR.rglob("*.yaml") if "accelerate_configs" not in p.parts)
QWEN3_MODELS = ("Qwen3-1.7B", "Qwen3-8B", "Qwen3-14B")
METHODS = ("stapo", "grpo", "entropy20", "justrl")
# Recipes whose model is a real built-in, with the wheel it is converted from: `real_model`-marked.
REAL_MODEL_RECIPES = {"SmolLM2-135M/stapo.yaml": "smollm2-135m", "SmolLM2-135M/grpo.yaml": "smollm2-135m"}
# Recipes without a `# launch:` line: CPU demos, laid out for one process.
WITHOUT_LAUNCH_LINE = {"demo/stapo.yaml", "demo/grpo.yaml", *REAL_MODEL_RECIPES}


def _rel(path: Path) -> str:
    return str(path.relative_to(RECIPES_DIR))


@pytest.mark.parametrize("recipe", [
    pytest.param(p, id=_rel(p), marks=[pytest.mark.real_model(w) for w in [REAL_MODEL_RECIPES.get(_rel(p))] if w])
    for p in RECIPES
])  # fmt: skip
def test_recipe_passes_its_dry_run(recipe):
    launch = read_launch_settings(str(recipe))
    assert "num_processes" in launch or _rel(recipe) in WITHOUT_LAUNCH_LINE, f"{recipe}: no `# launch:` line"
    fast = ["--max_train_samples", "64"] * ("demo" in recipe.parts)  # why: the whole task's 7,800 prompts take ~1.5 s
    report = dry_run_recipe(["--config", str(recipe), *fast], int(launch.get("num_processes", 1)))
    assert report.ok, report.summary()
    assert report.generation_batch_size % report.num_generations == 0


# The batch table of recipes/README.md: (model, training processes, gradient_accumulation_steps to set or 0).
README_BATCH_TABLE = [("Qwen3-1.7B", 4, 0), ("Qwen3-1.7B", 8, 32), ("Qwen3-1.7B", 16, 16), ("Qwen3-8B", 4, 128),
                      ("Qwen3-8B", 8, 0), ("Qwen3-8B", 16, 32), ("Qwen3-14B", 8, 0), ("Qwen3-14B", 16, 32),
                      ("Qwen3-14B", 32, 16)]  # fmt: skip


@pytest.mark.parametrize("model, num_processes, accumulation", README_BATCH_TABLE)
def test_readme_batch_table_keeps_the_paper_geometry(model, num_processes, accumulation):
    overrides = ["--gradient_accumulation_steps", str(accumulation), "--steps_per_generation", str(4 * accumulation)]
    recipe = RECIPES_DIR / model / "stapo.yaml"
    report = dry_run_recipe(["--config", str(recipe), *overrides * bool(accumulation)], num_processes)
    assert report.ok, report.summary()
    geometry = ("generation_batch_size", "prompts_per_rollout_step", "completions_per_optimizer_step",
                "prompts_per_optimizer_step", "optimizer_steps_per_rollout_step")  # fmt: skip
    assert [getattr(report, name) for name in geometry] == [2048, 256, 512, 64, 4]
    assert not [w for w in report.warnings if "batch geometry" in w], report.warnings
    row = f"| {num_processes} | {report.per_device_train_batch_size} | {report.gradient_accumulation_steps} | "
    assert f"{row}{report.steps_per_generation} |" in (RECIPES_DIR / "README.md").read_text(), f"{row}: {recipe}"


def test_the_recipe_tree_is_complete_and_qwen3_launch_lines_match_their_arithmetic():
    names = {_rel(p) for p in RECIPES}
    assert {"demo/stapo.yaml", "demo/grpo.yaml", "demo/stapo_lora.yaml", *REAL_MODEL_RECIPES} <= names
    assert {f"{model}/{method}.yaml" for model in QWEN3_MODELS for method in METHODS} <= names
    for path in (RECIPES_DIR / model / f"{method}.yaml" for model in QWEN3_MODELS for method in METHODS):
        launch, text = read_launch_settings(str(path)), path.read_text()
        raw, n = yaml.safe_load(text), int(launch["num_processes"])
        assert raw["activation_checkpointing"] is True and "gradient_checkpointing" not in raw
        assert (RECIPES_DIR / "accelerate_configs" / f"{launch['accelerate_config']}.yaml").is_file()
        assert launch["accelerate_config"] in ("zero2", "zero3", "ddp")
        assert raw["per_device_train_batch_size"] * n * raw["gradient_accumulation_steps"] == 512, path
        assert raw["per_device_train_batch_size"] * n * raw["steps_per_generation"] == 2048, path
        assert f"gradient_accumulation_steps {raw['gradient_accumulation_steps']}" in text
        assert f"steps_per_generation {raw['steps_per_generation']}" in text


def test_qwen3_1p7b_stapo_recipe_has_the_paper_values_and_warns_at_another_geometry():
    with warnings.catch_warnings():  # activation_checkpointing, transformers 5's name: no deprecation
        warnings.simplefilter("error", FutureWarning)
        script, args, model = parse_args(["--config", str(RECIPES_DIR / "Qwen3-1.7B/stapo.yaml"), "--use_cpu", "true"])
    assert isinstance(args, STAPOConfig) and not model.use_peft
    assert INSTRUCTION == "Please reason step by step, and put your final answer within \\boxed{}."
    expected = {"trainer": "stapo", "dataset_name": "open-r1/DAPO-Math-17k-Processed", "prompt_column": "prompt",
                "solution_column": "solution", "instruction": INSTRUCTION, "max_prompt_tokens": 1024,
                "strip_dapo_instruction": True, "reward_funcs": ["math_accuracy"]}  # fmt: skip
    assert {k: getattr(script, k) for k in expected} == expected
    assert (model.model_name_or_path, model.dtype) == ("Qwen/Qwen3-1.7B-Base", "bfloat16")
    # Warm-up: 10 rollout steps = 40 updates (veRL steps its scheduler once per rollout step, TRL once per update).
    assert args.optim.value.startswith("adamw") and args.lr_scheduler_type.value == "constant_with_warmup"
    assert args.save_strategy.value == "steps" and args.save_steps > 0 and args.save_total_limit
    assert args.bf16 and getattr(args, "activation_checkpointing", args.gradient_checkpointing)  # transformers < 5.24
    expected = {"num_generations": 8, "num_iterations": 1, "learning_rate": 1e-6, "warmup_steps": 40,
                "weight_decay": 0.1, "max_grad_norm": 1.0, "loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28,
                "beta": 0.0, "entropy_coef": 0.0, "top_entropy_quantile": 1.0, "temperature": 1.0, "top_p": 1.0,
                "top_k": 0, "max_completion_length": 15360, "use_vllm": True, "vllm_mode": "server",
                "vllm_server_host": "127.0.0.1", "s2t_prob_threshold": 0.002, "s2t_entropy_quantile": 0.75,
                "s2t_mode": "low_entropy", "report_to": ["wandb"], "push_to_hub": False}  # fmt: skip
    assert {k: getattr(args, k) for k in expected} == expected
    report = dry_run_recipe(["--config", str(RECIPES_DIR / "Qwen3-1.7B/stapo.yaml")], 8)  # laid out for 4, run on 8
    assert report.ok and any("512 prompts x 8 rollouts" in w and "128-prompt updates" in w for w in report.warnings)


S2T_KEYS = {"output_dir", "s2t_prob_threshold", "s2t_entropy_quantile", "s2t_mode"}
PER_MODEL_KEYS = {"model_name_or_path", "output_dir", "run_name", "per_device_train_batch_size",
                  "gradient_accumulation_steps", "steps_per_generation", "save_total_limit"}  # fmt: skip
PEFT = {"use_peft": True, "lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.0,
        "lora_target_modules": [f"{n}_proj" for n in ("q", "k", "v", "o", "gate", "up", "down")]}  # fmt: skip
# (recipe, its twin, the keys they may differ in): each method against justrl.yaml (STAPO without the mask), ...
TWINS = [(f"{model}/justrl.yaml", f"{model}/{method}.yaml", {"output_dir", "run_name", *keys})
         for model in QWEN3_MODELS
         for method, keys in [("stapo", S2T_KEYS), ("entropy20", {"top_entropy_quantile"}),
                              ("grpo", {"loss_type", "epsilon_high"})]]  # fmt: skip
TWINS += [(f"{folder}/stapo.yaml", f"{folder}/grpo.yaml", S2T_KEYS) for folder in ("demo", "SmolLM2-135M")]
TWINS += [(f"Qwen3-1.7B/{m}.yaml", f"{model}/{m}.yaml", PER_MODEL_KEYS) for m in METHODS for model in QWEN3_MODELS[1:]]
TWINS += [("demo/stapo.yaml", "demo/stapo_lora.yaml", {"output_dir", *PEFT})]
# What makes each arm what it is: each runs STAPOTrainer (the same per-update normalizer); baselines silence nothing.
VALUES = {f"{model}/justrl.yaml": {"trainer": "stapo", "s2t_mode": "off"} for model in QWEN3_MODELS}
VALUES |= {f"{model}/entropy20.yaml": {"top_entropy_quantile": 0.2} for model in QWEN3_MODELS}
VALUES |= {
    f"{m}/grpo.yaml": {"loss_type": "grpo", "epsilon": 0.2, "epsilon_high": 0.2, "beta": 0.0} for m in QWEN3_MODELS
}
VALUES |= {f"{folder}/grpo.yaml": {"trainer": "stapo", "s2t_mode": "off"} for folder in ("demo", "SmolLM2-135M")}
VALUES |= {f"{folder}/stapo.yaml": {"s2t_mode": "low_entropy"} for folder in ("demo", "SmolLM2-135M")}
VALUES |= {"demo/stapo_lora.yaml": PEFT}


def test_recipe_twins_differ_only_where_they_should():
    for recipe, twin, allowed in TWINS:
        raw = {path: yaml.safe_load((RECIPES_DIR / path).read_text()) for path in (recipe, twin)}
        differing = {k for k in set(raw[recipe]) | set(raw[twin]) if raw[recipe].get(k) != raw[twin].get(k)}
        assert "output_dir" in differing and differing <= allowed, (recipe, twin, differing - allowed)
        for path, values in raw.items():
            assert {key: values.get(key) for key in VALUES.get(path, {})} == VALUES.get(path, {}), path
            if path.startswith("Qwen3"):
                assert values["model_name_or_path"] == f"Qwen/{path.split('/')[0]}-Base", path


Q17, EIGHT, FOUR = "recipes/Qwen3-1.7B/stapo.yaml", ["--gpus", "0,1,2,3,4,5,6,7"], ["--gpus", "0,1,2,3"]
LAUNCH_CASES = {  # scripts/launch.sh ARGS -> (exit status, lines it printed: on stdout for 0, else on stderr)
    "split": ([Q17, *EIGHT, "--print-only"], 0, [
        "CUDA_VISIBLE_DEVICES=0,1,2,3 trl vllm-serve --model Qwen/Qwen3-1.7B-Base --host 127.0.0.1",
        "--tensor_parallel_size 4", "--max_model_len 16384", "CUDA_VISIBLE_DEVICES=4,5,6,7 accelerate launch",
        "accelerate_configs/zero2.yaml --num_processes 4", "--vllm_server_host 127.0.0.1 --vllm_server_port 8000"]),
    "overlap": ([Q17, *FOUR, "--vllm-gpus", "0,1", "--train-gpus", "1,2", "--print-only"], 2, ["GPU 1 is in both"]),
    "missing": ([Q17, *FOUR, "--vllm-gpus", "0", "--train-gpus", "1,7", "--print-only"], 2,
                ["GPU 7 is not among the visible GPUs"]),
    "too-few": (["recipes/Qwen3-8B/stapo.yaml", *EIGHT, "--print-only"], 2, ["slurm/train.slurm"]),
    # the split's dry run first: 7 generations do not divide 3 processes' 1536 completions; it names the 4 laid out
    "arithmetic": ([Q17, *FOUR, "--vllm-gpus", "0", "--train-gpus", "1,2,3", "--print-only", "--", "--num_generations",
                    "7"], 2, ["nothing was started", "laid out for 4"]),
    "server-dies": ([Q17, *EIGHT, "--log-dir", "TMP"], 3,
                    ["exited before answering /health", "CUDA out of memory (stub)"]),
}  # fmt: skip


@pytest.mark.slow  # bash, and the dry run in a new Python process (~6 s)
@pytest.mark.parametrize("case", LAUNCH_CASES)
def test_launch_splits_the_gpus_from_the_recipe_or_refuses(tmp_path, case):
    args, status, printed = LAUNCH_CASES[case]
    env = dict(os.environ, PYTHON=sys.executable, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if case == "server-dies":
        dead = tmp_path / "dead_trl"
        dead.write_text("#!/usr/bin/env bash\necho 'CUDA out of memory (stub)'\nexit 1\n")
        dead.chmod(0o755)
        env |= {"TRL_BIN": str(dead), "ACCELERATE_BIN": "false", "HEALTH_INTERVAL": "0.5"}
    args = [str(tmp_path) if arg == "TMP" else arg for arg in args]
    result = subprocess.run(["bash", str(REPO / "scripts" / "launch.sh"), *args], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == status, result.stdout + result.stderr
    assert all(line in (result.stderr if status else result.stdout) for line in printed), result.stdout + result.stderr


def test_lora_demo_recipe_trains_only_the_adapter(tiny_math_model_path, tmp_path):
    out = tmp_path / "lora"  # 2 steps train on one rollout batch of 64 completions (non-zero advantages)
    script, args, model_args = parse_args([
        "--config", str(RECIPES_DIR / "demo" / "stapo_lora.yaml"), "--model_name_or_path", tiny_math_model_path,
        "--output_dir", str(out), "--max_steps", "2", "--save_strategy", "no", "--eval_before_after", "false",
        "--report_to", "none", "--disable_tqdm", "true", "--max_train_samples", "64"])  # fmt: skip
    run = prepare(script, args, model_args)
    args.model_init_kwargs = {"dtype": model_args.dtype}
    trainer = STAPOTrainer(model=run.model_path, reward_funcs=run.reward_funcs, args=args,
                           train_dataset=run.train_dataset, peft_config=get_peft_config(model_args))  # fmt: skip
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainable = {name for name, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable), sorted(trainable)[:5]
    with torch_threads(script.torch_num_threads):
        trainer.train()
    changed = {name for name, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[name])}
    assert changed <= trainable, sorted(changed - trainable)[:5]  # the base weights never move
    assert any("lora_B" in name for name in changed)  # lora_B starts at zero: the adapter learned something
    assert any(key.startswith("s2t/") for entry in trainer.state.log_history for key in entry)
    trainer.save_model(str(out))
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(out))
    assert not (out / "model.safetensors").exists()
    assert math.isfinite(trainer.state.log_history[-1].get("train_loss", 0.0))
    # The card's quick start runs as printed: it loads the adapter onto its base (TRL's pipeline(model=folder) fails).
    trainer.create_model_card(model_name="lora")
    run_card_quick_start(out / "README.md", expect="AutoPeftModelForCausalLM")


def test_demo_recipes_parse_into_the_right_classes():
    script, a, model_args = parse_args(["--config", STAPO_RECIPE])
    assert isinstance(script, STAPOScriptArguments) and isinstance(model_args, ModelConfig)
    assert type(a) is STAPOConfig and model_args.model_name_or_path == "builtin:tiny-math"
    assert (script.trainer, script.reward_funcs, script.eval_before_after) == ("stapo", ["math_accuracy"], True)
    # ENVIRONMENT.md's measured tiny-model RL settings (lr 1e-4: 3e-4 breaks the current builtin's arithmetic).
    expected = {"learning_rate": 1e-4, "lr_scheduler_type": "constant", "per_device_train_batch_size": 16,
                "num_generations": 8, "steps_per_generation": 4, "generation_batch_size": 64, "loss_type": "dapo",
                "epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0, "temperature": 1.0, "use_cpu": True, "bf16": False,
                "report_to": [], "s2t_prob_threshold": 0.002, "s2t_entropy_quantile": 0.75}  # fmt: skip
    assert {k: getattr(a, k) for k in expected} == expected
    grpo_args = parse_args(["--config", GRPO_RECIPE])[1]  # the like-for-like baseline: the mask off, nothing else
    differing = {k for k, v in grpo_args.to_dict().items() if v != a.to_dict()[k]}
    assert differing <= {"output_dir", "run_name", "hub_model_id", "s2t_mode"}, differing


def test_accelerate_configs_are_what_they_claim():
    configs = {p.stem: yaml.safe_load(p.read_text()) for p in (RECIPES_DIR / "accelerate_configs").glob("*.yaml")}
    # (processes, precision, use_cpu, type, ZeRO stage); the CPU forms really start two ranks (MULTI_CPU would not).
    expected = {"ddp": (8, "bf16", False, "MULTI_GPU", None), "cpu_2proc": (2, "no", True, "MULTI_GPU", None)}
    expected |= {f"zero{n}": (8, "bf16", False, "DEEPSPEED", n) for n in (2, 3)}
    expected |= {f"zero{n}_cpu_2proc": (2, "no", True, "DEEPSPEED", n) for n in (2, 3)}
    for name, want in expected.items():
        c = configs[name]
        stage = c.get("deepspeed_config", {}).get("zero_stage")
        assert (c["num_processes"], c["mixed_precision"], c["use_cpu"], c["distributed_type"], stage) == want, name
    for key in ("zero_stage", "zero3_init_flag", "zero3_save_16bit_model", "offload_param_device"):
        assert configs["zero3_cpu_2proc"]["deepspeed_config"][key] == configs["zero3"]["deepspeed_config"][key], key
    assert configs["zero3"]["deepspeed_config"]["zero3_init_flag"] is True
