"""The core's `STAPOConfig`: the paper's defaults, its fields, early validation and its warnings."""

import dataclasses

import pytest

from stapo_trl.core import STAPOConfig
from stapo_trl.core.stapo_config import s2t_warnings


def make_config(**overrides):
    return STAPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to=[], **overrides)


def test_defaults_are_the_papers():
    # STAPO Sec. 4.1: tau_p = 0.002, q = 0.75 (v4/v5); the DAPO/JustRL objective: clip 0.2 / 0.28, token mean, no KL.
    config = make_config()
    assert (config.s2t_prob_threshold, config.s2t_entropy_quantile, config.s2t_mode) == (0.002, 0.75, "low_entropy")
    assert (config.loss_type, config.epsilon, config.epsilon_high, config.beta) == ("dapo", 0.2, 0.28, 0.0)
    assert config.top_entropy_quantile == 1.0 and config.entropy_coef == 0.0  # no entropy mask, no bonus


def test_every_s2t_field_has_help_choices_where_closed_and_a_docstring_entry():
    fields = {f.name: f for f in dataclasses.fields(STAPOConfig) if f.name.startswith("s2t_")}
    assert set(fields) == {"s2t_prob_threshold", "s2t_entropy_quantile", "s2t_mode"}
    for name, f in fields.items():
        assert len(f.metadata["help"]) > 30, name
        assert f"{name} (`" in STAPOConfig.__doc__, name
    assert list(fields["s2t_mode"].metadata["choices"]) == ["low_entropy", "off"]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("s2t_prob_threshold", 0.0, r"s2t_prob_threshold=0\.0 must be in \(0, 1\]"),
        ("s2t_prob_threshold", 1.5, r"s2t_prob_threshold=1\.5"),
        ("s2t_entropy_quantile", -0.1, r"s2t_entropy_quantile=-0\.1 must be in \[0, 1\]"),
        ("s2t_mode", "all_low_prob", r"s2t_mode='all_low_prob' is not one of \['low_entropy', 'off'\]"),
    ],
)
def test_bad_values_are_refused_at_construction_naming_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        make_config(**{field: value})


@pytest.mark.parametrize("boundary", [{"s2t_prob_threshold": 1.0}, {"s2t_entropy_quantile": 0.0}, {"s2t_mode": "off"}])
def test_boundary_values_are_accepted(boundary):
    assert make_config(**boundary)


def test_warnings_where_the_loss_cannot_be_the_papers_exact_objective():
    assert s2t_warnings(make_config()) == []
    (constant,) = s2t_warnings(make_config(loss_type="dr_grpo"))
    assert "constant denominator" in constant
    (spans,) = s2t_warnings(make_config(gradient_accumulation_steps=2, steps_per_generation=3))
    assert "not a multiple of gradient_accumulation_steps=2" in spans
    assert s2t_warnings(make_config(gradient_accumulation_steps=2, steps_per_generation=4)) == []
    assert s2t_warnings(make_config(loss_type="dr_grpo", s2t_mode="off")) == []  # nothing is silenced
