"""`notebooks/s2t_exploration.ipynb`: committed without outputs; the README's command runs it, asserting its claims."""

import re
import sys
from pathlib import Path

import pytest
from testing_utils import REPO, run_subprocess, subprocess_env


nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

NOTEBOOK = REPO / "notebooks" / "s2t_exploration.ipynb"


def test_notebook_is_committed_without_outputs_and_leaves_the_run_file_callbacks_to_train():
    cells = [cell for cell in nbformat.read(NOTEBOOK, as_version=4).cells if cell.cell_type == "code"]
    assert all(not cell.outputs and cell.execution_count is None for cell in cells), "clear the outputs first"
    code = "\n".join(cell.source for cell in cells)  # `STAPOTrainer.train()` adds both run-file callbacks
    assert not [by_hand for by_hand in ("MetricsLogCallback", "SpuriousTokenLogger", "callbacks=") if by_hand in code]


@pytest.mark.slow  # a kernel, the claims on one batch, 40 updates and their figures: ~1 min on 2 busy cores
@pytest.mark.parametrize("real", [False, pytest.param(True, marks=pytest.mark.real_model("smollm2-135m"))],
                         ids=["no-wheel", "smollm2"])  # fmt: skip
def test_notebook_runs_as_the_readme_prints_it_and_asserts_the_papers_claims(tiny_math_model_path, tmp_path, request,
                                                                             real):  # fmt: skip
    # Without the real model's wheel its section says how to install it; with it, builtin:smollm2-135m as shipped.
    if real:
        env = {"STAPO_TRL_CACHE": str(Path(request.getfixturevalue("smollm2_path")).parent)}
    else:
        env = {"STAPO_TRL_WHEELS_PATH": str(tmp_path / "no-wheels")}
    (command,) = re.findall(r"`\.venv/bin/(jupyter execute [^`]+)`", (REPO / "README.md").read_text())
    words = command.split()  # the README's command, on a copy
    (output_name,) = [word.removeprefix("--output=") for word in words if word.startswith("--output=")]
    copy = tmp_path / words[-1]
    copy.parent.mkdir(parents=True)
    copy.write_bytes(NOTEBOOK.read_bytes())
    env = subprocess_env(STAPO_NOTEBOOK_MODEL=tiny_math_model_path, STAPO_NOTEBOOK_SMALL="1", MPLBACKEND="Agg",
                         STAPO_NOTEBOOK_OUTPUT=str(tmp_path / "out"), **env)  # fmt: skip
    run_subprocess([str(Path(sys.executable).parent / words[0]), *words[1:]], timeout=1200, env=env, cwd=tmp_path)
    executed = nbformat.read(copy.parent / f"{output_name}.ipynb", as_version=4)
    outputs = [out for cell in executed.cells if cell.cell_type == "code" for out in cell.outputs]
    # No warning at all: it printed tqdm's "IProgress not found" (no ipywidgets) and TRL's deprecation notes.
    assert not [out.text for out in outputs if out.get("name") == "stderr"]
    assert sum("image/png" in out.get("data", {}) for out in outputs) >= 4  # the batch's plane, the run's 3 figures
    for name in ("metrics.jsonl", "spurious_tokens.jsonl"):  # written by train() on its own
        assert (tmp_path / "out" / "stapo_run" / name).stat().st_size > 0, name
    text = "\n".join(out.get("text", "") + out.get("data", {}).get("text/plain", "") for out in outputs)
    theorem = re.findall(r"Theorem 3\.3: (\d+) of (\d+) inside", text)
    assert theorem and all(inside == total != "0" for inside, total in theorem), theorem
    assert re.search(r"Lemma 3\.2: a positive step raises H at (\d+) of \1 low-p tokens", text), text[-3000:]
    assert re.search(r"40 updates at lr 0\.0001: mean reward \d\.\d\d \(first 2 rollout batches\)", text)
    assert len(re.findall("Theorem 3.3", text)) == len(re.findall("as the rule recomputed by hand", text)) == 1 + real
    skipped = [line for line in text.splitlines() if line.startswith("Skipped: ")]
    if real:
        assert not skipped and "builtin:smollm2-135m: " in text
        assert (tmp_path / "out" / "exploration" / "real_model_prob_entropy.png").stat().st_size > 10_000
    else:
        assert len(skipped) == 1 and "make install-real-models" in skipped[0], skipped
