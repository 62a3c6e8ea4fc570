"""The private TRL surface `STAPOTrainer` overrides or reads: fails loudly, naming the hook, on a TRL that changes it.

`setup.cfg` pins `trl>=1.16.0,<1.17` because of this list. Each check reads TRL's own code (`inspect`), builds no
trainer, and runs in well under a second. When a check fails, the message names the hook and where stapo_trl uses
it: re-read TRL's new code there before widening the pin.
"""

import inspect

import pytest
from trl import GRPOTrainer
from trl.models import utils as trl_model_utils
from trl.trainer import utils as trl_trainer_utils

from stapo_trl.core import stapo_trainer


# (method of GRPOTrainer, parameter names stapo_trl passes or relies on, where stapo_trl uses it)
PRIVATE_METHODS = [
    ("_compute_loss", ["model", "inputs"], "STAPOTrainer._compute_loss wraps it (s2t_scope='micro_batch')"),
    (
        "_get_per_token_logps_and_entropies",
        ["model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy", "compute_aux_loss"]
        + list(stapo_trainer._FORWARD_INPUT_KEYS),
        "STAPOTrainer._get_per_token_logps_and_entropies / _policy_logps_and_entropies call it by keyword",
    ),
    ("_generate_and_score_completions", ["inputs"], "STAPOTrainer._generate_and_score_completions wraps it"),
    ("_prepare_inputs", ["generation_batch"], "STAPOTrainer._prepare_inputs wraps it and reads _buffered_inputs"),
    ("log", ["logs", "start_time"], "STAPOTrainer.log drops all-NaN s2t/ metrics before calling it"),
    ("create_model_card", ["model_name", "dataset_name", "tags"], "STAPOTrainer.create_model_card extends it"),
    ("_load_from_checkpoint", ["resume_from_checkpoint"], "stapo_trl.cli.run resumes weights through it"),
]

# Attributes GRPOTrainer.__init__ must set, which STAPOTrainer reads.
INIT_ATTRIBUTES = [
    "_buffered_inputs",
    "_metrics",
    "temperature",
    "loss_type",
    "epsilon_low",
    "epsilon_high",
    "aux_loss_enabled",
    "use_vllm",
    "vllm_importance_sampling_correction",
]

# Keys of the scored batch that TRL's `_compute_loss` reads, through which the S2T mask and its normaliser enter.
LOSS_INPUT_KEYS = ['inputs["num_items_in_batch"]', '"tool_mask"', 'inputs.get("old_per_token_logps")']


@pytest.mark.parametrize("name, params, used_by", PRIVATE_METHODS, ids=[m[0] for m in PRIVATE_METHODS])
def test_private_method_exists_with_the_parameters_stapo_uses(name, params, used_by):
    method = getattr(GRPOTrainer, name, None)
    assert method is not None, f"TRL removed GRPOTrainer.{name}, which {used_by}."
    signature = inspect.signature(method)
    missing = [p for p in params if p not in signature.parameters]
    assert not missing, f"TRL changed GRPOTrainer.{name}{signature}: parameters {missing} are gone ({used_by})."


@pytest.mark.parametrize("attribute", INIT_ATTRIBUTES)
def test_init_sets_the_attributes_stapo_reads(attribute):
    source = inspect.getsource(GRPOTrainer.__init__)
    assert f"self.{attribute} =" in source, f"TRL's GRPOTrainer.__init__ no longer sets self.{attribute}."


@pytest.mark.parametrize("key", LOSS_INPUT_KEYS)
def test_compute_loss_reads_the_inputs_stapo_writes(key):
    # STAPOTrainer multiplies the keep mask into `tool_mask` and replaces `num_items_in_batch`; if TRL's loss stops
    # reading them, the mask would silently do nothing.
    source = inspect.getsource(GRPOTrainer._compute_loss)
    assert key in source, f"TRL's GRPOTrainer._compute_loss no longer reads {key}: the S2T mask would be ignored."


def test_old_logps_forward_runs_under_vllm_importance_sampling():
    # generation_batch scope reuses the old-log-prob forward TRL runs for the vLLM IS correction (no extra forward).
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "old_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(" in source, (
        "TRL's _generate_and_score_completions no longer computes old_per_token_logps through "
        "_get_per_token_logps_and_entropies: STAPOTrainer._apply_s2t could not reuse that forward."
    )
    assert "self.use_vllm and self.vllm_importance_sampling_correction" in source


def test_helper_functions():
    fused = inspect.signature(trl_trainer_utils.add_fused_lm_head)
    assert {"model", "temperature", "cast_lm_head_to_fp32", "outputs"} <= set(fused.parameters), (
        f"TRL changed add_fused_lm_head{fused} (stapo_trl.core.s2t_metrics.CollisionProbabilityRecorder)."
    )
    assert "log_sum_sq_probs" in inspect.getsource(trl_trainer_utils), (
        "TRL's fused LM head no longer offers 'log_sum_sq_probs' (stapo_trl.core.s2t_metrics.CollisionProbabilityRecorder)."
    )
    disable = inspect.signature(trl_model_utils.disable_gradient_checkpointing)
    assert list(disable.parameters)[:2] == ["model", "gradient_checkpointing_kwargs"], (
        f"TRL changed disable_gradient_checkpointing{disable} (STAPOTrainer._policy_logps_and_entropies)."
    )
