"""Built-in models addressed by reserved `builtin:` names, built offline and cached.

`builtin:tiny-math` is a 144k-parameter [`~transformers.Qwen3ForCausalLM`] with a 329-token byte-level BPE
tokenizer, warmed up with TRL's [`~trl.SFTTrainer`] on the built-in tiny-math task (see `stapo_trl.data`), so that
it solves roughly 45 % of held-out problems when sampled at temperature 1.0: a starting point on which GRPO and STAPO
have something to learn, built in about 30 s on two CPU cores and without any download. `builtin:tiny-random` is the
same tokenizer and architecture with random weights (no warm-up), for fast tests.

```python
from stapo_trl.builtin import resolve_model_path

model_path = resolve_model_path("builtin:tiny-math")  # builds once, then reads the cache
trainer = STAPOTrainer(model=model_path, ...)
```

The directory holds a standard transformers checkpoint (it reloads with `AutoModelForCausalLM` and `AutoTokenizer`
under `HF_HUB_OFFLINE=1`) plus `stapo_builtin.json`, which records the build settings, the library versions and the
measured held-out accuracy.

Deviations from an LLM worth knowing: the vocabulary is tiny, so hard-target SFT would make the model far more
peaked than a 150k-token LLM and the paper's tau_p = 0.002 would find almost no candidate; the warm-up therefore uses
label smoothing (0.02), which leaves an LLM-like low-probability tail.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from filelock import FileLock

from .grading import extract_boxed_answer


logger = logging.getLogger(__name__)

BUILTIN_PREFIX = "builtin:"

# The single source of truth for `builtin:` model names. Bump a `version` whenever its recipe (tokenizer, model,
# data or warm-up) changes: the cache folder is `<name>-<version>`, so old builds are never reused by mistake.
BUILTIN_MODELS: dict[str, dict[str, Any]] = {
    "tiny-math": {
        "version": "v2",
        "description": "tiny Qwen3 (144k parameters) SFT-warmed on two-digit addition to ~45 % sampled accuracy",
        # Sampled accuracy (T = 1.0) jumps from ~5 % to ~45 % between steps 150 and 300, then plateaus near 50 %
        # (label smoothing caps it; greedy accuracy is ~100 % by then). 320 steps: just onto the plateau.
        "sft_steps": 320,
    },
    "tiny-random": {
        "version": "v2",
        "description": "the tiny-math tokenizer and architecture with random weights (no warm-up), for fast tests",
        "sft_steps": 0,
    },
    # vLLM's CPU attention refuses head_dim 16 ("Unsupported CPU attention configuration"): the same recipe with
    # wider heads, for the vLLM paths (`stapo-eval --backend vllm`, vLLM rollouts). `model_config` overrides
    # `MODEL_CONFIG`; `tiny-math` itself keeps its shape, so the demo's calibration and figures stay valid.
    "tiny-math-h64": {
        "version": "v1",
        "description": "tiny-math with head_dim 64 (vLLM's CPU attention needs head_dim >= 32), SFT-warmed likewise",
        "sft_steps": 320,
        "model_config": {"head_dim": 64},
    },
}

CACHE_ENV_VAR = "STAPO_TRL_CACHE"
DEFAULT_CACHE_DIR = "~/.cache/stapo_trl"
INFO_FILE = "stapo_builtin.json"

# Everything that defines the build besides the per-name settings above (recorded in `stapo_builtin.json`).
SEED = 0
# An upper bound: BPE stops once every word of the task is a single token, at 329 tokens (256 bytes, 3 special
# tokens, 70 merges); digits never merge, so `85` is always `8`, `5`.
TOKENIZER_VOCAB_SIZE = 400
PAD_TOKEN, CHAT_START_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# ChatML, as Qwen uses; `{% generation %}` marks assistant text so `assistant_only_loss=True` also works.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# hidden 64 / 2 layers / 4 query heads (2 key-value heads) / MLP 256 / tied embeddings: 144k parameters.
MODEL_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}
SFT_CONFIG: dict[str, Any] = {
    "per_device_train_batch_size": 32,
    # A high rate suits a 144k-parameter model; measured on 2 CPU threads, 3e-3 needs ~450 steps to the same point.
    "learning_rate": 6e-3,
    "lr_scheduler_type": "linear",
    "warmup_steps": 20,
    # An LLM-like low-probability tail, so the paper's tau_p = 0.002 finds candidates (see the module docstring).
    "label_smoothing_factor": 0.02,
}
# Held-out accuracy check after the build: the whole tiny-math test split, sampled like the RL rollouts.
EVAL_TEMPERATURE = 1.0
EVAL_MAX_NEW_TOKENS = 48

# Variables through which torchrun / accelerate launch make a process part of a distributed job.
_LAUNCHER_ENV_PREFIXES = ("ACCELERATE_", "TORCHELASTIC_", "FSDP_", "PET_")
_LAUNCHER_ENV_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def default_cache_dir() -> Path:
    """Cache root: `$STAPO_TRL_CACHE` if set, else `~/.cache/stapo_trl`."""
    return Path(os.environ.get(CACHE_ENV_VAR) or DEFAULT_CACHE_DIR).expanduser()


def builtin_model_dir(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where `builtin:<name>` is (or will be) cached: `<cache_dir>/<name>-<version>` (`name` with or without the
    `builtin:` prefix; `cache_dir=None` means [`default_cache_dir`])."""
    name = _check_builtin_name(name)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / f"{name}-{BUILTIN_MODELS[name]['version']}"


