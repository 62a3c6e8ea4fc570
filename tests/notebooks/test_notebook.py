"""`notebooks/s2t_exploration.ipynb`, the paper's companion: committed without outputs, run headless by the README's
command (which keeps the outputs), and every claim it prints asserted in the cell that prints it, so that a claim
that does not hold is a cell error and fails the run."""

import re
import sys
from pathlib import Path

import pytest
from testing_utils import REPO, run_subprocess, subprocess_env


nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

NOTEBOOK = REPO / "notebooks" / "s2t_exploration.ipynb"


def test_notebook_is_committed_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, "clear the outputs before committing"


@pytest.mark.parametrize("by_hand", ["MetricsLogCallback", "SpuriousTokenLogger", "callbacks="])
def test_notebook_leaves_the_run_file_callbacks_to_train(by_hand):
    # `STAPOTrainer.train()` adds both run-file callbacks: the notebook added them again, for nothing.
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    assert by_hand not in code


def _execute(tmp_path, model_path: str, **env: str) -> str:
    """Run the README's headless command (`jupyter execute --output=... notebooks/s2t_exploration.ipynb`) on a copy, in
    a kernel with this environment, `model_path` (no rebuild), the small sizes and `env`. Checks what every run must
    show and returns the text of the outputs (streams and tables)."""
    (command,) = re.findall(r"`\.venv/bin/(jupyter execute [^`]+)`", (REPO / "README.md").read_text())
    words = command.split()
    (output_name,) = [word.removeprefix("--output=") for word in words if word.startswith("--output=")]
    copy = tmp_path / words[-1]
    copy.parent.mkdir(parents=True)
    copy.write_bytes(NOTEBOOK.read_bytes())
    env = subprocess_env(
        STAPO_NOTEBOOK_MODEL=model_path, STAPO_NOTEBOOK_SMALL="1", STAPO_NOTEBOOK_OUTPUT=str(tmp_path / "out"),
        MPLBACKEND="Agg", **env,
    )  # fmt: skip
    # A cell error (a claim that does not hold) is a non-zero exit: run_subprocess fails the test with its traceback.
    run_subprocess([str(Path(sys.executable).parent / words[0]), *words[1:]], timeout=1200, env=env, cwd=tmp_path)
    executed = nbformat.read(copy.parent / f"{output_name}.ipynb", as_version=4)
    outputs = [out for cell in executed.cells if cell.cell_type == "code" for out in cell.outputs]
    # No warning at all: it printed tqdm's "IProgress not found" (no ipywidgets) and TRL's deprecation notes.
    assert not [out.text for out in outputs if out.get("name") == "stderr"]
    assert sum("image/png" in out.get("data", {}) for out in outputs) >= 4  # the batch's plane, the run's 3 figures
    for name in ("metrics.jsonl", "spurious_tokens.jsonl"):  # written by train() on its own
        assert (tmp_path / "out" / "stapo_run" / name).stat().st_size > 0, name
    text = "\n".join(out.get("text", "") + out.get("data", {}).get("text/plain", "") for out in outputs)
    # The claims, each printed by the cell that asserts it: every token inside the bounds, every low-p token with
    # p < e^-H raising the entropy, the mask equal to the rule recomputed by hand.
    theorem = re.findall(r"Theorem 3\.3: (\d+) of (\d+) inside", text)
    assert theorem and all(inside == total != "0" for inside, total in theorem), theorem
    assert re.search(r"Lemma 3\.2: a positive step raises H at (\d+) of \1 low-p tokens", text), text[-3000:]
    assert "as the rule recomputed by hand" in text
    # The training section at the demo's learning rate (the notebook trained at 3e-4, which breaks the model).
    assert re.search(r"40 updates at lr 0\.0001: mean reward \d\.\d\d \(first 2 rollout batches\)", text)
    return text


@pytest.mark.slow  # a kernel, the claims on one batch, 40 updates and their figures: ~1 min on 2 busy cores
def test_notebook_runs_as_the_readme_prints_it_and_asserts_the_papers_claims(tiny_math_model_path, tmp_path):
    # Without the real model's wheel (an empty wheel search path), its section says how to install it and skips.
    text = _execute(tmp_path, tiny_math_model_path, STAPO_TRL_WHEELS_PATH=str(tmp_path / "no-wheels"))
    skipped = [line for line in text.splitlines() if line.startswith("Skipped: ")]
    assert len(skipped) == 1 and "make install-real-models" in skipped[0], skipped
    assert len(re.findall("Theorem 3.3", text)) == 1


@pytest.mark.slow
@pytest.mark.real_model("smollm2-135m")
def test_notebook_checks_the_claims_on_the_shipped_smollm2(tiny_math_model_path, smollm2_path, tmp_path):
    """The real-model section ran only on the SFT-warmed builtin:smollm2-135m-math (an ~11 min build, `make test-build`
    only): it runs on builtin:smollm2-135m as shipped, converted once per session (`smollm2_path`, in the session's
    cache, which the notebook reads through STAPO_TRL_CACHE)."""
    text = _execute(tmp_path, tiny_math_model_path, STAPO_TRL_CACHE=str(Path(smollm2_path).parent))
    assert "Skipped: " not in text and "builtin:smollm2-135m: " in text
    assert len(re.findall("Theorem 3.3", text)) == 2 and len(re.findall("as the rule recomputed by hand", text)) == 2
    assert (tmp_path / "out" / "exploration" / "real_model_prob_entropy.png").stat().st_size > 10_000
