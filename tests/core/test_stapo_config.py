import dataclasses
import re

import pytest
import trl
from packaging.version import Version
from trl import GRPOConfig

from stapo_trl.core import STAPOConfig
from stapo_trl.core.s2t import S2TSettings
from stapo_trl.core.stapo_config import PAPER_OBJECTIVE, s2t_path, s2t_settings, s2t_settings_line, s2t_warnings


pytestmark = pytest.mark.filterwarnings("ignore")  # TRL's notices while configs are built


def make_config(config_cls=STAPOConfig, **overrides):
    return config_cls(output_dir="unused", use_cpu=True, bf16=False, report_to=[], **overrides)


@dataclasses.dataclass
class OpenR1StyleConfig(GRPOConfig):  # a user's config as open-r1 writes one: fields of its own, one S2T field
    benchmarks: list[str] = dataclasses.field(default_factory=list)
    s2t_entropy_quantile: float = 0.8  # the paper's v1 value


@pytest.mark.release
def test_paper_defaults_settings_from_any_config_the_line_the_path_bad_values_refused_in_one_line_features_warned():
    # STAPO Sec. 4.1: tau_p = 0.002, q = 0.75; the DAPO/JustRL objective: clip 0.2 / 0.28, token mean, no KL
    config = make_config()
    assert (config.s2t_prob_threshold, config.s2t_entropy_quantile, config.s2t_mode) == (0.002, 0.75, "low_entropy")
    assert {name: getattr(config, name) for name in PAPER_OBJECTIVE} == PAPER_OBJECTIVE
    assert PAPER_OBJECTIVE == {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0}
    assert config.top_entropy_quantile == 1.0 and config.entropy_coef == 0.0  # no entropy mask, no bonus
    assert s2t_settings(config) == S2TSettings() == S2TSettings(0.002, 0.75, "low_entropy")
    fields = {f.name: f for f in dataclasses.fields(STAPOConfig) if f.name.startswith("s2t_")}
    assert set(fields) == {f"s2t_{f.name}" for f in dataclasses.fields(S2TSettings)}
    for name, f in fields.items():
        assert len(f.metadata["help"]) > 30 and f"{name} (`" in STAPOConfig.__doc__, name
        assert f.default == getattr(S2TSettings(), name.removeprefix("s2t_")), name  # one set of paper values
    assert list(fields["s2t_mode"].metadata["choices"]) == ["low_entropy", "off"]
    grpo = make_config(GRPOConfig)  # in the installed trl only epsilon_high differs: a changed TRL default fails here
    assert sorted(name for name, paper in PAPER_OBJECTIVE.items() if getattr(grpo, name) != paper) == ["epsilon_high"]
    assert f"differs only in `epsilon_high` (`{grpo.epsilon_high}`" in " ".join(STAPOConfig.__doc__.split())
    for boundary in ({"s2t_prob_threshold": 1.0}, {"s2t_entropy_quantile": 0.0}, {"s2t_prob_threshold": 1}):
        assert s2t_settings(make_config(**boundary))  # accepted (an int is a number)
    assert s2t_settings(grpo) == S2TSettings()  # no S2T field at all: the paper's
    assert s2t_settings(make_config(OpenR1StyleConfig)) == S2TSettings(entropy_quantile=0.8)
    config = make_config(s2t_prob_threshold=0.01, s2t_mode="off")
    assert s2t_settings(config) == S2TSettings(prob_threshold=0.01, mode="off") == s2t_settings(config, modes=("off",))
    with pytest.raises(ValueError, match=r"is not one of \['low_entropy'\]"):
        s2t_settings(config, modes=("low_entropy",))
    assert s2t_settings_line(make_config(), S2TSettings()) is None
    assert s2t_settings_line(grpo, s2t_settings(grpo)) == (
        "STAPO with s2t_prob_threshold=0.002, s2t_entropy_quantile=0.75, s2t_mode='low_entropy' (the paper's "
        "values: GRPOConfig has no s2t_prob_threshold, s2t_entropy_quantile, s2t_mode fields, and such values given "
        "to it, in a YAML file say, are ignored; to set them, use `from stapo_trl import STAPOConfig as GRPOConfig`); "
        "differs from the paper's objective: epsilon_high=None (paper 0.28)."
    )
    line = s2t_settings_line(own := make_config(OpenR1StyleConfig, epsilon_high=0.28, beta=0.04), s2t_settings(own))
    assert "s2t_entropy_quantile=0.8, " in line and "has no s2t_prob_threshold, s2t_mode fields, and such" in line
    assert line.endswith("objective: s2t_entropy_quantile=0.8 (paper 0.75), beta=0.04 (paper 0.0).")
    grpo = make_config(GRPOConfig, epsilon_high=0.28)
    assert s2t_settings_line(grpo, s2t_settings(grpo)).endswith("GRPOConfig`); the rest is the paper's objective.")
    off = make_config(s2t_mode="off")
    assert s2t_settings_line(off, s2t_settings(off)).endswith("objective: s2t_mode='off' (paper 'low_entropy').")
    ga2 = dict(steps_per_generation=2, gradient_accumulation_steps=2)  # the path of p and H:
    for geometry, path in [(dict(), "loss"), (ga2, "extra_forward"), (dict(num_iterations=2), "old_logps"),
                           (dict(steps_per_generation=8, gradient_accumulation_steps=2), "old_logps"),
                           ({**ga2, "num_iterations": 2}, "old_logps"), ({**ga2, "use_vllm": True}, "old_logps"),
                           ({**ga2, "use_vllm": True, "vllm_importance_sampling_correction": False},
                            "extra_forward")]:  # fmt: skip
        assert s2t_path(make_config(**geometry)) == path, geometry
    for field, value, message in [
        ("s2t_prob_threshold", 0.0, r"^s2t_prob_threshold=0\.0 must be in \(0, 1\]; the paper: 0\.002\.$"),
        ("s2t_prob_threshold", 1.5, r"s2t_prob_threshold=1\.5"),
        ("s2t_prob_threshold", float("nan"), r"s2t_prob_threshold=nan must be in \(0, 1\]"),
        ("s2t_prob_threshold", "0.002", r"^s2t_prob_threshold='0\.002' must be a number in \(0, 1\], got str\.$"),
        ("s2t_entropy_quantile", -0.1, r"s2t_entropy_quantile=-0\.1 must be in \[0, 1\]"),
        ("s2t_entropy_quantile", True, r"s2t_entropy_quantile=True must be a number"),
        ("s2t_mode", "all_low_prob", r"^s2t_mode='all_low_prob' is not one of \['low_entropy', 'off'\]\.$")
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            make_config(**{field: value})
        config = make_config(OpenR1StyleConfig)  # a user's class: the same check where the trainer reads it
        setattr(config, field, value)
        with pytest.raises(ValueError, match=message):
            s2t_settings(config)
    for overrides, message in FEATURE_WARNINGS:  # luspo below trl 1.10: refused
        messages = s2t_warnings(config := make_config(**overrides), s2t_settings(config))
        assert len(messages) == 1 and re.search(message, messages[0]) and "\n" not in messages[0], messages
        off = make_config(s2t_mode="off", **overrides)
        assert not [m for m in s2t_warnings(off, s2t_settings(off)) if m.startswith("S2T mask")]  # nothing silenced
    for overrides in [dict(), dict(steps_per_generation=4, gradient_accumulation_steps=1),  # the recipes' geometry
                      dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=8),
                      dict(off_policy_mask_threshold=0.5), dict(num_iterations=2),
                      dict(use_vllm=True, steps_per_generation=4)]:  # fmt: skip
        assert s2t_warnings(config := make_config(**overrides), s2t_settings(config)) == [], overrides
    config = make_config(per_device_train_batch_size=4, steps_per_generation=2)
    assert s2t_warnings(config, S2TSettings(), num_processes=2) == []  # 4 completions x 2 processes: one group
    assert len(s2t_warnings(config, S2TSettings(), num_processes=1)) == 1
    config = make_config(gradient_accumulation_steps=2, steps_per_generation=4)
    assert len(s2t_warnings(config, S2TSettings(), steps_per_generation=3)) == 1
    config = make_config(s2t_mode="off", steps_per_generation=8, gradient_accumulation_steps=2)
    (message,) = s2t_warnings(config, s2t_settings(config))
    assert message.startswith("s2t_mode='off' with steps_per_generation=8 > gradient_accumulation_steps=2 is not "
                              "plain GRPOTrainer: each update is divided by its own loss-token count")  # fmt: skip
    for same in (dict(steps_per_generation=2, gradient_accumulation_steps=2), dict(loss_type="bnpo")):
        config = make_config(s2t_mode="off", **{"steps_per_generation": 8, "gradient_accumulation_steps": 2, **same})
        assert s2t_warnings(config, s2t_settings(config)) == []  # GRPOTrainer's objective exactly


