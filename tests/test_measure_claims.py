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
])
def test_bad_verdicts_are_refused_at_once(claim_id, over, match):
    with pytest.raises(ValueError, match=match):
        claims.verdict(claim_id, **_ok(**over))


def test_non_claim_and_incomplete_records_are_not_rows():
    records = {"mfu": {"metrics": {"id": "x"}}, "claim-x": {"metrics": {"id": "x"}}, "claim-y": {"metrics": None}}
    assert claims.from_records(records) == []
