"""params.fill: the one way a notebook resolves its parameters."""
import pytest

from helpers.measure import params


def _resolver(S, *, N, REPS):
    return {"N": S.resolve("N", N, smoke=8, full=64, check=params.positive),
            "REPS": S.resolve("REPS", REPS, smoke=3, full=20, check=params.positive), "EXTRA": "x"}


def test_fill_reads_the_namespace_writes_back_and_says_what_the_profile_chose(tmp_path, capsys):
    S = params.Setup(profile="smoke", device="cpu", seed=0, interactive=False, results_dir=tmp_path)
    ns = {"N": None, "REPS": 5, "OTHER": 1}
    assert params.fill(ns, _resolver, S) is None  # a setup cell ending with the call shows only its line
    assert ns == {"N": 8, "REPS": 5, "OTHER": 1, "EXTRA": "x"}
    assert capsys.readouterr().out == "the smoke profile fills in: N=8\n"
    params.fill({"N": 2, "REPS": 2}, _resolver, S)
    assert capsys.readouterr().out == ""  # nothing filled in, nothing said
    params.fill({"N": 2, "REPS": None}, lambda S, *, N, REPS: {"N": N, "REPS": REPS}, S)
    assert capsys.readouterr().out == ""  # a None the resolver keeps (a default decided later) is not "filled in"


def test_fill_names_a_missing_parameter_and_passes_a_bad_value_on(tmp_path):
    S = params.Setup(profile="smoke", device="cpu", seed=0, interactive=False, results_dir=tmp_path)
    with pytest.raises(NameError, match="defines no REPS"):
        params.fill({"N": None}, _resolver, S)
    with pytest.raises(ValueError, match="REPS=0"):
        params.fill({"N": None, "REPS": 0}, _resolver, S)


def test_a_finite_number_is_an_int_or_float_and_not_a_bool_nan_or_text():
    assert params.is_finite_number(3) and params.is_finite_number(2.5)
    assert not any(params.is_finite_number(v) for v in (True, float("nan"), float("inf"), "1", None))