FEATURE_WARNINGS = [  # one row per warned GRPO feature of docs/stapo.md's table
    ({"beta": 0.04}, r"^S2T mask with beta=0\.04: silenced tokens lose their KL penalty too"),
    ({"importance_sampling_level": "sequence"}, r"importance_sampling_level='sequence': each ratio averages kept"),
    ({"loss_type": "vespo"}, r"loss_type='vespo': each completion's weight phi sums its kept tokens"),
    ({"top_entropy_quantile": 0.2}, r"top_entropy_quantile=0\.2: its entropy quantile is taken over kept tokens"),
    ({"entropy_coef": 0.01}, r"entropy_coef=0\.01: the bonus averages kept tokens only"),
    ({"use_adaptive_entropy": True}, r"entropy_coef=0\.0: the bonus averages kept tokens only"),
    ({"temperature": 0.7}, r"temperature=0\.7: p and H are temperature-scaled; tau_p and q are calibrated at 1\.0"),
    ({"loss_type": "dr_grpo"}, r"loss_type='dr_grpo': a constant denominator"),
    *[({"loss_type": "luspo"}, r"loss_type='luspo': a constant")] * (Version(trl.__version__) >= Version("1.10")),
    ({"gradient_accumulation_steps": 2, "steps_per_generation": 3}, r"steps_per_generation=3: not a multiple of GA=2"),
    ({"per_device_train_batch_size": 4, "steps_per_generation": 2}, r"an update of 4 completions splits prompt"),
]  # fmt: skip
