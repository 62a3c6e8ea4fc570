"""`notebooks/s2t_exploration.ipynb` executes top to bottom (offline, CPU) and is committed without outputs."""

import time
from pathlib import Path

import pytest


nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "s2t_exploration.ipynb"


def test_notebook_is_committed_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, "clear the outputs before committing"


@pytest.mark.parametrize("by_hand", ["MetricsLogCallback", "SpuriousTokenLogger", "callbacks="])
def test_notebook_leaves_the_run_file_callbacks_to_train(by_hand):
    """Issue 23, item 9: `STAPOTrainer.train()` adds both run-file callbacks itself (`s2t_write_run_files`), so the
    notebook passed `callbacks=[MetricsLogCallback()]` and added a `SpuriousTokenLogger` for nothing."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    assert by_hand not in code


def test_notebook_executes(tiny_math_model_path, tmp_path, monkeypatch):
    # The kernel inherits this environment: the session's cached model (no rebuild), offline, and the small sizes
    # (fewer prompts and steps) that keep the run well under the notebook's 3-minute budget on 2 CPU cores.
    monkeypatch.setenv("STAPO_NOTEBOOK_MODEL", str(tiny_math_model_path))
    monkeypatch.setenv("STAPO_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("STAPO_NOTEBOOK_OUTPUT", str(tmp_path / "outputs"))  # figures and the short run
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError with the failing cell's traceback
    assert time.perf_counter() - start < 180, "the notebook must run in under 3 minutes on CPU"
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    assert sum("image/png" in out.get("data", {}) for out in outputs) >= 4  # scatter, bars, training figures
    for name in ("metrics.jsonl", "spurious_tokens.jsonl"):  # written by train() on its own
        assert (tmp_path / "outputs" / "stapo_run" / name).stat().st_size > 0, name