def _check_builtin_name(name: str) -> str:
    """`name` without the `builtin:` prefix; a ValueError listing the known names if it is not one."""
    bare = name.removeprefix(BUILTIN_PREFIX)
    if bare not in BUILTIN_MODELS:
        known = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
        raise ValueError(f"Unknown built-in model {BUILTIN_PREFIX + bare!r}. Known built-in models: {known}.")
    return bare


def resolve_model_path(name_or_path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None) -> str:
    """Turn a model argument into something `from_pretrained` can load, building `builtin:` models on first use.

    - `builtin:<name>`: built into the cache on first use (under a file lock, so the processes of an
      `accelerate launch` / `torchrun` job build it once), then read from it; returns the local directory.
    - An existing local directory: returned unchanged (`~` expanded).
    - A path that looks local (`./x`, `../x`, `/x`, `~/x`) but does not exist: `FileNotFoundError`.
    - Anything else (a Hub id such as `Qwen/Qwen3-1.7B-Base`): returned unchanged for transformers to load.

    Args:
        name_or_path (`str` or `os.PathLike`):
            `builtin:<name>`, a local model directory or a Hub id.
        cache_dir (`str`, `os.PathLike` or `None`, *optional*, defaults to `None`):
            Cache root for built-in models; `None` means `$STAPO_TRL_CACHE`, else `~/.cache/stapo_trl`.

    Returns:
        `str`: A local directory path, or the Hub id unchanged.

    Raises:
        ValueError: If a `builtin:` name is unknown (the message lists the known names).
        FileNotFoundError: If a local-looking path does not exist.
        NotADirectoryError: If the path exists but is a file.
    """
    name_or_path = check_model_name_or_path(name_or_path)
    if name_or_path.startswith(BUILTIN_PREFIX):
        return str(_build_or_load(_check_builtin_name(name_or_path), cache_dir))
    return name_or_path


def check_model_name_or_path(name_or_path: str | os.PathLike) -> str:
    """Validate a model argument without loading or building anything (cheap: run it before loading data).

    Returns:
        `str`: `builtin:<name>` unchanged, an existing local directory (`~` expanded), or a Hub id unchanged.

    Raises:
        ValueError: If a `builtin:` name is unknown (the message lists the known names).
        FileNotFoundError: If a local-looking path (`./x`, `../x`, `/x`, `~/x`) does not exist.
        NotADirectoryError: If the path exists but is a file.
    """
    name_or_path = os.fspath(name_or_path)
    if name_or_path.startswith(BUILTIN_PREFIX):
        _check_builtin_name(name_or_path)
        return name_or_path
    if os.path.isdir(name_or_path):
        return name_or_path
    if name_or_path.startswith("~") and os.path.isdir(os.path.expanduser(name_or_path)):
        return os.path.expanduser(name_or_path)  # transformers does not expand `~`
    if os.path.exists(name_or_path):
        raise NotADirectoryError(f"Model path {name_or_path!r} is a file; pass the directory that holds the model.")
    if name_or_path.startswith(("/", "./", "../", "~", ".\\", "..\\")) or name_or_path in (".", ".."):
        raise FileNotFoundError(
            f"Model directory {name_or_path!r} does not exist. Pass an existing local directory, a Hub id "
            "(e.g. 'Qwen/Qwen3-1.7B-Base') or a built-in name ("
            + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
            + ")."
        )
    return name_or_path


