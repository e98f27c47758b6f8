"""Notebook 11's readings (helpers.decode.speculative_report_lab): the formula on a bandwidth-bound target from
planted α and c, the ledger's verdicts on planted speedups, and sentences that refuse to rank overlapping
numbers or state a sign the numbers do not have."""
from __future__ import annotations

import inspect

import pytest
import torch

from helpers.decode import speculative, speculative_lab, speculative_report_lab
from helpers.measure import bench, claims
from helpers.measure.protocol import Ratio


def exact(x: float) -> Ratio:
    return Ratio(x, x, x, x != 1)


def test_formula_rows_with_planted_alpha_and_c():
    (row,) = speculative_report_lab.formula_rows(0.8, 0.0, [4], exact(0.1), {4: exact(1.0)})
    tokens = (1 - 0.8 ** 5) / (1 - 0.8)  # 3.3616
    assert row["tokens"] == pytest.approx(tokens)
    assert row["predicted"] == pytest.approx(tokens / 1.4) == pytest.approx(2.4011, abs=1e-4)
    assert row["predicted_verify"] == pytest.approx(row["predicted"])  # v = 1: the paper's formula
    assert row["lo"] == pytest.approx(row["predicted"]) and row["hi"] == pytest.approx(row["predicted"])
    # a verification pass costing 1.5 steps, and the bounds from α's standard error and the IQRs of c and v
    (slow,) = speculative_report_lab.formula_rows(0.8, 0.05, [4], Ratio(0.1, 0.08, 0.12, True), {4: Ratio(1.5, 1.4, 1.6, True)})
    assert slow["predicted_verify"] == pytest.approx(tokens / (0.4 + 1.5))
    assert slow["lo"] == pytest.approx(speculative.expected_tokens(0.75, 4) / (4 * 0.12 + 1.6))
    assert slow["hi"] == pytest.approx(speculative.expected_tokens(0.85, 4) / (4 * 0.08 + 1.4))
    assert slow["lo"] < slow["predicted_verify"] < slow["hi"]
    # α = 1: every draft token kept, γ + 1 tokens a pass; α + se is clipped to 1
    (sure,) = speculative_report_lab.formula_rows(1.0, 0.1, [3], exact(0.0), {3: exact(1.0)})
    assert sure["tokens"] == 4 and sure["predicted"] == 4 and sure["hi"] == 4
    with pytest.raises(ValueError, match="alpha"):
        speculative_report_lab.formula_rows(1.2, 0.0, [1], exact(0.1), {1: exact(1.0)})
    with pytest.raises(ValueError, match="alpha_se"):
        speculative_report_lab.formula_rows(0.5, -0.1, [1], exact(0.1), {1: exact(1.0)})


def test_alpha_estimate():
    runs = [speculative.SpecResult(tokens=torch.zeros(3), betas=[1.0, 0.0]),
            speculative.SpecResult(tokens=torch.zeros(3), betas=[1.0, 0.0])]
    mean, se, n = speculative_lab.alpha_estimate(runs)
    assert (mean, n) == (0.5, 4) and se == pytest.approx((1 / 3) ** 0.5 / 2)
    assert speculative_lab.alpha_estimate([speculative.SpecResult(tokens=torch.zeros(1))])[2] == 0


def _evidence(value, lo, hi, basis="formula"):
    e = {"value": value, "lo": lo, "hi": hi, "gamma": 2, "temperature": 0.0}
    if basis == "formula":
        e |= {"alpha": 0.8, "c": 0.06, "v": 1.1, "target": "small10m"}
    return e


def _verdicts(value, lo=None, hi=None, basis="formula", sampled=True, untestable=None):
    e = _evidence(value, value if lo is None else lo, value if hi is None else hi, basis)
    rows = speculative_report_lab.claim_rows({"greedy": e, "sampled": {**e, "temperature": 1.0} if sampled else None}, basis=basis,
                                             identical="identical in 6 of 6 runs", untestable=untestable)
    params = inspect.signature(claims.verdict).parameters
    out = {}
    for row in rows:  # the rows are exactly claims.verdict's keyword arguments, and the ledger judges them
        inspect.signature(claims.verdict).bind(**row)
        assert set(row) <= set(params) and row["notebook"] == "11" and row["basis"] == basis
        kw = {k: v for k, v in row.items() if k != "claim_id"}
        out[row["claim_id"]] = {**claims.verdict(row["claim_id"], quiet=True, **kw), "row": row}
    return out


