"""helpers.course.outputs: a learner's output compared with the reference's, in words that never give the answer."""
import pytest
import torch

from helpers.course import outputs


@pytest.mark.parametrize("given, expected, words", [
    (1.05, 1.0, "close, but too high by less than 10%"),
    (0.8, 1.0, "too low by 10% to 50%"),
    (2.2, 1.0, "too high by a factor of 1.5 to 2.5"),
    (2.0, 1.0, "too high by an exact power of two (a factor 2^k for a whole k): check each exponent, and the sign "
               "of each exponent"),
    (2.0**-6, 64.0, "too low by an exact power of two (a factor 2^k for a whole k): check each exponent, and the "
                    "sign of each exponent"),
    (0.2, 1.0, "too low by a factor between 2.5 and 10"),
    (1000.0, 1.0, "too high by a factor of about 10^3: check the units and powers of ten"),
    (-1.0, 1.0, "the sign is wrong"),
    (0.0, 3.0, "zero is not the answer"),
    (2.0, 0.0, "too high"),
    (-2.0, 0.0, "too low"),
])
def test_how_far_names_a_band_and_never_the_expected_value(given, expected, words):
    assert outputs.how_far(given, expected) == words


def test_a_close_miss_is_told_the_precision_wanted():
    assert outputs.how_far(0.11, 0.1111, rtol=1e-3) == ("close, but too low by less than 10%: give it to within 0.1% "
                                                     "(relative), more digits than you gave")


def test_a_finite_mismatch_is_not_called_an_infinity_when_another_entry_is_one():
    got, want = torch.tensor([1.0, 2.0, float("nan")]), torch.tensor([1.5, 2.0, 3.0])
    why = outputs.compare(got, want, 1e-5, 0.0)
    assert "the first at index (0,) (yours there: 1)" in why and "at index (2,) you have nan" in why
    why = outputs.compare(torch.tensor([0.0, 5.0]), torch.tensor([0.0, float("inf")]), 1e-5, 0.0)
    assert why.endswith("at index (1,), where you have 5.0, where a correct version gives an infinity or NaN")


def test_describe_gives_shapes_and_short_reprs():
    assert outputs.describe(torch.zeros(2, 3, dtype=torch.bfloat16)) == "tensor(2, 3) bfloat16"
    assert outputs.describe((torch.zeros(4), 7)) == "(tensor(4,) float32, 7)"
    assert outputs.describe([1, 2]) == "[1, 2]" and outputs.describe(list(range(9))) == "list of 9"
    assert outputs.describe(outputs.describe) == "describe"
    assert outputs.describe("x" * 100) == "'" + "x" * 36 + "..."


def test_compare_matches_structures_and_says_what_differs():
    assert outputs.compare((torch.ones(2), 3.0), (torch.ones(2), 3.0), 0.0, 0.0) is None
    assert outputs.compare({"a": 1.0}, {"a": 1.0}, 0.0, 0.0) is None
    assert outputs.compare(float("nan"), float("nan"), 0.0, 0.0) is None  # NaNs where a correct version has them
    assert "expected a tuple of 2 values" in outputs.compare((1.0,), (1.0, 2.0), 0.0, 0.0)
    assert outputs.compare((1.0, 5.0), (1.0, 2.0), 0.0, 0.0, names=("scale", "amax")).startswith("amax: ")
    assert "expected a dict with keys ['a', 'b']" in outputs.compare({"a": 1.0}, {"a": 1.0, "b": 2.0}, 0.0, 0.0)
    assert outputs.compare({"a": 1.0, "b": 9.0}, {"a": 1.0, "b": 2.0}, 0.0, 0.0).startswith("['b']: ")
    assert "which is not what a correct version returns" in outputs.compare("compute", "memory", 0.0, 0.0)
    assert "expected a tensor of shape (3,)" in outputs.compare([1.0, 2.0, 3.0], torch.zeros(3), 0.0, 0.0)
    assert outputs.compare(torch.zeros(2), torch.zeros(3), 0.0, 0.0) == "shape (2,), expected (3,)"
    assert outputs.compare("abc", 1.0, 0.0, 0.0).startswith("expected a number")
    assert outputs.compare(1.0 + 1e-3, 1.0, 1e-2, 0.0) is None  # within the relative tolerance


def test_a_whole_number_off_by_a_power_of_two_is_not_told_to_check_exponents():
    why = outputs.compare(4, 1, 0.0, 0.0)
    assert why == "got 4: too high by a factor between 2.5 and 10" and "exponent" not in why
    assert "exact power of two" in outputs.compare(4.0, 1.0, 0.0, 0.0)  # a float's factor 2^k still is