def check_model_available(name_or_path: str | os.PathLike) -> str:
    """[`check_model_name_or_path`], and, when the Hub is offline (`HF_HUB_OFFLINE=1`), that a name which is not a
    local directory is a Hub id already in the local Hugging Face cache (otherwise transformers fails later with a
    long "couldn't connect" traceback; a relative path such as `outputs/no-such` reads as a Hub id too).

    Returns:
        `str`: as [`check_model_name_or_path`].

    Raises:
        FileNotFoundError: the name is neither a local directory nor, offline, a cached Hub id; plus the errors of
            [`check_model_name_or_path`].
    """
    name = check_model_name_or_path(name_or_path)
    if name.startswith(BUILTIN_PREFIX) or os.path.isdir(name):
        return name
    from huggingface_hub import constants, try_to_load_from_cache  # only for a Hub id

    if constants.HF_HUB_OFFLINE:
        try:
            cached = try_to_load_from_cache(name, "config.json")
        except Exception:  # noqa: BLE001 (an invalid repo id: not cached either)
            cached = None
        if not isinstance(cached, str):
            raise FileNotFoundError(
                f"Model {name!r} is not a local directory, and as a Hub id it is not in the local Hugging Face cache "
                "while HF_HUB_OFFLINE=1 (no download). Pass an existing directory (e.g. outputs/demo-stapo after "
                "`make demo`), a cached Hub id, or a built-in name ("
                + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
                + ")."
            )
    return name


def read_builtin_info(model_path: str | os.PathLike) -> dict[str, Any]:
    """The build record (`stapo_builtin.json`) of a built-in model directory."""
    with open(Path(model_path) / INFO_FILE, encoding="utf-8") as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------------------------
# Cache: lock, build in a temporary folder, rename
# ---------------------------------------------------------------------------------------------------------------


def _build_or_load(name: str, cache_dir: str | os.PathLike | None) -> Path:
    target = builtin_model_dir(name, cache_dir)
    if (target / INFO_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        # Another process may have finished the build while this one waited for the lock.
        if (target / INFO_FILE).is_file():
            return target
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_dir, 0o777 & ~umask)  # mkdtemp makes it private; the cache may be shared
        try:
            if _is_launched_process():
                _build_in_subprocess(name, tmp_dir)
            else:
                with _preserved_process_state():
                    build_builtin_model(name, tmp_dir)
            for path in tmp_dir.rglob("*"):  # transformers writes weight shards 0600; the cache may be shared
                if path.is_file():
                    os.chmod(path, 0o666 & ~umask)
            if target.exists():  # an incomplete folder (no info file), e.g. copied by hand: replace it
                shutil.rmtree(target)
            os.rename(tmp_dir, target)  # atomic on one file system: readers see nothing or a complete model
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    return target


def _is_launched_process() -> bool:
    """Whether this process belongs to a `torchrun` / `accelerate launch` job (or has a process group).

    The warm-up runs a [`~trl.SFTTrainer`], which would join the caller's process group and hang (the other ranks
    wait on the lock), or pick up the launcher's DeepSpeed / FSDP settings. Such processes build in a clean child.
    """
    if any(var in os.environ for var in _LAUNCHER_ENV_VARS):
        return True
    if any(var.startswith(_LAUNCHER_ENV_PREFIXES) for var in os.environ):
        return True
    if "torch" in sys.modules:
        import torch.distributed

        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return True
    return False


@contextlib.contextmanager
def _preserved_process_state():
    """Restore what an in-process warm-up changes globally: the accelerate state and the random generators.

    `TrainingArguments` resets accelerate's process-wide (Borg) state and configures it for the CPU, and the
    `Trainer` reseeds every generator. A caller that already built its own `GRPOConfig` (say, for a GPU) would
    otherwise train with the warm-up's CPU state, and a seeded caller would see its random stream change.
    """
    import random

    import numpy as np
    import torch
    from accelerate.state import AcceleratorState, GradientState, PartialState

    states = [(cls, dict(cls._shared_state)) for cls in (PartialState, AcceleratorState, GradientState)]
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        yield
    finally:
        for cls, saved in states:
            cls._shared_state.clear()
            cls._shared_state.update(saved)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])


