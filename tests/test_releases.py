"""`make test-releases`: the README example trains, a path around the mask is refused, dropped S2T keys are named."""

import ast
import warnings

import pytest
import torch
import trl
from packaging.version import Version
from testing_utils import PROMPTS, REPO, length_reward
from trl import GRPOConfig

from stapo_trl import STAPOConfig, STAPOTrainer
from stapo_trl.core import STAPOConfig as CoreSTAPOConfig
from stapo_trl.core import STAPOTrainer as CoreSTAPOTrainer
from stapo_trl.core.stapo_config import refuse_paths_around_the_mask


pytestmark = pytest.mark.release
TRL = Version(trl.__version__)
# TRL's default (the mask from the loss's forward); 4 updates per rollout (TRL's old-log-prob forward)
LAYOUTS = {"default": {}, "steps_per_generation=4xGA": {"steps_per_generation": 4, "gradient_accumulation_steps": 1}}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_readme_example_constructs_silently_and_trains_two_steps(tiny_math_model_path, tmp_path, layout):
    # examples/python_api.py up to `trainer.train()`, with this model, folder, 2 steps and the layout's settings
    tree = ast.parse((REPO / "examples" / "python_api.py").read_text())
    *body, last = tree.body
    assert ast.unparse(last) == "trainer.train()"
    overrides = {"output_dir": str(tmp_path), "max_steps": 2, **LAYOUTS[layout]}
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and ast.unparse(call.func) == "GRPOTrainer":
            call.keywords[0].value = ast.Constant(tiny_math_model_path)
        if isinstance(call, ast.Call) and ast.unparse(call.func) == "GRPOConfig":
            settings = {k.arg: k.value for k in call.keywords} | {k: ast.Constant(v) for k, v in overrides.items()}
            call.keywords = [ast.keyword(key, value) for key, value in settings.items()]
    namespace = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(ast.fix_missing_locations(ast.Module(body, [])), "python_api.py", "exec"), namespace)
    assert [str(w.message) for w in caught if any(k in str(w.message) for k in ("STAPO", "trl "))] == []
    trainer = namespace["trainer"]
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    rows = [row for row in trainer.state.log_history if "loss" in row]
    assert [row["step"] for row in rows] == [2] and all(torch.isfinite(torch.tensor(row["loss"])) for row in rows)
    assert rows[0]["s2t/num_loss_tokens"] > 0
    assert any(not torch.equal(before[name], p) for name, p in trainer.model.named_parameters())
    assert trainer._s2t_path == ("loss" if layout == "default" else "old_logps")


TRAINERS = {"core": (CoreSTAPOTrainer, CoreSTAPOConfig), "product": (STAPOTrainer, STAPOConfig)}
# (settings, the TRL release from which it applies the mask, what the one-line refusal holds)
LIGER = (dict(use_liger_kernel=True), "1.14.0", [f"use_liger_kernel=True: trl {trl.__version__} computes the loss in "
         "Liger's kernel", "Set use_liger_kernel=False, or use trl>=1.14."])  # fmt: skip
LUSPO = (dict(loss_type="luspo", importance_sampling_level="token"), "1.10.0",
         [f"loss_type='luspo' with importance_sampling_level='token': trl {trl.__version__} sums"])  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("trainer", TRAINERS)
@pytest.mark.parametrize("refusal, config", [(LIGER, "GRPOConfig"), (LIGER, "STAPOConfig"), (LUSPO, "GRPOConfig")],
                         ids=["liger-GRPOConfig", "liger-STAPOConfig", "luspo-GRPOConfig"])  # fmt: skip
def test_a_path_around_the_mask_before_the_trl_that_masks_it_is_refused_at_construction(
    tiny_random_model_path, tmp_path, no_model_built, refusal, config, trainer, layout
):  # Liger before trl 1.14 never calls _compute_loss; token-level LUSPO before 1.10 counts every token's loss
    settings, fixed_in, parts = refusal
    if TRL >= Version(fixed_in):
        pytest.skip(f"trl >= {fixed_in} applies the mask")
    trainer_cls, config_cls = TRAINERS[trainer]
    settings = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=4,
                    num_generations=2, max_completion_length=8, **settings, **LAYOUTS[layout])  # fmt: skip
    with warnings.catch_warnings():  # the refusal comes before TRL's own checks (that Liger is installed)
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError) as error:
            args = GRPOConfig(**settings) if config == "GRPOConfig" else config_cls(**settings)
            trainer_cls(tiny_random_model_path, reward_funcs=length_reward, args=args, train_dataset=PROMPTS)
    (line,) = str(error.value).splitlines()
    assert line.startswith(parts[0]) and all(part in line for part in parts), line


def test_no_setting_is_refused_where_the_installed_trl_applies_the_mask():
    for settings, fixed_in, *_ in [LIGER, LUSPO, (dict(loss_type="luspo", importance_sampling_level="sequence"), "0")]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = GRPOConfig(output_dir="unused", use_cpu=True, bf16=False, **settings)
        if TRL >= Version(fixed_in):
            assert refuse_paths_around_the_mask(args) is None
        else:
            with pytest.raises(ValueError, match=f"trl {trl.__version__}"):
                refuse_paths_around_the_mask(args)


@pytest.mark.parametrize("switch", ["trainer import only", "two imports"])
def test_s2t_settings_in_trls_grpo_script_yaml_take_effect_or_are_said_to_be_ignored(tiny_random_model_path, tmp_path,
                                                                                     switch):  # fmt: skip
    # TRL's grpo.py parses its own GRPOConfig with fail_with_unknown_args=False: the YAML's s2t values were dropped
    from trl.scripts.grpo import make_parser

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"output_dir: {tmp_path / 'run'}\nuse_cpu: true\nbf16: false\nreport_to: none\n"
                      "per_device_train_batch_size: 4\nnum_generations: 2\nmax_completion_length: 8\n"
                      "s2t_prob_threshold: 0.01\n")  # fmt: skip
    parser = make_parser()  # TRL's own: (GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig)
    if switch == "two imports":  # a copy of the script with `from stapo_trl import STAPOConfig as GRPOConfig`
        parser = trl.TrlParser([STAPOConfig if t is GRPOConfig else t for t in parser.dataclass_types])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, training_args, *_ = parser.parse_args_and_config(["--config", str(recipe)], fail_with_unknown_args=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = CoreSTAPOTrainer(tiny_random_model_path, reward_funcs=length_reward, args=training_args,
                                   train_dataset=PROMPTS)  # fmt: skip
    lines = [str(w.message) for w in caught if str(w.message).startswith("STAPO with ")]
    if switch == "two imports":
        assert trainer.s2t.prob_threshold == 0.01 and "ignored" not in " ".join(lines)
        return
    (line,) = lines
    assert trainer.s2t.prob_threshold == 0.002 and ("GRPOConfig has no s2t_prob_threshold, s2t_entropy_quantile, "
        "s2t_mode fields, and such values given to it, in a YAML file say, are ignored; to set them, use `from "
        "stapo_trl import STAPOConfig as GRPOConfig`") in line  # fmt: skip
