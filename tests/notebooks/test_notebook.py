"""`notebooks/s2t_exploration.ipynb` executes top to bottom (offline, CPU) and is committed without outputs."""

import pytest
from testing_utils import REPO


nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = REPO / "notebooks" / "s2t_exploration.ipynb"


def test_notebook_is_committed_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, "clear the outputs before committing"


@pytest.mark.parametrize("by_hand", ["MetricsLogCallback", "SpuriousTokenLogger", "callbacks="])
def test_notebook_leaves_the_run_file_callbacks_to_train(by_hand):
    """`STAPOTrainer.train()` adds both run-file callbacks itself (`s2t_write_run_files`), so the
    notebook passed `callbacks=[MetricsLogCallback()]` and added a `SpuriousTokenLogger` for nothing."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    assert by_hand not in code


def _execute(tmp_path, monkeypatch, model_path: str) -> list:
    """Run the notebook in a kernel that inherits this environment: `model_path` (no rebuild), offline, and the small
    sizes (fewer prompts, steps and real-model tokens). Returns the code cells' outputs."""
    monkeypatch.setenv("STAPO_NOTEBOOK_MODEL", model_path)
    monkeypatch.setenv("STAPO_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("STAPO_NOTEBOOK_OUTPUT", str(tmp_path / "outputs"))  # figures and the short run
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError with the failing cell's traceback
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    assert sum("image/png" in out.get("data", {}) for out in outputs) >= 4  # scatter, bars, training figures
    for name in ("metrics.jsonl", "spurious_tokens.jsonl"):  # written by train() on its own
        assert (tmp_path / "outputs" / "stapo_run" / name).stat().st_size > 0, name
    return outputs


def _text(outputs) -> str:
    return "".join(out.get("text", "") for out in outputs if out.output_type == "stream")


@pytest.mark.slow  # the notebook trains a short run and draws its figures: 15-90 s on 2 cores, with the load
def test_notebook_executes(tiny_math_model_path, tmp_path, monkeypatch):
    # Without the real model's wheel (an empty wheel search path), its section says how to install it and skips.
    monkeypatch.setenv("STAPO_TRL_WHEELS_PATH", str(tmp_path / "no-wheels"))
    outputs = _execute(tmp_path, monkeypatch, str(tiny_math_model_path))
    skipped = [line for line in _text(outputs).splitlines() if line.startswith("Skipped: ")]
    assert len(skipped) == 1 and "make install-real-models" in skipped[0], skipped


@pytest.mark.build  # the notebook builds builtin:smollm2-135m-math in the session's cache (~11 min on 2 cores)
@pytest.mark.real_model("smollm2-135m")
def test_notebook_real_model_section_draws_the_census(
    tiny_math_model_path, smollm2_path, builtin_cache_dir, tmp_path, monkeypatch
):
    # The notebook's default real model, builtin:smollm2-135m-math: the base SmolLM2 boxes almost no answer, so its
    # groups have no positive advantage and nothing to draw. Built on the session's converted base (`smollm2_path`).
    monkeypatch.setenv("STAPO_TRL_CACHE", str(builtin_cache_dir))
    outputs = _execute(tmp_path, monkeypatch, str(tiny_math_model_path))
    assert "Skipped: " not in _text(outputs)
    assert "builtin:smollm2-135m-math: " in _text(outputs) and "sampled tokens; candidates" in _text(outputs)
    assert (tmp_path / "outputs" / "exploration" / "real_model_prob_entropy.png").stat().st_size > 1000