def _build_in_subprocess(name: str, output_dir: Path) -> None:
    env = {
        k: v for k, v in os.environ.items() if k not in _LAUNCHER_ENV_VARS and not k.startswith(_LAUNCHER_ENV_PREFIXES)
    }
    env["HF_HUB_OFFLINE"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""  # the recipe is CPU-only; keep the child off the caller's GPUs
    cmd = [sys.executable, "-m", "stapo_trl.builtin", name, "--output-dir", str(output_dir)]
    logger.info("Building builtin:%s in a child process: %s", name, " ".join(cmd))
    subprocess.run(cmd, env=env, check=True)


# ---------------------------------------------------------------------------------------------------------------
# The recipe
# ---------------------------------------------------------------------------------------------------------------


def build_tokenizer(corpus: list[str]):
    """Byte-level BPE tokenizer with single-digit tokens, trained on `corpus`, wrapped for transformers.

    Digits are split before BPE, so no merge ever contains a digit: `"85"` is always `["8", "5"]`, as in Qwen.

    Args:
        corpus (`list[str]`):
            Texts to learn the merges from (rendered chats of the task).

    Returns:
        [`~transformers.PreTrainedTokenizerFast`]: `TOKENIZER_VOCAB_SIZE` tokens, pad `<|endoftext|>`, eos
        `<|im_end|>`, a ChatML chat template.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=[PAD_TOKEN, CHAT_START_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
    )


def build_model(tokenizer, seed: int = SEED, model_config: dict[str, Any] | None = None):
    """Random-init [`~transformers.Qwen3ForCausalLM`] of `MODEL_CONFIG`, sized to `tokenizer`, seeded.

    `model_config` overrides entries of `MODEL_CONFIG` (a built-in recipe's `model_config`, e.g. `{"head_dim": 64}`).
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        **{**MODEL_CONFIG, **(model_config or {})},
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    return model


def sft_warm_up(model, tokenizer, train_dataset, max_steps: int, seed: int = SEED) -> dict[str, float]:
    """Supervised warm-up with TRL's [`~trl.SFTTrainer`] on prompt/completion pairs (CPU, loss on completions).

    Args:
        model ([`~transformers.PreTrainedModel`]): The model, trained in place.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): Its tokenizer, with a chat template.
        train_dataset ([`~datasets.Dataset`]): Tiny-math rows (conversational `prompt`, string `completion`).
        max_steps (`int`): Optimizer steps of `SFT_CONFIG["per_device_train_batch_size"]` examples.
        seed (`int`, *optional*, defaults to `SEED`): Seed of the data order.

    Returns:
        `dict[str, float]`: `mean_train_loss` (over all steps) and `last_logged_loss` (label-smoothed cross-entropy,
        nats per completion token).
    """
    from trl import SFTConfig, SFTTrainer

    dataset = train_dataset.map(
        lambda ex: {"completion": [{"role": "assistant", "content": ex["completion"]}]},
        remove_columns=[c for c in train_dataset.column_names if c not in ("prompt", "completion")],
    )
    with tempfile.TemporaryDirectory() as output_dir:
        args = SFTConfig(
            output_dir=output_dir,
            max_steps=max_steps,
            seed=seed,
            use_cpu=True,
            bf16=False,
            report_to=[],
            save_strategy="no",
            logging_steps=50,
            disable_tqdm=True,
            # TRL turns it on by default; a 144k-parameter model needs no memory saving.
            **{_checkpointing_field(SFTConfig): False},
            **SFT_CONFIG,
        )
        with warnings.catch_warnings():
            # TRL deprecates `label_smoothing_factor` in SFTTrainer (it costs an extra forward pass); it is the point
            # of this warm-up, see the module docstring.
            warnings.filterwarnings("ignore", message=".*label_smoothing_factor.*", category=FutureWarning)
            trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
        trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    return {"mean_train_loss": trainer.state.log_history[-1]["train_loss"], "last_logged_loss": losses[-1]}


def _checkpointing_field(config_class) -> str:
    """The gradient-checkpointing field of a `TrainingArguments` subclass: `activation_checkpointing` from
    transformers 5.24 (where `gradient_checkpointing` is a deprecated alias), `gradient_checkpointing` before (5.19,
    the vLLM CPU environment)."""
    import dataclasses

    names = {field.name for field in dataclasses.fields(config_class)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def measure_accuracy(
    model, tokenizer, prompts: list, solutions: list[str], *, do_sample: bool, seed: int = SEED, batch_size: int = 100
) -> tuple[float, list[str]]:
    """Fraction of prompts whose completion's last `\\boxed{}` equals the gold string exactly.

    Args:
        model ([`~transformers.PreTrainedModel`]): The model, on CPU.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): Its tokenizer, with a chat template.
        prompts (`list`): Conversational prompts.
        solutions (`list[str]`): Gold answers.
        do_sample (`bool`): Sample at `EVAL_TEMPERATURE` (True) or decode greedily (False).
        seed (`int`, *optional*, defaults to `SEED`): Seed of the sampling.
        batch_size (`int`, *optional*, defaults to `100`): Prompts per `generate` call.

    Returns:
        `tuple[float, list[str]]`: The accuracy, a fraction in [0, 1], and the decoded completions.
    """
    import torch

    torch.manual_seed(seed)
    model.eval()
    completions: list[str] = []
    for start in range(0, len(prompts), batch_size):
        texts = [
            tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
            for p in prompts[start : start + batch_size]
        ]
        batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **batch,
                max_new_tokens=EVAL_MAX_NEW_TOKENS,
                do_sample=do_sample,
                temperature=EVAL_TEMPERATURE if do_sample else None,
                top_p=1.0 if do_sample else None,
                top_k=0 if do_sample else None,
            )
        completions += tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    correct = sum(extract_boxed_answer(c) == s for c, s in zip(completions, solutions))
    return correct / len(prompts), completions


def evaluate_tiny_math(model, tokenizer, test_dataset) -> dict[str, Any]:
    """Held-out accuracy of a tiny-math model: sampled at `EVAL_TEMPERATURE` (as RL rollouts are) and greedy.

    Args:
        model ([`~transformers.PreTrainedModel`]): The model, on CPU.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): Its tokenizer.
        test_dataset ([`~datasets.Dataset`]): Tiny-math rows (`prompt`, `solution`, `problem`).

    Returns:
        `dict[str, Any]`: `sampled_accuracy` and `greedy_accuracy` (fractions in [0, 1]), the settings, and the
        first five sampled completions.
    """
    prompts, solutions = test_dataset["prompt"], test_dataset["solution"]
    sampled_accuracy, sampled = measure_accuracy(model, tokenizer, prompts, solutions, do_sample=True)
    greedy_accuracy, _ = measure_accuracy(model, tokenizer, prompts, solutions, do_sample=False)
    return {
        "split": "builtin:tiny-math test",
        "num_problems": len(prompts),
        "temperature": EVAL_TEMPERATURE,
        "top_p": 1.0,
        "max_new_tokens": EVAL_MAX_NEW_TOKENS,
        "sampled_accuracy": sampled_accuracy,
        "greedy_accuracy": greedy_accuracy,
        # A few sampled completions: at T = 1.0 some wander into the low-probability tail label smoothing left.
        "samples": [
            {"problem": test_dataset[i]["problem"], "completion": sampled[i], "solution": solutions[i]}
            for i in range(min(5, len(prompts)))
        ],
    }


def build_builtin_model(name: str, output_dir: str | os.PathLike) -> dict[str, Any]:
    """Build `builtin:<name>` into `output_dir` (no lock, no cache: `resolve_model_path` handles those).

    Trains the tokenizer on the tiny-math train split, builds the seeded random model, warms it up with SFT when the
    recipe asks for it, measures held-out accuracy (sampled at temperature 1.0 and greedy) on the test split, and
    saves the model, the tokenizer and `stapo_builtin.json`.

    Args:
        name (`str`):
            A key of `BUILTIN_MODELS` (without the `builtin:` prefix).
        output_dir (`str` or `os.PathLike`):
            Existing directory to write into.

    Returns:
        `dict[str, Any]`: The build record, as written to `stapo_builtin.json`.
    """
    recipe = BUILTIN_MODELS[name]
    start = time.perf_counter()
    logger.info("Building builtin:%s (%s) into %s", name, recipe["description"], output_dir)
    with _one_torch_thread():
        info = _build(name, recipe, output_dir)
    info["build_seconds"] = round(time.perf_counter() - start, 1)
    # Written last: its presence marks a complete build.
    with open(Path(output_dir) / INFO_FILE, "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2)
    logger.info("Built builtin:%s in %.1f s.", name, info["build_seconds"])
    return info


@contextlib.contextmanager
def _one_torch_thread():
    """Run the build on one intra-op thread, then restore the caller's setting.

    The matrices of a 144k-parameter model are so small that thread hand-offs cost more than they save: measured on
    a busy 2-core machine, one thread trains 3x faster than two. One thread also makes the floating-point reduction
    order, hence the built weights, independent of the machine's core count.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _build(name: str, recipe: dict[str, Any], output_dir: str | os.PathLike) -> dict[str, Any]:
    """The recipe proper: tokenizer, model, optional warm-up and evaluation, saved; returns the build record."""
    import tokenizers
    import torch
    import transformers
    import trl

    from .data import make_tiny_math_dataset  # datasets is slow to import: only when a model is built

    data = make_tiny_math_dataset(seed=SEED)
    # The tokenizer learns its merges from the rendered chats, so the prompt's instruction and the chat markup
    # become whole-word tokens (30 prompt tokens, 29-31 completion tokens + eos).
    corpus = [
        "".join(f"{CHAT_START_TOKEN}{m['role']}\n{m['content']}{EOS_TOKEN}\n" for m in prompt)
        + f"{CHAT_START_TOKEN}assistant\n{completion}{EOS_TOKEN}\n"
        for prompt, completion in zip(data["train"]["prompt"], data["train"]["completion"])
    ]
    tokenizer = build_tokenizer(corpus)
    model = build_model(tokenizer, seed=SEED, model_config=recipe.get("model_config"))
    num_parameters = sum(p.numel() for p in model.parameters())
    logger.info("Tokenizer: %d tokens. Model: %d parameters.", len(tokenizer), num_parameters)

    losses = evaluation = None
    if recipe["sft_steps"] > 0:  # a random model scores 0 %: not worth the generation time either
        sft_start = time.perf_counter()
        losses = sft_warm_up(model, tokenizer, data["train"], recipe["sft_steps"], seed=SEED)
        logger.info("SFT warm-up: %d steps in %.1f s.", recipe["sft_steps"], time.perf_counter() - sft_start)
        evaluation = evaluate_tiny_math(model, tokenizer, data["test"])
        logger.info(
            "Held-out accuracy on %d problems: %.1f %% sampled (T=%.1f), %.1f %% greedy. Sample: %s -> %r",
            evaluation["num_problems"],
            100 * evaluation["sampled_accuracy"],
            EVAL_TEMPERATURE,
            100 * evaluation["greedy_accuracy"],
            evaluation["samples"][0]["problem"],
            evaluation["samples"][0]["completion"],
        )

    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return {
        "name": BUILTIN_PREFIX + name,
        "version": recipe["version"],
        "description": recipe["description"],
        "seed": SEED,
        "torch_threads": torch.get_num_threads(),
        "tokenizer": {"type": "byte-level BPE, single-digit tokens", "vocab_size": len(tokenizer)},
        "model": {
            "architecture": "Qwen3ForCausalLM",
            "num_parameters": num_parameters,
            **MODEL_CONFIG,
            **recipe.get("model_config", {}),
        },
        "sft": {
            "steps": recipe["sft_steps"],
            "train_examples": len(data["train"]),
            **(losses or {}),
            **(SFT_CONFIG if recipe["sft_steps"] > 0 else {}),
        },
        "eval": evaluation,
        "build_seconds": None,  # set by `build_builtin_model`, which times the whole build
        "versions": {
            "stapo_trl": importlib.metadata.version("stapo_trl"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
            "tokenizers": tokenizers.__version__,
        },
    }


def _main(argv: list[str] | None = None) -> None:
    """`python -m stapo_trl.builtin NAME --output-dir DIR`: the child-process entry of `_build_in_subprocess`."""
    parser = argparse.ArgumentParser(description="Build a stapo_trl built-in model into a directory (no cache).")
    parser.add_argument("name", choices=sorted(BUILTIN_MODELS))
    parser.add_argument("--output-dir", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    os.makedirs(args.output_dir, exist_ok=True)
    build_builtin_model(args.name, args.output_dir)


if __name__ == "__main__":
    _main()
