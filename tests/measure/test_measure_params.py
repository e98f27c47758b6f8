import pytest

from helpers.measure import params


def test_bad_profile_names_parameter_and_allowed_values():
    with pytest.raises(ValueError) as err:
        params.resolve_profile("fast")
    msg = str(err.value)
    assert "PROFILE" in msg and "'fast'" in msg
    for allowed in params.PROFILES:
        assert repr(allowed) in msg


def test_auto_profile_is_smoke_without_cuda():
    import torch

    expected = "full" if torch.cuda.is_available() else "smoke"
    assert params.resolve_profile("auto") == expected
    assert params.resolve_profile("full") == "full"


def test_by_profile_and_setup(results_tmp, tmp_path):
    s = params.setup("smoke", seed=3, interactive=False, results_dir=str(tmp_path / "r"))
    assert s.profile == "smoke" and s.seed == 3 and not s.interactive
    assert s.results_dir == tmp_path / "r" and s.results_dir.is_dir()
    assert s.pick(smoke=1, full=2) == 1
    assert params.by_profile("full", smoke=1, full=2) == 2


@pytest.mark.parametrize("kwargs, name", [
    ({"seed": -1}, "SEED"), ({"seed": 1.5}, "SEED"), ({"seed": 2 ** 32}, "SEED"), ({"interactive": "yes"}, "INTERACTIVE"),
    ({"device": "tpu"}, "DEVICE"), ({"profile": "quick"}, "PROFILE")])
def test_setup_rejects_bad_values(results_tmp, kwargs, name):
    with pytest.raises(ValueError, match=name):
        params.setup(**kwargs)


def test_choose_and_positive():
    assert params.choose("X", 2, (1, 2)) == 2
    with pytest.raises(ValueError, match="X=3"):
        params.choose("X", 3, (1, 2))
    assert params.positive("N", 4) == 4
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="N="):
            params.positive("N", bad)


def test_positive_refuses_nan_and_positive_number_refuses_what_is_not_finite():
    import math

    from helpers.measure.params import positive, positive_number

    with pytest.raises(ValueError, match="X=nan must be a positive float"):
        positive("X", math.nan, float)
    assert positive_number("LR", 3) == 3.0 and isinstance(positive_number("LR", 3), float)
    assert positive_number("LR", 5e-324) == 5e-324
    for bad in (math.inf, math.nan, 0, -1.0, True, "1e-3"):
        with pytest.raises(ValueError, match="LR="):
            positive_number("LR", bad)
    with pytest.raises(ValueError, match="finite positive number"):
        positive_number("LR", math.inf)


@pytest.mark.parametrize("value", [1, 0, "yes", None, 1.0])
def test_boolean_refuses_what_is_not_true_or_false(value):
    with pytest.raises(ValueError, match="must be True or False"):
        params.boolean("COMPILE", value)
    assert params.boolean("COMPILE", False) is False


def test_list_parameters_given_as_text_are_read_as_literals():
    assert params.positives("GAMMAS", "[1, 2]") == [1, 2] and params.positives("GAMMAS", " (3,) ") == [3]
    assert params.positives("GAMMAS", "1, 2") == [1, 2]  # a tuple literal too
    assert params.positives("SIZES", "[0.5, 2.0]", float) == [0.5, 2.0]
    assert params.choices("DTYPES", "['fp32']", ("fp32", "bf16")) == ["fp32"]
    for bad in ("fp32", "{1: 2}", "[1, -2]", "[]", b"x"):
        with pytest.raises(ValueError, match="GAMMAS"):
            params.positives("GAMMAS", bad)
    with pytest.raises(ValueError, match="is a string, not a list.*-y"):
        params.positives("GAMMAS", "2")
    assert params.listed("GAMMAS", (1, 2)) == (1, 2)
