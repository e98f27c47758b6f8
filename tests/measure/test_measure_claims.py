"""Claim verdicts are validated when recorded and come back as ledger rows."""
import pytest

from helpers.measure import claims
from helpers.measure.results import load_results


def _ok(**over):
    args = dict(notebook="02", claim="a claim", source="a paper", measured="1.2x", value=1.2, claimed=(1.0, 1.5))
    return {**args, **over}


def test_a_verdict_is_recorded_and_read_back_as_a_ledger_row(tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "record", lambda name, metrics, **kw: __import__("helpers.measure.results").measure.results.record(
        name, metrics, folder=tmp_path, **kw))
    claims.verdict("b-claim", **_ok(notebook="06", value=2.5, spread=(2.4, 2.6), unit="x"), quiet=True)
    claims.verdict("a-claim", **_ok(verdict="not testable", reason="needs a GPU"), quiet=True)
    rows = claims.from_records(load_results(tmp_path))
    assert [(r["notebook"], r["id"], r["verdict"]) for r in rows] == [("02", "a-claim", "not testable"),
                                                                     ("06", "b-claim", "exceeded")]
    assert rows[1]["value"] == 2.5 and rows[0]["reason"] == "needs a GPU" and rows[0]["device"]
    assert rows[1]["spread"] == [2.4, 2.6] and rows[1]["claimed"] == {"lo": 1.0, "hi": 1.5, "above": "exceeded"}


@pytest.mark.parametrize("claim_id, over, match", [
    ("Bad Id", {}, "kebab-case"),
    ("x", {"notebook": "2"}, "two-digit"),
    ("x", {"verdict": "supported"}, "does not write its own verdict"),
    ("x", {"verdict": "true"}, "does not write its own verdict"),
    ("x", {"claim": " "}, "claim must be"),
    ("x", {"verdict": "not testable"}, "needs the reason"),
    ("x", {"value": "2x"}, "must be a number"),
    ("x", {"value": None}, "needs value"),
    ("x", {"claimed": None}, "needs value"),
    ("x", {"claimed": (1.0,)}, "claimed="),
    ("x", {"basis": "guess"}, "basis"),
    ("x", {"spread": (1.3, 1.4)}, "outside its spread"),
])
def test_bad_verdicts_are_refused_at_once(claim_id, over, match):
    with pytest.raises(ValueError, match=match):
        claims.verdict(claim_id, **_ok(**over))


def test_non_claim_and_incomplete_records_are_not_rows():
    records = {"mfu": {"metrics": {"id": "x"}}, "claim-x": {"metrics": {"id": "x"}}, "claim-y": {"metrics": None}}
    assert claims.from_records(records) == []


@pytest.mark.parametrize("value, lo, hi, claim, want", [
    (4.60, 4.5, 4.7, (1.5, 2.0), "exceeded"), (2.0, 2.0, 2.0, (1.5, 2.0), "supported"),
    (1.5, 1.4, 1.6, (1.5, 2.0), "supported"), (1.2, 1.1, 1.3, (1.5, 2.0), "contradicted"),
    (9.0, 8.0, 9.5, (1.7, None), "supported"), (1.0, 1.0, 1.0, (1.7, None), "contradicted"),
    (60.0, 60.0, 60.0, (None, 48.0), "contradicted"), (41.0, 41.0, 41.0, (None, 48.0), "supported"),
])
def test_judge_interval_tells_exceeded_supported_and_contradicted(value, lo, hi, claim, want):
    above = "contradicted" if claim[0] is None else "exceeded"
    assert claims.judge_interval(value, lo, hi, *claim, above=above)[0] == want


def test_a_wide_spread_is_never_support_and_a_close_precise_one_never_a_contradiction():
    # a CPU's +43% overhead with quartiles +14% to +84% against a claim of +33%: noise, not support
    verdict, reason = claims.judge_interval(0.43, 0.14, 0.84, 0.33, 0.33)
    assert verdict == "not testable" and "too wide" in reason and "163%" in reason
    # an H200's precise +36% (+35% to +45%) against +33%: close to the claim, so not a contradiction
    assert claims.judge_interval(0.36, 0.35, 0.45, 0.33, 0.33)[0] == "supported"
    # the whole range beyond the claim, however precise, is exceeded, and below it contradicted
    assert claims.judge_interval(0.60, 0.58, 0.62, 0.33, 0.33)[0] == "exceeded"
    assert claims.judge_interval(0.10, 0.09, 0.11, 0.33, 0.33)[0] == "contradicted"


