"""Gold normalisation (`stapo_trl.grading.normalize`): the layouts a gold comes in (a float, a boxed string,
$-wrapped parts, a list) split into its parts."""

from stapo_trl.grading import gold_parts


def test_gold_parts_layouts():
    assert gold_parts(27.0) == ["27"]
    assert gold_parts(2.5) == ["2.5"]
    assert gold_parts(r"\boxed{204}") == ["204"]
    assert gold_parts("$69$,$84$") == ["69", "84"]
    assert gold_parts(["$f(x)=x$"]) == ["f(x)=x"]
    assert gold_parts(None) == []
