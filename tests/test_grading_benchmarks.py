"""The grader against the one it replaced (`PREVIOUS`, read from git; skips without it or ../shared/data) on every
gold of the real benchmarks: every gold grades as before, every other disagreement is a row of docs/evaluation.md's
table (`python tests/test_grading_benchmarks.py` prints them as rows)."""

import importlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stapo_trl import grading
from stapo_trl.evaluation.tasks import normalize_records, read_rows
from stapo_trl.grading import grade


REPO = Path(__file__).resolve().parents[1]
PREVIOUS = "ff523c7"  # the last commit with the previous grader, stapo_trl/grading/ (eight modules)
PREVIOUS_MODULES = ("__init__", "api", "bound", "choice", "extract", "normalize", "verify", "workers")
DOC = REPO / "docs" / "evaluation.md"


def load_previous(folder: Path):
    package = folder / "_previous_grading"
    package.mkdir(exist_ok=True)
    for name in PREVIOUS_MODULES:
        shown = subprocess.run(["git", "-C", str(REPO), "show", f"{PREVIOUS}:stapo_trl/grading/{name}.py"],
                               capture_output=True, text=True)  # fmt: skip
        if shown.returncode != 0:
            return None
        (package / f"{name}.py").write_text(shown.stdout)
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("_previous_grading")
    finally:
        sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def previous_grader(tmp_path_factory):
    previous = load_previous(tmp_path_factory.mktemp("previous"))
    if previous is None:
        pytest.skip(f"the previous grader is not in this checkout's history ({PREVIOUS})")
    return previous


def benchmark_golds(data_dir: Path) -> dict[str, list]:
    golds: dict[str, dict] = {}
    for path in sorted(data_dir.glob("*/*")):
        if path.suffix in (".json", ".jsonl", ".parquet"):
            for problem in normalize_records(read_rows(path)):
                golds.setdefault(path.parent.name, {}).setdefault(repr(problem.gold), problem.gold)
    return {name: list(by_repr.values()) for name, by_repr in golds.items()}


def _text(gold) -> str:
    return gold if isinstance(gold, str) else ", ".join(gold)


_NUMBER = re.compile(r"[+-]?\d+(\.\d+)?")
_DECIMAL = re.compile(r"[+-]?(\d*\.\d+|\d+)([eE][+-]?\d+)?")
_FRACTION = re.compile(r"\\d?frac\{(\d+)\}\{(\d+)\}|(\d+)/(\d+)")
_LETTER = re.compile(r"\\text\{\(([A-E])\)\}")


def answers(golds: list) -> list[tuple[object, str]]:
    out = []
    for i, gold in enumerate(golds):
        text = _text(gold)
        out += [(gold, text), (gold, f"{text}.")]  # itself; with a period
        if not text.startswith("$"):
            out.append((gold, f"${text}$"))
        if _NUMBER.fullmatch(text):
            out.append((gold, rf"\text{{{text}}}"))
            out.append((gold, str(int(text) + 1 if "." not in text else float(text) + 1)))  # wrong
        if (m := _FRACTION.fullmatch(text.strip("$"))) is not None:
            num, den = (int(x) for x in m.groups() if x)
            out.append((gold, f"{num / den:.10g}"))
        if _DECIMAL.fullmatch(text.strip("$")) and ("." in text or "e" in text.lower()):
            value = float(text.strip("$"))
            out.append((gold, np.format_float_positional(value, trim="-")))
            wrong = np.format_float_positional(value * 1.1, trim="-", precision=6, fractional=False)  # by 10 %
            out.append((gold, wrong))
        if isinstance(gold, list) and len(gold) > 1:
            out.append((gold, ", ".join(reversed(gold))))
        if (m := _LETTER.fullmatch(text)) is not None:
            out += [(gold, m.group(1)), (gold, f"({m.group(1)})"), (gold, rf"\textbf{{({m.group(1)})}}")]
        if _text(other := golds[(i + 7) % len(golds)]) != text:
            out.append((gold, _text(other)))  # another problem's gold: wrong
    return out


def verdicts(grader, golds: dict[str, list], only_self: bool = False) -> dict[tuple, bool]:
    return {
        (name, _text(gold), answer): grader.grade(rf"The answer is $\boxed{{{answer}}}$.", gold).correct
        for name, benchmark in golds.items()
        for gold, answer in ([(g, _text(g)) for g in benchmark] if only_self else answers(benchmark))
    }


def disagreements(before: dict[tuple, bool], now: dict[tuple, bool]) -> set[tuple]:
    return {(*key, int(before[key]), int(now[key])) for key in now if before[key] != now[key]}


@pytest.fixture(scope="module")
def golds(shared_data_dir):
    return benchmark_golds(shared_data_dir)


@pytest.fixture(scope="module")
def own_golds_now(golds):
    return verdicts(grading, golds, only_self=True)


def documented() -> set[tuple]:
    rows = set()
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 6 and cells[1].startswith("`") and cells[3] in ("0", "1"):
            rows.add((cells[0], cells[1].strip("`"), cells[2].strip("`"), int(cells[3]), int(cells[4])))
    return rows


@pytest.mark.slow  # grades ~1,850 golds (~20 s)
def test_every_benchmark_grades_its_own_golds_correct(golds, own_golds_now):
    assert set(golds) == {"aime24", "aime25", "amc23", "dapo_math_17k", "gsm8k", "math500", "minerva", "mixed",
                          "olympiadbench"}  # fmt: skip
    assert len(own_golds_now) == sum(map(len, golds.values())) > 1800
    # The two golds that math-verify does not parse: `E` with a subscript (Minerva), a malformed interval (Olympiad).
    wrong = {key[:2] for key, correct in own_golds_now.items() if not correct}
    assert wrong == {("minerva", "E_{1},E_{2}"), ("olympiadbench", "$t(0,4]$")}


@pytest.mark.slow  # grades ~1,850 golds (~20 s)
def test_every_gold_grades_as_before(golds, own_golds_now, previous_grader):
    assert disagreements(verdicts(previous_grader, golds, only_self=True), own_golds_now) == set()


@pytest.mark.slow
def test_every_disagreement_is_a_row_of_the_docs_table(golds, previous_grader):
    found = disagreements(verdicts(previous_grader, golds), verdicts(grading, golds))
    assert found == {row for row in documented() if row[0] != "hand"}


def test_the_hand_rows_of_the_docs_table_are_the_verdicts_of_both_graders(previous_grader):
    rows = [row for row in documented() if row[0] == "hand"]
    assert len(rows) >= 5
    for _, gold, answer, before, now in rows:
        completion = answer if "\\boxed" in answer else rf"\boxed{{{answer}}}"
        assert (previous_grader.grade(completion, gold).correct, grade(completion, gold).correct) == (before, now)


if __name__ == "__main__":
    import tempfile

    previous = load_previous(Path(tempfile.mkdtemp()))
    golds = benchmark_golds(REPO.parent / "shared" / "data")
    for row in sorted(disagreements(verdicts(previous, golds), verdicts(grading, golds))):
        print(f"| {row[0]} | `{row[1]}` | `{row[2]}` | {row[3]} | {row[4]} | |")