def test_the_verdicts_flip_on_planted_speedups(results_tmp):
    t5, chin = "speculative-decoding-t5-xxl", "speculative-sampling-chinchilla"
    for value, want_t5, want_chin in [(1.5, "contradicted", "contradicted"), (2.2, "supported", "supported"),
                                      (3.0, "supported", "exceeded"), (3.8, "exceeded", "exceeded")]:
        got = _verdicts(value)
        assert (got[t5]["verdict"], got[chin]["verdict"]) == (want_t5, want_chin), value
        assert got[t5]["value"] == value and f"{value:.2f}x" in got[t5]["measured"]
        assert got[t5]["claimed"] == {"lo": 2.0, "hi": 3.0, "above": "exceeded"}
    assert "identical in 6 of 6" in _verdicts(2.2)[t5]["measured"]  # the claim's "identical outputs"
    assert "identical" not in _verdicts(2.2)[chin]["measured"]
    # the formula's range is its spread: a range wider than half its value is not testable, whatever its median
    wide = _verdicts(2.1, 1.2, 2.6)
    assert wide[t5]["verdict"] == "not testable" and "too wide" in wide[t5]["reason"]
    assert wide[t5]["spread"] == [1.2, 2.6]
    assert _verdicts(1.6, 1.5, 1.7)[t5]["verdict"] == "contradicted"  # precise, wholly below 2x even widened
    assert _verdicts(1.9, 1.7, 2.0)[t5]["verdict"] == "supported"  # close to the bound is never against it
    # inputs that cannot speak for the claim: not testable with the reason, the numbers still recorded
    cpu = _verdicts(2.2, 2.1, 2.3, untestable="c and v are this CPU's per-call costs")
    assert cpu[t5]["verdict"] == "not testable" and "per-call costs" in cpu[t5]["reason"] and cpu[t5]["value"] == 2.2
    # measured (a GPU run's grid) against formula: the text says which
    measured = _verdicts(2.6, 2.4, 2.9, basis="measured")
    assert measured[t5]["verdict"] == "supported" and "IQR 2.40-2.90" in measured[t5]["measured"]
    assert "formula" in _verdicts(2.2)[t5]["measured"] and "formula" not in measured[t5]["measured"]
    # no sampled temperature: not testable, with the reason
    alone = _verdicts(2.2, sampled=False)[chin]
    assert alone["verdict"] == "not testable" and "T > 0" in alone["reason"] and alone["value"] is None


def test_formula_claim_judges_the_row_furthest_from_the_formula(results_tmp):
    rows = [{**_grid_row(1, 1.50, 1.45, 1.55), "temperature": 0.0, "predicted": 1.5, "c": 0.08},
            {**_grid_row(2, 1.20, 1.15, 1.25), "temperature": 0.0, "predicted": 2.0, "c": 0.08}]
    kw = speculative_report_lab.formula_claim(rows, rows[0], on_gpu=True)
    assert kw["value"] == pytest.approx(0.6) and kw["spread"] == pytest.approx((1.15 / 2, 1.25 / 2))
    assert claims.verdict("speculative-formula", quiet=True, **kw)["verdict"] == "contradicted"
    rows[1] |= {"speedup": 1.9, "speedup_q25": 1.85, "speedup_q75": 1.95}
    kw = speculative_report_lab.formula_claim(rows, rows[1], on_gpu=True)
    assert claims.verdict("speculative-formula", quiet=True, **kw)["verdict"] == "supported"
    rows[0] |= {"speedup": 2.4, "speedup_q25": 2.35, "speedup_q75": 2.45}  # 1.6x the formula: above is against too
    kw = speculative_report_lab.formula_claim(rows, rows[0], on_gpu=True)
    assert claims.verdict("speculative-formula", quiet=True, **kw)["verdict"] == "contradicted"
    cpu = speculative_report_lab.formula_claim(rows, rows[0], on_gpu=False)
    assert cpu["verdict"] == "not testable" and cpu["claimed"] == (0.85, 1.15)
    assert claims.verdict("speculative-formula", quiet=True, **cpu)["verdict"] == "not testable"


