"""Claim verdicts are validated when recorded and come back as ledger rows."""
import pytest

from helpers.measure import claims
from helpers.measure.results import load_results


def _ok(**over):
    args = dict(notebook="02", claim="a claim", source="a paper", measured="1.2x", verdict="supported")
    return {**args, **over}


def test_a_verdict_is_recorded_and_read_back_as_a_ledger_row(tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "record", lambda name, metrics, **kw: __import__("helpers.measure.results").measure.results.record(
        name, metrics, folder=tmp_path, **kw))
    claims.verdict("b-claim", **_ok(notebook="06", value=2.5, unit="x"), quiet=True)
    claims.verdict("a-claim", **_ok(verdict="not testable", reason="needs a GPU"), quiet=True)
    rows = claims.from_records(load_results(tmp_path))
    assert [(r["notebook"], r["id"], r["verdict"]) for r in rows] == [("02", "a-claim", "not testable"),
                                                                     ("06", "b-claim", "supported")]
    assert rows[1]["value"] == 2.5 and rows[0]["reason"] == "needs a GPU" and rows[0]["device"]


@pytest.mark.parametrize("claim_id, over, match", [
    ("Bad Id", {}, "kebab-case"),
    ("x", {"notebook": "2"}, "two-digit"),
    ("x", {"verdict": "true"}, "choose one of"),
    ("x", {"claim": " "}, "claim must be"),
    ("x", {"verdict": "not testable"}, "needs the reason"),
    ("x", {"value": "2x"}, "must be a number"),
    ("x", {"basis": "guess"}, "basis"),
])
def test_bad_verdicts_are_refused_at_once(claim_id, over, match):
    with pytest.raises(ValueError, match=match):
        claims.verdict(claim_id, **_ok(**over))


def test_non_claim_and_incomplete_records_are_not_rows():
    records = {"mfu": {"metrics": {"id": "x"}}, "claim-x": {"metrics": {"id": "x"}}, "claim-y": {"metrics": None}}
    assert claims.from_records(records) == []


@pytest.mark.parametrize("value, lo, hi, want", [
    (4.60, 1.5, 2.0, "exceeded"), (2.0, 1.5, 2.0, "supported"), (1.5, 1.5, 2.0, "supported"),
    (1.49, 1.5, 2.0, "contradicted"), (9.0, 1.7, None, "supported"), (1.0, 1.7, None, "contradicted"),
])
def test_judge_tells_exceeded_from_supported(value, lo, hi, want):
    assert claims.judge(value, lo, hi) == want


@pytest.mark.parametrize("args, match", [((float("nan"), 1.0, 2.0), "value"), ((1.0, 2.0, 1.0), "below"),
                                         ((1.0, float("inf")), "lo")])
def test_judge_refuses_what_it_cannot_judge(args, match):
    with pytest.raises(ValueError, match=match):
        claims.judge(*args)


def test_a_formula_verdict_says_so_in_the_ledger_and_on_screen(tmp_path, monkeypatch, capsys):
    from helpers.course import report
    monkeypatch.setattr(claims, "record", lambda name, metrics, **kw: None)
    row = claims.verdict("qlora-65b", **_ok(notebook="08", basis="formula"))
    assert row["basis"] == "formula" and claims.shown(row) == "supported (by formula)"
    assert "supported (by formula); measured 1.2x" in capsys.readouterr().out
    assert report._verdict_text(row) == "supported (by formula)"
    assert claims.shown({**row, "verdict": "not testable"}) == "not testable"
    assert claims.shown(claims.verdict("b", **_ok(verdict="exceeded"))) == "exceeded"


def test_judge_range_judges_a_range_only_when_all_of_it_gets_one_verdict():
    assert claims.judge_range(2.5, 2.1, 2.9, 2.0, 3.0) == ("supported", "")
    assert claims.judge_range(1.5, 1.2, 1.9, 2.0, 3.0) == ("contradicted", "")
    assert claims.judge_range(3.5, 3.1, 3.9, 2.0, 3.0) == ("exceeded", "")
    assert claims.judge_range(3.5, 3.1, 3.9, 2.0, None) == ("supported", "")
    verdict, reason = claims.judge_range(2.9, 2.5, 3.2, 2.0, 3.0)
    assert verdict == "not testable" and "spans the claim's bound of 3x" in reason
    assert "bound of 2x" in claims.judge_range(2.0, 1.8, 2.2, 2.0, 3.0)[1]
    with pytest.raises(ValueError, match="outside"):
        claims.judge_range(4.0, 1.0, 2.0, 2.0, 3.0)
