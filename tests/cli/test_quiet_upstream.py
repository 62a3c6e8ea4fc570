"""`quiet_upstream`: known-harmless upstream warnings silenced by message, category and module only."""

from __future__ import annotations

import warnings

import pytest
from transformers import AutoModelForCausalLM

from stapo_trl.cli.errors import quiet_upstream


def test_gradient_checkpointing_future_warning_is_silenced_precisely(tiny_math_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_math_model_path)
    deprecated = "`is_gradient_checkpointing` is deprecated and will be removed in v6. Use X."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.is_gradient_checkpointing  # noqa: B018 (the property warns)
        with quiet_upstream():
            model.is_gradient_checkpointing  # noqa: B018
            model.gradient_checkpointing_enable()  # TRL's generation unwrap calls the old names too
            model.gradient_checkpointing_disable()
            warnings.warn("another FutureWarning", FutureWarning, stacklevel=1)  # other messages still show
            warnings.warn_explicit(deprecated, FutureWarning, "mylib.py", 1, module="mylib")  # other modules too
            warnings.warn_explicit(deprecated, UserWarning, "utils.py", 1, module="transformers.modeling_utils")
        model.is_gradient_checkpointing  # noqa: B018 (the filter ends with the block)
    old, other = ("FutureWarning", deprecated[:41]), ("FutureWarning", "another FutureWarning")
    shown = [(w.category.__name__, str(w.message)[:41]) for w in caught]
    assert shown == [old, other, old, ("UserWarning", old[1]), old]


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.33.0"])
def test_trl_vllm_range_warning_is_silenced_by_its_text_and_module_inside_the_block(version):
    # TRL's own warning, word for word (trl/import_utils.py): the text the filter is keyed on.
    text = (f"TRL currently supports vLLM versions from 0.22.0 to 0.31.0. You have version {version} installed. We "
            "recommend installing a supported version to avoid compatibility issues.")  # fmt: skip

    def shown(module: str, inside: bool) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with quiet_upstream() if inside else warnings.catch_warnings():
                warnings.warn_explicit(text, UserWarning, "import_utils.py", 1, module=module)
        return [str(w.message) for w in caught]

    assert shown("trl.import_utils", inside=False) == [text] == shown("my_project", inside=True)  # outside TRL: shown
    assert shown("trl.import_utils", inside=True) == ([] if version != "0.33.0" else [text])
