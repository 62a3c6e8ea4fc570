"""`grade` and `is_correct` (`stapo_trl.grading.api`): the known traps of boxed answers against benchmark golds,
unparseable golds that never give credit, the result's fields, upright constants and operators, and formats a new user
tries. The parts are tested in the files of their modules; the real benchmark golds in `test_benchmark_golds.py`."""

import pytest

from stapo_trl.grading import GRADER_STATS, grade, is_correct


# ----------------------------------------------------------------------------------------------------------------
# Known traps
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        (r"\boxed{\frac{1}{3}}", r"\frac{1}{3}", True),
        (r"\boxed{\dfrac{1}{3}}", "1/3", True),
        (r"\boxed{0.5}", r"\frac{1}{2}", True),
        (r"\boxed{3} ... so finally \boxed{4}", "4", True),
        (r"\boxed{4} ... so finally \boxed{3}", "4", False),
        ("The answer is 4", "4", False),  # no box
        (r"\boxed{\text{13}}", "13", True),
        (r"\boxed{13}", r"\text{13}", True),
        (r"\boxed{25}", "025", True),  # leading zeros (AIME json golds)
        (r"\boxed{025}", "25", True),
        (r"\boxed{27}", 27.0, True),  # float gold (AMC23 jsonl)
        (r"\boxed{27.0}", "27", True),
        (r"\boxed{28}", 27.0, False),
        (r"\boxed{204}", r"\boxed{204}", True),  # verl ground truth keeps the box
        (r"\boxed{\frac{1}{2}}", r"$\frac{1}{2}$", True),  # $-wrapped gold (OlympiadBench)
        (r"\boxed{1,000}", "1000", True),
        (r"\boxed{-3}", "3", False),
        (r"\boxed{x = 5}", "5", True),
        (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)", True),
        (r"\boxed{4.5 \times 10^{33}}", "4.5e33", True),  # Python-style Minerva gold
        (r"\boxed{\arcsin(10/13)}", "np.arcsin(10/13)", True),
        (r"\boxed{-\frac{1}{3}}", "-1./3", True),
        (r"\boxed{84, 69}", ["$69$", "$84$"], True),  # multi-answer: any order
        (r"\boxed{69}", ["$69$", "$84$"], False),  # multi-answer: all parts needed
        (r"\boxed{69} and \boxed{84}", "$69$,$84$", True),  # one box per part
        (r"\boxed{2,0,-2}", "$-2,0,2$", True),
        ("", "5", False),
        (None, "5", False),
    ],
)
def test_known_traps(completion, gold, expected):
    assert is_correct(completion, gold) is expected


def test_unparseable_gold_never_credits():
    GRADER_STATS.clear()
    for gold in [r"\frac{", "", None, [], r"\unknowncommand{{"]:
        for completion in [rf"\boxed{{{gold}}}", r"\boxed{1}", ""]:
            result = grade(completion, gold)
            assert not result.correct, (completion, gold)
    result = grade(r"\boxed{1}", r"\frac{")
    assert not result.correct and result.error and result.error.startswith("gold unparseable")
    assert GRADER_STATS["gold_unparseable"] >= 1


def test_grade_result_fields():
    result = grade(r"We get \boxed{\frac{2}{4}}.", "1/2")
    assert result.correct and result.extracted == r"\frac{2}{4}" and result.error is None
    result = grade("no box here", "1/2")
    assert not result.correct and result.extracted is None and result.error is None


# ----------------------------------------------------------------------------------------------------------------
# Upright constants and operators; formats a new user tries
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        (r"\boxed{\mathrm{e}^{2}}", "e^2", True),  # the reported cases: upright \mathrm{e} is the constant e
        (r"\boxed{1-\frac{1}{e}}", r"1 - \frac{1}{\mathrm{e}}", True),
        (r"\boxed{1+\frac{1}{\mathrm{e}}}", r"1 - \frac{1}{\mathrm{e}}", False),  # no false positive back
        (r"\boxed{1 + \frac{1}{\mathrm{e}}}", r"1 - \frac{1}{e}", False),
        (r"\boxed{3+2\mathrm{i}}", "3+2i", True),
        (r"\boxed{3-2\mathrm{i}}", "3+2i", False),
        (r"\boxed{\operatorname{arcsin}\frac{1}{2}}", r"\frac{\pi}{6}", True),
        (r"\boxed{\mathrm{sin}\frac{\pi}{6}}", r"\frac{1}{2}", True),
        (r"\boxed{{\rm e}^{-1}}", r"\frac{1}{e}", True),
        (r"\boxed{\frac{\mathrm{d}y}{\mathrm{d}x}}", r"\frac{dy}{dx}", True),
        (r"\boxed{\ln \mathrm{e}^{3}}", "3", True),
    ],
)
def test_upright_constants_and_operators(completion, gold, expected):
    result = grade(completion, gold)
    assert result.correct is expected and result.error is None, result


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        # Found by trying formats as a new user (the README's grader line): each was graded wrong before.
        (r"\boxed{12\,345}", "12345", True),  # thin space between digit groups
        (r"\boxed{1\,000\,000}", "1000000", True),
        (r"\boxed{12\,346}", "12345", False),
        (r"\boxed{x > 3}", r"(3,\infty)", True),  # an inequality against an interval gold
        (r"\boxed{x \le 2}", r"(-\infty, 2]", True),
        (r"\boxed{x < 2}", r"(-\infty, 2]", False),
        (r"\boxed{0.\overline{3}}", r"\frac{1}{3}", True),  # repeating decimals
        (r"\boxed{1.2\overline{45}}", r"\frac{137}{110}", True),  # 1.24545... = 137/110
        (r"\boxed{0.\overline{6}}", r"\frac{1}{3}", False),
        ("\\boxed{30°}", "30", True),  # Unicode symbols
        ("\\boxed{2π}", r"2\pi", True),
        ("\\boxed{3×10^{8}}", "300000000", True),
        ("\\boxed{45°}", "30", False),
    ],
)
def test_new_user_formats(completion, gold, expected):
    result = grade(completion, gold)
    assert result.correct is expected and result.error is None, result
