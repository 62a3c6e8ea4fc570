"""The library's `STAPOConfig`: the ablation modes, every S2T field documented, refusals, CPU defaults."""

import dataclasses
import logging
import typing
from pathlib import Path

import pytest
from testing_utils import STAPO_RECIPE

from stapo_trl import STAPOConfig, core
from stapo_trl.cli.args import parse_args
from stapo_trl.diagnostics.ablations import ABLATIONS
from stapo_trl.trainer.config import has_accelerator


pytestmark = pytest.mark.filterwarnings("ignore")


def make_config(**overrides):
    return STAPOConfig(**dict(output_dir="unused", use_cpu=True, bf16=False, report_to=[]) | overrides)


def test_the_s2t_fields_are_the_cores_plus_the_ablations_and_the_run_files_switch_each_documented(monkeypatch, caplog):
    config = make_config()  # the core's defaults (tests/core/test_stapo_config.py), which its trainer accepts
    assert isinstance(config, core.STAPOConfig) and config.s2t_write_run_files is True
    fields = {f.name: f for f in dataclasses.fields(STAPOConfig) if f.name.startswith("s2t_")}
    assert set(fields) == {"s2t_prob_threshold", "s2t_entropy_quantile", "s2t_mode", "s2t_write_run_files"}
    for name, f in fields.items():  # documented by its declaring class (s2t_mode: redeclared with the ablations)
        declaring = next(c for c in STAPOConfig.__mro__ if name in c.__dict__.get("__annotations__", {}))
        assert len(f.metadata.get("help", "")) > 40 and f"{name} (`" in declaring.__doc__, name
    field = fields["s2t_mode"]
    assert field.metadata["choices"] == ["low_entropy", "off", "high_entropy", "all_low_prob"]
    assert field.metadata["choices"] == list(core.STAPOConfig._s2t_modes) + list(ABLATIONS)  # one entry each
    assert all(f'"{mode}"' in STAPOConfig.__doc__ and mode in field.metadata["help"] for mode in ABLATIONS)
    assert set(typing.get_args(typing.get_type_hints(STAPOConfig)["s2t_mode"])) == set(field.metadata["choices"])
    assert all(make_config(s2t_mode=mode).s2t_mode == mode for mode in field.metadata["choices"])
    monkeypatch.setattr("stapo_trl.trainer.config.has_accelerator", lambda: True)  # an accelerator: TRL's defaults
    with caplog.at_level(logging.INFO, logger="stapo_trl.trainer.config"):
        args = STAPOConfig(output_dir="unused", report_to=[], bf16=False)  # bf16 given: this CPU refuses True
    assert args.use_cpu is False and not [r for r in caplog.records if r.name == "stapo_trl.trainer.config"]


# The core's S2T values: tests/core/test_stapo_config.py; a command line's and the API's same words (batch sizes,
# learning rate, seed, temperature, max_steps < -1, report_to, TRL's num_generations words): tests/cli/test_args.py.
@pytest.mark.parametrize("settings, message", [
    ({"s2t_mode": "low"}, r"s2t_mode='low' .*'high_entropy', 'all_low_prob'"),
    ({"s2t_mode": False}, r"s2t_mode=False: YAML reads an unquoted `off`"),
    ({"s2t_write_run_files": "false"}, r"s2t_write_run_files='false' must be a bool"),  # "false" read as true
    ({"max_steps": 0}, r"max_steps=0 is not a number of optimizer steps"),  # transformers: <= 0 runs epochs
    ({"max_completion_length": 0}, r"max_completion_length=0 must be >= 1"),  # failed after the model was built
    ({"loss_type": "ppo"}, r"^Unknown loss type: ppo \(loss_type='ppo'; TRL's are \['grpo'"),  # GRPOTrainer: late
    ({"loss_type": "DAPO"}, r"loss_type='DAPO'"), ({"loss_type": "dapo "}, r"loss_type='dapo '"),
    ({"num_generations": 0}, r"^num_generations=0: set num_generations to 2 or more"),  # TRL divides by it first
    ({"generation_batch_size": 10, "per_device_train_batch_size": 4, "num_generations": 8},  # TRL's words stand
     r"^generation_batch_size \(10\) must be divisible by the global batch size \(4\)\.$"),
])  # fmt: skip
def test_bad_values_are_refused_at_construction_naming_the_field(settings, message):
    with pytest.raises(ValueError, match=message):
        make_config(**settings)


@pytest.mark.skipif(has_accelerator(), reason="the CPU defaults apply only on a machine without an accelerator")
def test_cpu_only_machine_defaults_to_use_cpu_without_bf16_and_explicit_values_win(tmp_path, caplog):
    config = lambda **settings: make_config(**{"use_cpu": None, "bf16": None} | settings)  # noqa: E731
    with caplog.at_level(logging.INFO, logger="stapo_trl.trainer.config"):
        args = config()  # TRL's bf16 default is refused by transformers here: this raised before
        explicit = config(use_cpu=True, bf16=True)  # bf16 on a CPU: slow, but the user asked for it
    assert (args.use_cpu, args.bf16, explicit.use_cpu, explicit.bf16) == (True, False, True, True)
    lines = [record.getMessage() for record in caplog.records if record.name == "stapo_trl.trainer.config"]
    assert len(lines) == 1 and "use_cpu=True, bf16=False" in lines[0], lines  # the explicit values: no line
    assert (config(use_cpu=False).use_cpu, config(use_cpu=False).bf16) == (False, False)
    assert config(fp16=False, bf16=False).bf16 is False
    lines = [x for x in Path(STAPO_RECIPE).read_text().splitlines() if not x.startswith(("use_cpu:", "bf16:"))]
    (recipe := tmp_path / "recipe.yaml").write_text("\n".join(lines))
    for argv, expected in {(str(recipe),): (True, False), (str(recipe), "--use_cpu", "false"): (False, False),
                           (str(recipe), "--use_cpu"): (True, False), (str(recipe), "--bf16", "true"): (True, True),
                           (STAPO_RECIPE,): (True, False)}.items():  # fmt: skip
        _, training_args, _ = parse_args(["--config", *argv])
        assert (training_args.use_cpu, training_args.bf16) == expected, argv
