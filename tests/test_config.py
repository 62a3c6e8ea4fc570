"""`STAPOConfig`: paper defaults, documentation of every S2T field, and early validation."""

import dataclasses
import re
import warnings

import pytest

from stapo_trl import STAPOConfig
from stapo_trl.core.s2t import S2T_MODES
from stapo_trl.core.stapo_config import S2T_POLICIES, S2T_SCOPES, untested_combination_warnings


def make_config(**overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return STAPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to=[], **overrides)


def test_defaults_are_the_papers():
    # STAPO Sec. 4.1: tau_p = 0.002, q = 0.75 (v4/v5), DAPO objective: clip 0.2 / 0.28, token mean, no KL.
    config = make_config()
    assert config.s2t_prob_threshold == 0.002
    assert config.s2t_entropy_quantile == 0.75
    assert config.s2t_mode == "low_entropy"
    # tau_h over one optimizer update ("in each mini-batch"), p and H from the rollout-time scoring forward.
    assert config.s2t_scope == "optimizer_step" and config.s2t_policy == "rollout"
    assert (config.loss_type, config.epsilon, config.epsilon_high, config.beta) == ("dapo", 0.2, 0.28, 0.0)
    assert config.top_entropy_quantile == 1.0 and config.entropy_coef == 0.0  # no entropy mask, no bonus


def test_every_s2t_field_has_help_and_is_documented():
    s2t_fields = [f for f in dataclasses.fields(STAPOConfig) if f.name.startswith("s2t_")]
    expected = {"s2t_prob_threshold", "s2t_entropy_quantile", "s2t_mode", "s2t_scope", "s2t_policy", "s2t_diagnostics"}
    expected.add("s2t_write_run_files")
    assert {f.name for f in s2t_fields} == expected
    for f in s2t_fields:
        assert len(f.metadata.get("help", "")) > 40, f.name
        # Documented by the class that declares it: the core's S2T fields in core.STAPOConfig, the product's own
        # (s2t_write_run_files) in stapo_trl.STAPOConfig.
        declaring = next(c for c in STAPOConfig.__mro__ if f.name in c.__dict__.get("__annotations__", {}))
        assert f"{f.name} (`" in declaring.__doc__, f"{f.name} missing from the docstring of {declaring.__qualname__}"
    choices = {f.name: f.metadata.get("choices") for f in s2t_fields}
    assert choices["s2t_mode"] == list(S2T_MODES) and choices["s2t_scope"] == list(S2T_SCOPES)
    assert choices["s2t_policy"] == list(S2T_POLICIES)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("s2t_prob_threshold", 0.0, r"s2t_prob_threshold=0\.0 .*\(0, 1\]"),
        ("s2t_prob_threshold", 1.5, r"s2t_prob_threshold=1\.5"),
        ("s2t_entropy_quantile", -0.1, r"s2t_entropy_quantile=-0\.1 .*\[0, 1\]"),
        ("s2t_mode", "low", r"s2t_mode='low' .*'low_entropy', 'high_entropy', 'all_low_prob', 'off'"),
        ("s2t_scope", "batch", r"s2t_scope='batch' .*'optimizer_step', 'generation_batch', 'micro_batch'"),
        ("s2t_policy", "old", r"s2t_policy='old' .*'rollout', 'current'"),
        # transformers reads every max_steps <= 0 as "train num_train_epochs epochs": -5 would silently run 3 epochs
        ("max_steps", -5, r"max_steps=-5 is not a number of optimizer steps: .*positive number, or -1"),
        ("max_steps", 0, r"max_steps=0 is not a number of optimizer steps"),
        # values that passed config time and failed after the model was built (new-user pass)
        ("loss_type", "ppo", r"loss_type='ppo' is not supported by STAPOTrainer: .*Supported: \['dapo'"),
        ("temperature", 0.0, r"temperature=0\.0 must be > 0: GRPO samples its rollouts"),
        ("max_completion_length", 0, r"max_completion_length=0 must be >= 1"),
        # a Python caller's wrong types: "false" read as true, a string threshold failing with a bare TypeError
        ("s2t_write_run_files", "false", r"s2t_write_run_files='false' must be a bool \(True or False\), got str"),
        ("s2t_diagnostics", "no", r"s2t_diagnostics='no' must be a bool"),
        ("s2t_prob_threshold", "0.002", r"s2t_prob_threshold='0.002' must be a number, got str"),
        ("s2t_entropy_quantile", True, r"s2t_entropy_quantile=True must be a number, got bool"),
        (
            "s2t_mode",
            False,
            r"YAML reads an unquoted `off` \(or `no`, `false`\) as the boolean false. Write s2t_mode: \"off\"",
        ),
    ],
)
def test_bad_values_fail_at_config_time_naming_field_and_allowed_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        make_config(**{field: value})


def test_accepts_v1_quantile_and_boundaries():
    assert make_config(s2t_entropy_quantile=0.8).s2t_entropy_quantile == 0.8
    assert make_config(s2t_prob_threshold=1.0, s2t_entropy_quantile=0.0).s2t_prob_threshold == 1.0


def test_current_policy_needs_the_optimizer_step_scope():
    with pytest.raises(ValueError, match=r"s2t_policy='current' needs s2t_scope='optimizer_step'"):
        make_config(s2t_policy="current", s2t_scope="generation_batch")
    assert make_config(s2t_policy="current").s2t_scope == "optimizer_step"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"temperature": 0.7}, r"temperature=0\.7: the S2T thresholds .* calibrated at temperature 1\.0"),
        ({"loss_type": "dr_grpo"}, "constant denominator"),
        ({"loss_type": "luspo"}, "constant denominator"),
        ({"loss_type": "vespo"}, "phi weight of their whole completion"),
        ({"entropy_coef": 0.01}, r"entropy_coef=0\.01 .* averaged over kept tokens"),
        ({"top_entropy_quantile": 0.2}, "top_entropy_quantile=0.2"),
        ({"importance_sampling_level": "sequence"}, "importance_sampling_level='sequence'"),
        (
            {"gradient_accumulation_steps": 2, "steps_per_generation": 3},
            r"steps_per_generation=3 is not a multiple .* falls back to tau_h over each rollout batch",
        ),
    ],
)
def test_untested_combinations_give_one_message_each(overrides, message):
    messages = untested_combination_warnings(make_config(**overrides))
    assert len(messages) == 1 and re.search(message, messages[0]), messages
    assert untested_combination_warnings(make_config(s2t_mode="off", **overrides)) == []  # nothing is silenced


def test_paper_settings_give_no_warning():
    assert untested_combination_warnings(make_config(steps_per_generation=4, gradient_accumulation_steps=1)) == []