def test_the_median_decides_where_only_a_quartile_reaches_the_claim():
    # two runs of one CPU's checkpointing overhead against "+30% to +33.3%" (a cost): medians +44% and +45%, the
    # first run's lower quartile just inside the widened claim. The edge of a spread does not decide: both say
    # what their medians say, and the reason names the median.
    first = claims.judge_interval(0.437, 0.363, 0.486, 0.30, 0.333, above="contradicted")
    second = claims.judge_interval(0.451, 0.406, 0.487, 0.30, 0.333, above="contradicted")
    assert first[0] == second[0] == "contradicted"
    assert "the median of 0.437 (0.363-0.486)" in first[1] and "the whole measured range" in second[1]
    # a median inside the widened claim with a quartile outside it is support, as before
    assert claims.judge_interval(0.36, 0.30, 0.45, 0.30, 0.333)[0] == "supported"


def test_a_wide_spread_wholly_on_one_side_still_decides():
    # an efficiency of 0.29 (IQR 0.25-0.40, 52% of its value) against "at most 1": every value in it is at most 1
    assert claims.judge_interval(0.293, 0.248, 0.401, None, 1.0, above="contradicted")[0] == "supported"
    # as wide, wholly above a claimed 1.5-2x gain: exceeded; reaching across its top: not testable
    assert claims.judge_interval(4.0, 2.5, 5.5, 1.5, 2.0)[0] == "exceeded"
    verdict, reason = claims.judge_interval(2.4, 1.8, 4.2, 1.5, 2.0)
    assert verdict == "not testable" and "reaches both sides" in reason


@pytest.mark.parametrize("args, kw, match", [((float("nan"), 1.0, 2.0, 1.0), {}, "value"),
                                             ((1.0, 1.0, 1.0, 2.0, 1.0), {}, "below"),
                                             ((1.0, 1.0, 1.0, float("inf")), {}, "claim_lo"),
                                             ((1.0, 1.0, 1.0, None, None), {}, "needs a bound"),
                                             ((3.0, 1.0, 2.0, 1.0), {}, "outside"),
                                             ((1.0, 1.0, 1.0, 1.0), {"above": "great"}, "above")])
def test_judge_interval_refuses_what_it_cannot_judge(args, kw, match):
    with pytest.raises(ValueError, match=match):
        claims.judge_interval(*args, **kw)


def test_a_formula_verdict_says_so_in_the_ledger_and_on_screen(tmp_path, monkeypatch, capsys):
    from helpers.course import report
    monkeypatch.setattr(claims, "record", lambda name, metrics, **kw: None)
    row = claims.verdict("qlora-65b", **_ok(notebook="08", basis="formula"))
    assert row["basis"] == "formula" and claims.shown(row) == "supported (by formula)"
    assert "supported (by formula); measured 1.2x" in capsys.readouterr().out
    assert report._verdict_text(row) == "supported (by formula)"
    assert claims.shown({**row, "verdict": "not testable"}) == "not testable"
    assert claims.shown(claims.verdict("b", **_ok(value=3.0))) == "exceeded"


def test_a_reference_recorded_by_an_older_rule_is_judged_again_by_todays():
    old = {"id": "mixed-precision-speed", "notebook": "03", "value": 4.6, "unit": "x", "verdict": "supported",
           "measured": "x4.60"}
    here = {"id": "mixed-precision-speed", "verdict": "not testable", "claimed": {"lo": 1.5, "hi": 2.0}}
    again = claims.rejudge(old, here)
    assert again["verdict"] == "exceeded" and again["rejudged"] == "supported"
    assert claims.rejudge(old) == old  # no claimed range anywhere: left as recorded
    same = {**old, "verdict": "exceeded"}
    assert claims.rejudge(same, here) == same and "rejudged" not in claims.rejudge(same, here)
    assert claims.rejudge({**old, "verdict": "not testable", "reason": "no GPU"}, here)["verdict"] == "not testable"
    wide = {**old, "spread": [1.0, 9.0], "claimed": {"lo": 1.5, "hi": 2.0}}
    assert claims.rejudge(wide)["verdict"] == "not testable"


def test_the_report_rejudges_a_reference_and_flags_one_older_than_its_notebook(monkeypatch):
    from helpers.course import report
    monkeypatch.setitem(report._CHANGED, "03", "2026-12-01T00:00:00+00:00")
    ref = {"id": "mixed-precision-speed", "notebook": "03", "value": 4.6, "unit": "x", "verdict": "supported",
           "measured": "x4.60", "date": "2026-11-30T23:46:15+00:00"}
    here = {"id": "mixed-precision-speed", "verdict": "not testable", "claimed": {"lo": 1.5, "hi": 2.0}}
    text = report._reference_text(ref, here)
    assert text.startswith("exceeded") and "recorded as supported" in text
    assert "before notebook 03 last changed (2026-12-01)" in text
    monkeypatch.setitem(report._CHANGED, "03", "2026-11-01T00:00:00+00:00")
    assert "last changed" not in report._reference_text(ref, here)
