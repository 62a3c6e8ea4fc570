"""Box extraction (`stapo_trl.grading.extract`): nested braces, the last box, `\\fbox` and braceless boxes, and no
answer from an empty or unterminated box."""

from stapo_trl.grading import extract_boxed_answer


class TestExtractBoxedAnswer:
    def test_nested_braces(self):
        assert extract_boxed_answer(r"so $\boxed{\frac{1}{3}}$.") == r"\frac{1}{3}"
        assert extract_boxed_answer(r"\boxed{\left\{1, 2\right\}}") == r"\left\{1, 2\right\}"

    def test_last_box_wins(self):
        assert extract_boxed_answer(r"first \boxed{12}, then \boxed{13}") == "13"

    def test_fbox_and_braceless(self):
        assert extract_boxed_answer(r"\fbox{7}") == "7"
        assert extract_boxed_answer(r"The answer is \boxed 5.") == "5."

    def test_no_box_or_empty(self):
        assert extract_boxed_answer("The answer is 5.") is None
        assert extract_boxed_answer("") is None
        assert extract_boxed_answer(None) is None
        assert extract_boxed_answer(r"\boxed{}") is None
        assert extract_boxed_answer(r"\boxedx{3}") is None  # another command, not a box

    def test_unterminated_last_box_is_no_answer(self):
        # A truncated generation: the earlier, abandoned box must not count.
        assert extract_boxed_answer(r"\boxed{12} no wait, \boxed{\frac{1}{") is None
