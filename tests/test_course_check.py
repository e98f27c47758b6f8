"""helpers.course.check's pieces on their own: the bands that say how far a number is off, the descriptions of
a case's inputs, the comparison of returned values, the registry's look-ups and the command line. (The
verdicts of whole exercises, and every registered exercise, are tested in test_course_exercises.py.)"""
import pytest
import torch

from helpers.course import check


@pytest.mark.parametrize("given, expected, words", [
    (1.05, 1.0, "close, but too high by less than 10%"),
    (0.8, 1.0, "too low by 10% to 50%"),
    (2.0, 1.0, "too high by a factor of 1.5 to 2.5"),
    (0.2, 1.0, "too low by a factor between 2.5 and 10"),
    (1000.0, 1.0, "too high by a factor of about 10^3: check the units and powers of ten"),
    (-1.0, 1.0, "the sign is wrong"),
    (0.0, 3.0, "zero is not the answer"),
    (2.0, 0.0, "too high"),
    (-2.0, 0.0, "too low"),
])
def test_how_far_names_a_band_and_never_the_expected_value(given, expected, words):
    assert check.how_far(given, expected) == words


def test_describe_gives_shapes_and_short_reprs():
    assert check.describe(torch.zeros(2, 3, dtype=torch.bfloat16)) == "tensor(2, 3) bfloat16"
    assert check.describe((torch.zeros(4), 7)) == "(tensor(4,) float32, 7)"
    assert check.describe([1, 2]) == "[1, 2]" and check.describe(list(range(9))) == "list of 9"
    assert check.describe(check.describe) == "describe"
    assert check.describe("x" * 100) == "'" + "x" * 36 + "..."


def test_compare_matches_structures_and_says_what_differs():
    assert check.compare((torch.ones(2), 3.0), (torch.ones(2), 3.0), 0.0, 0.0) is None
    assert check.compare({"a": 1.0}, {"a": 1.0}, 0.0, 0.0) is None
    assert check.compare(float("nan"), float("nan"), 0.0, 0.0) is None  # NaNs where a correct version has them
    assert "expected a tuple of 2 values" in check.compare((1.0,), (1.0, 2.0), 0.0, 0.0)
    assert check.compare((1.0, 5.0), (1.0, 2.0), 0.0, 0.0, names=("scale", "amax")).startswith("amax: ")
    assert "expected a dict with keys ['a', 'b']" in check.compare({"a": 1.0}, {"a": 1.0, "b": 2.0}, 0.0, 0.0)
    assert check.compare({"a": 1.0, "b": 9.0}, {"a": 1.0, "b": 2.0}, 0.0, 0.0).startswith("['b']: ")
    assert "which is not what a correct version returns" in check.compare("compute", "memory", 0.0, 0.0)
    assert "expected a tensor of shape (3,)" in check.compare([1.0, 2.0, 3.0], torch.zeros(3), 0.0, 0.0)
    assert check.compare(torch.zeros(2), torch.zeros(3), 0.0, 0.0) == "shape (2,), expected (3,)"
    assert check.compare("abc", 1.0, 0.0, 0.0).startswith("expected a number")
    assert check.compare(1.0 + 1e-3, 1.0, 1e-2, 0.0) is None  # within the relative tolerance


def test_lookups_name_what_a_notebook_has():
    assert check.load("99") == []  # no exercise module for this number: nothing, and no error
    names = [ex.name for ex in check.load("00")]
    assert names and all(n.startswith("00.") for n in names)
    assert check.get(names[0]).name == names[0]
    with pytest.raises(KeyError, match="this notebook has: " + names[0]):
        check.get("00.no_such_exercise")


def test_the_command_line_says_how_to_use_it(capsys):
    assert check.main([]) == 2 and "usage" in capsys.readouterr().out
    assert check.main(["--help"]) == 0 and "NOTEBOOK" in capsys.readouterr().out