def _grid_row(gamma, speedup, q25, q75, noise=False):
    return {"gamma": gamma, "speedup": speedup, "speedup_q25": q25, "speedup_q75": q75, "noise": noise,
            "predicted": 1.5}


def test_best_sentence_ranks_only_separated_iqrs():
    best, text = speculative_report_lab.best_sentence([_grid_row(1, 1.30, 1.10, 1.45), _grid_row(2, 1.20, 1.05, 1.35)], 0.0)
    assert best["gamma"] == 1 and "cannot rank" in text and "overlaps γ=2's" in text and "faster than plain" in text
    best, text = speculative_report_lab.best_sentence([_grid_row(1, 1.30, 1.25, 1.35), _grid_row(2, 1.00, 0.95, 1.05)], 0.0)
    assert "above γ=2's IQR" in text and "cannot rank" not in text
    _, text = speculative_report_lab.best_sentence([_grid_row(1, 0.9, 0.8, 1.1), _grid_row(2, 0.7, 0.6, 0.75)], 1.0)
    assert "within the noise of plain decoding" in text and "above γ=2's" in text
    _, text = speculative_report_lab.best_sentence([_grid_row(1, 0.8, 0.7, 0.9)], 0.5)
    assert "slower than plain decoding" in text and "γ=" in text and "rank" not in text
    best, text = speculative_report_lab.best_sentence([_grid_row(1, 3.0, 2.9, 3.1, noise=True), _grid_row(2, 1.1, 1.0, 1.2)], 0.0)
    assert best["gamma"] == 2  # a row above its ceiling is never the best


def test_prediction_sentence_ranks_only_disjoint_ranges():
    rows = speculative_report_lab.formula_rows(0.8, 0.02, [2, 4], Ratio(0.06, 0.05, 0.07, True),
                          {2: Ratio(1.1, 1.0, 1.2, True), 4: Ratio(1.3, 1.2, 1.4, True)})
    text = speculative_report_lab.prediction_sentence(rows, "small10m", "10 ms")
    b = max(rows, key=lambda r: r["predicted_verify"])
    assert f"{b['predicted_verify']:.2f}x at γ={b['gamma']}" in text and "faster than plain decoding" in text
    assert ("cannot rank" in text) == (b["lo"] <= min(rows, key=lambda r: r["predicted_verify"])["hi"])
    apart = [{**rows[0], "predicted_verify": 2.0, "lo": 1.9, "hi": 2.1, "gamma": 2},
             {**rows[1], "predicted_verify": 1.5, "lo": 1.4, "hi": 1.6, "gamma": 4}]
    assert "above γ=4's range" in speculative_report_lab.prediction_sentence(apart, "small10m", "10 ms")
    close = [{**apart[0]}, {**apart[1], "predicted_verify": 1.95, "lo": 1.85, "hi": 2.05}]
    assert "cannot rank" in speculative_report_lab.prediction_sentence(close, "small10m", "10 ms")
    spans = [{**apart[0], "lo": 0.9, "hi": 2.1}]
    assert "within the noise of plain decoding" in speculative_report_lab.prediction_sentence(spans, "small10m", "10 ms")


def test_alpha_and_bound_sentences_follow_the_numbers():
    rises = speculative_lab.alpha_sentence({0.0: (0.70, 0.01, 400), 1.0: (0.80, 0.01, 400)}, 0.0, 1.0)
    assert "rises with temperature" in rises and "0.70 ± 0.01" in rises
    assert "falls with temperature" in speculative_lab.alpha_sentence({0.0: (0.85, 0.01, 600), 1.0: (0.76, 0.01, 600)}, 0.0, 1.0)
    close = speculative_lab.alpha_sentence({0.0: (0.70, 0.02, 100), 1.0: (0.74, 0.02, 100)}, 0.0, 1.0)
    assert "cannot say" in close and "rises" not in close
    assert speculative_report_lab.against_plain(1.1, 1.3) == "faster than" and speculative_report_lab.against_plain(0.7, 0.9) == "slower than"
    assert speculative_report_lab.against_plain(0.9, 1.1) == "within the noise of"
    assert "reading weights, not per-call" in speculative_report_lab.bound_sentence(5.0, 10.0, "small10m")
    low = speculative_report_lab.bound_sentence(1.0, 10.0, "small10m")
    assert "only 10%" in low and "not what a large target" in low
    across = speculative_report_lab.bound_sentence(3.0, 10.0, "small10m", spread=(2.7, 3.2))
    assert "cannot tell" in across and "27%-32%" in across
    assert [speculative_report_lab.bound_state(lo, hi, 10.0) for lo, hi in ((3, 4), (2, 2.9), (2.9, 3.1))] == [
        "bound", "overhead", "unclear"]


