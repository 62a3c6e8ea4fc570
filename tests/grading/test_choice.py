"""Multiple-choice answers (`stapo_trl.grading.choice`): the option letter decides against a letter gold, a numeric
gold keeps numeric grading."""

import pytest

from stapo_trl import grading
from stapo_trl.grading import is_correct


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        (r"\boxed{\text{C: } 12}", "C", True),  # the reported cases: the letter with its value
        (r"$\boxed{\textbf{(C)}\ 12}$", r"\text{(C)}", True),
        (r"\boxed{\mathrm{(D)}\ \frac{1}{2}}", "D", True),
        (r"\boxed{\textbf{(A) }5}", "(A)", True),
        (r"\boxed{E}", r"\textbf{(E)}", True),
        (r"\boxed{(b)}", "B", True),
        (r"\boxed{\text{(B) } 12}", "C", False),  # the letter decides, not the value
        (r"\boxed{12}", r"\text{(C)}", False),  # no letter against a letter gold
        (r"\boxed{\textbf{(C)}\ 12}", "12", True),  # a numeric gold keeps numeric grading
        (r"\boxed{\textbf{(C)}\ 12}", "13", False),
        (r"\boxed{\text{A: } \frac{1}{2}}", "0.5", True),
    ],
)
def test_multiple_choice(completion, gold, expected):
    assert is_correct(completion, gold) is expected


def test_option_letter():
    assert [grading.option_letter(g) for g in ["C", "(C)", r"\text{(C)}", r"\textbf{C}", r"\mathrm{(c)}"]] == ["C"] * 5
    assert [grading.option_letter(g) for g in ["e", "c", "F", "CD", "12", r"\pi"]] == [None] * 6
