"""Result lines of torchrun workers (`testing_utils.run_torchrun`): two ranks write to one unbuffered pipe, and the
tests count the lines each rank reports, so every reported line must arrive whole."""

import textwrap

import pytest
from testing_utils import run_torchrun


# Each rank reports 400 lines of several parts at once, the shape that split ("label:label: [] []") with print().
CONCURRENT_LINES_WORKER = textwrap.dedent(
    r"""
    import os
    rank = os.environ["RANK"]
    for i in range(400):
        report(f"rank {rank} line {i}:", [], "end")
    """
)


@pytest.mark.slow  # two processes under torchrun; one write per line in-process: tests/cli/test_errors.py
def test_two_ranks_reporting_at_once_give_whole_lines(tmp_path):
    output = run_torchrun(CONCURRENT_LINES_WORKER, tmp_path / "worker.py", nproc=2, timeout=120)
    lines = output.splitlines()
    for rank in (0, 1):
        missing = [i for i in range(400) if lines.count(f"rank {rank} line {i}: [] end") != 1]
        assert not missing, (rank, missing[:10], output[-2000:])