def test_prediction_figure_draws_every_temperature():
    rows = {T: speculative_report_lab.formula_rows(a, 0.01, [1, 2, 4], Ratio(0.05, 0.04, 0.06, True),
                              {g: Ratio(1.1, 1.0, 1.2, True) for g in (1, 2, 4)}) for T, a in ((0.0, 0.8), (1.0, 0.7))}
    fig = speculative_report_lab.prediction_figure(rows, "small10m")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(labels) == 5 and sum("measured v" in x for x in labels) == 2 and "claimed 2-3x" in labels[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4"]


def _row(draft, speedup, noise, gamma=1, other=0.0):
    return {"draft": draft, "gamma": gamma, "temperature": 1.0, "speedup": speedup, "noise": noise,
            "proposal_rate": 0.1, "tokens_per_pass": 1.1, "ceiling": 1.1, "speedup_q25": speedup,
            "speedup_q75": speedup, "other_ms_per_token": other}


def test_lab_sentences_follow_the_numbers():
    # a trend is named only where the ends differ by more than twice their standard error
    assert speculative_lab.trend([0.73, 0.77, 0.79], [0.02, 0.02, 0.03]).startswith("went from 0.73 to 0.79")
    assert "cannot tell" in speculative_lab.trend([0.73, 0.77, 0.79], [0.02, 0.02, 0.03])
    assert speculative_lab.trend([0.68, 0.82, 0.93], [0.02, 0.02, 0.02]) == "rose from 0.68 to 0.93"
    assert speculative_lab.trend([0.9, 0.7], [0.01, 0.01]) == "fell from 0.90 to 0.70"
    # the share kept: the expected accepted prefix over γ, α only at γ = 1
    assert speculative_lab.kept_share(0.76, 1) == pytest.approx(0.76) and speculative_lab.kept_share(1.0, 4) == 1.0
    assert speculative_lab.kept_share(0.5, 2) == pytest.approx((0.5 + 0.25) / 2)
    grid = [{"temperature": 1.0, "gamma": g, "alpha": 0.76, "acceptance": k} for g, k in ((1, 0.76), (4, 0.48))]
    text = speculative_lab.kept_sentence(grid)
    assert "first rejection ends the round" in text and "at γ=4, T=1: α = 0.76, so 0.53 kept" in text and "0.48 measured" in text
    quiet, loud = bench.Timing(1.0, 0.95, 1.05, []), bench.Timing(1.0, 0.8, 1.4, [])
    assert speculative_lab.cost_warnings({"a": quiet}, {1: 1.2}) == []
    warn = speculative_lab.cost_warnings({"a": quiet, "b": loud}, {1: 0.8, 2: 1.1})
    assert len(warn) == 2 and "b ±" in warn[0] and "a ±" not in warn[0] and "γ=1: 0.80" in warn[1] and "γ=2" not in warn[1]
    assert speculative_report_lab.outside(_row("x", 1, False, other=-0.12)) == "0 ms (within noise)"
    assert speculative_report_lab.outside(_row("x", 1, False, other=0.5)) == "0.50 ms"
    # the fastest prompt-lookup row not flagged as noise; the flagged one is counted, never reported as a result
    rows = [_row("prompt-lookup", 1.9, True, 1), _row("prompt-lookup", 1.05, False, 2), _row("prompt-lookup", 0.8, False, 4)]
    text = speculative_report_lab.lookup_sentence(rows)
    assert "γ=2" in text and "1.05x" in text and "1.9" not in text and "1 of its 3 rows" in text
    assert "fastest" not in speculative_report_lab.lookup_sentence([_row("prompt-lookup", 1.9, True)])


def test_slow_lines_count_the_rows_and_name_each_slow_one_s_causes():
    fast, slow, even = (dict(_row("gpt", s, False, gamma=g), c=0.1, alpha=0.9, plain_ms_per_token=1.0)
                        for s, g in ((1.5, 1), (0.6, 2), (1.0, 4)))
    even.update(speedup_q25=0.9, speedup_q75=1.1)
    lines = speculative_report_lab.slow_lines([fast, slow, even], {1: 1.0, 2: 1.5, 4: 1.0})
    assert lines[0].startswith("of 3 draft-GPT configurations, 1 were slower") and "1 faster" in lines[0]
    assert "1 within the noise" in lines[0] and len(lines) == 2
    assert "γ=2" in lines[1] and "verification costs 1.50 decode steps" in lines[1] and "low acceptance" not in lines[1]
    slow.update(alpha=0.3)
    assert "low acceptance (α = 0.30)" in speculative_report_lab.slow_lines([slow], {2: 1.0})[1]
    slow.update(alpha=0.9, tokens_per_pass=2.0)  # no cause reaches its mark alone: the line says so and lists them
    assert "none of the four causes reaches its mark alone" in speculative_report_lab.slow_lines([slow], {2: 1.0})[1]


def test_the_cost_sentence_says_what_the_verification_cost_shows():
    v = Ratio(1.66, 1.5, 1.8, True)
    text = speculative_report_lab.cost_sentence(5.0, 10.0, "small10m", (4.0, 6.0), v, 4)
    assert "reading weights, not per-call" in text and "yet verifying 5 tokens cost 1.66 small10m steps" in text
    assert "4 extra tokens added 0.66 of a step" in text and "formula here takes this v" in text
    low = speculative_report_lab.cost_sentence(1.0, 10.0, "small10m", (0.9, 1.1), v, 4)
    assert "yet" not in low and "only 10%" in low
    one = speculative_report_lab.verification_clause(Ratio(1.05, 0.95, 1.1, False), 4, "small10m", "bound")
    assert "about one step" in one and "added" not in one


def _gap_rows(ratios, gamma=4):
    """Grid rows of one draft at one γ whose tokens per pass are `ratios` × the formula's, one per temperature."""
    run = speculative.SpecResult(tokens=torch.zeros(10, dtype=torch.long))
    return [{"draft": "gpt", "gamma": gamma, "temperature": float(t), "tokens_per_pass": 2.0 * r, "expected": 2.0,
             "runs": [run], "truncated_per_pass": 0.0, "alpha": 0.5} for t, r in enumerate(ratios)]


def test_gap_sentence_states_the_sign_the_gaps_have():
    """Below the formula at every temperature, but not all by more than 5%, must not read 'no sign shared'."""
    small_below = speculative_report_lab.gap_sentence(_gap_rows([0.97, 0.96]), "gpt", [4], [0.0, 1.0])
    assert "no sign shared" not in small_below and "below it at every temperature, by 3%-4%" in small_below
    uneven = speculative_report_lab.gap_sentence(_gap_rows([0.90, 0.98]), "gpt", [4], [0.0, 1.0])
    assert "below it at every temperature, by 2%-10%" in uneven and "systematic" in uneven
    above = speculative_report_lab.gap_sentence(_gap_rows([1.08, 1.12]), "gpt", [4], [0.0, 1.0])
    assert "exceed the formula at every temperature (by 8%-12%)" in above and "within" not in above
    mixed = speculative_report_lab.gap_sentence(_gap_rows([0.97, 1.02]), "gpt", [4], [0.0, 1.0])
    assert "no sign shared" in mixed and "within 3%" in mixed
    assert "equal to it" in speculative_report_lab.gap_sentence(_gap_rows([1.0, 1.0]), "gpt", [4], [0.0, 1.0])
    assert "at or below" in speculative_report_lab.gap_sentence(_gap_rows([1.0, 0.98]), "gpt", [4], [0.0, 1.0])
    below = speculative_report_lab.gap_sentence(_gap_rows([0.90, 0.85]), "gpt", [4], [0.0, 1.0])
    assert "fall below the formula at every temperature (by 10%-15%)" in below
