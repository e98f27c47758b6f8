"""Notebook 11's parameters and measurements (helpers.decode.speculative_lab): the validators, the rule checked by
sampling, and the speed grid's rows consistent with the formula and with each other."""
from __future__ import annotations

import pytest
import torch

from helpers.decode import speculative, speculative_lab, speculative_report_lab


PROMPT = torch.tensor([3, 14, 15, 92, 65, 35, 89, 79])


# p and q on a vocabulary of 6: the wrong rule "accept when p >= q" can never emit tokens 2 or 5 (p < q)
P = torch.tensor([0.30, 0.25, 0.05, 0.20, 0.15, 0.05], dtype=torch.float64)


Q = torch.tensor([0.10, 0.15, 0.30, 0.10, 0.05, 0.30], dtype=torch.float64)


def test_lab_validators_and_rule_check():
    assert speculative_lab.check_temperatures("TEMPERATURES", [1, 0.0, 0.5, 1.0]) == [0.0, 0.5, 1.0]
    for bad in ([], [-0.1], [float("nan")], [True], 0.5):
        with pytest.raises(ValueError, match="TEMPERATURES"):
            speculative_lab.check_temperatures("TEMPERATURES", bad)
    assert speculative_lab.check_fraction("THRESHOLD", 0.01) == 0.01
    for bad in (0, 1, 1.5, "0.1", True):
        with pytest.raises(ValueError, match="THRESHOLD"):
            speculative_lab.check_fraction("THRESHOLD", bad)
    checks = speculative_lab.rule_check(P, Q, 50_000, seed=1)
    assert checks["exact"]["test"].passes and not checks["p>=q"]["test"].passes
    assert int(checks["exact"]["counts"].sum()) == 50_000


def test_the_round_check_passes_the_acceptance_step_and_fails_a_wrong_one():
    assert speculative_lab.round_check(P, Q, 5_000, seed=1).passes

    def keep_when_larger(ps, qs, xs, g):  # the tempting wrong rule, in accept_prefix's form
        x = xs[0]
        return [x] if ps[0][x] >= qs[0][x] else [int(torch.multinomial(speculative.residual(ps[0], qs[0]), 1, generator=g))]

    assert not speculative_lab.round_check(P, Q, 5_000, accept=keep_when_larger, seed=1).passes


def test_list_parameters_given_as_text_are_read_as_lists():
    assert speculative_lab.check_temperatures("TEMPERATURES", "[1.0, 0.0]") == [0.0, 1.0]
    with pytest.raises(ValueError, match="TEMPERATURES=.*string"):
        speculative_lab.check_temperatures("TEMPERATURES", "hot")


@pytest.mark.slow
def test_speed_grid_rows_are_consistent(models):
    target, draft = models
    drafts = {"gpt": draft, "lookup": speculative.NGramDraft(2)}
    costs = speculative_lab.decode_costs(target, draft, PROMPT, [2], reps=2)
    rows = speculative_lab.speed_grid(target, drafts, [PROMPT, PROMPT.flip(0)], 12, [2], [0.0, 1.0], costs)
    assert len(rows) == 4 and {(r["draft"], r["temperature"]) for r in rows} == {
        (d, t) for d in drafts for t in (0.0, 1.0)}
    for r in rows:
        assert 0 <= r["alpha"] <= 1 and r["speedup_q25"] <= r["speedup"] <= r["speedup_q75"]
        assert 1 <= r["tokens_per_pass"] <= 3 and r["expected"] == pytest.approx(speculative.expected_tokens(r["alpha"], 2))
        assert r["predicted"] == pytest.approx(speculative.predicted_speedup(r["alpha"], 2, r["c"]))
        assert r["c_q25"] <= r["c"] <= r["c_q75"]
        assert r["proposal_rate"] == (1.0 if r["draft"] == "gpt" else r["proposal_rate"]) and len(r["runs"]) == 2
    (row,) = speculative_lab.greedy_rows(target, {"gpt": draft}, PROMPT, 12, [2])
    assert row[:4] == ["gpt", 2, 12, 12] and row[5] is None  # identical, so no tie gap
    by_i, by_pos = speculative_lab.position_rows(rows[0]["runs"], 2, 12, bins=3)
    assert [row[0] for row in by_i] == [0, 1][:len(by_i)] and sum(row[1] for row in by_pos) == sum(
        len(x.betas) for x in rows[0]["runs"])
    for row in by_i:  # standard errors of the mean Σ min(p, q) and of the share kept
        assert len(row) == 6 and row[4] >= 0 and row[5] == pytest.approx((row[3] * (1 - row[3]) / row[1]) ** 0.5)
    for r in rows:  # the ceiling: tokens per pass over at least one decode step; noise flags a speedup above it
        assert r["ceiling"] == pytest.approx(r["tokens_per_pass"])
        assert r["noise"] == (r["speedup"] > r["ceiling"]) and r["baseline_drift"] >= 0
        overrun = sum(len(x.tokens) for x in r["runs"])  # 12 per run, after the last round's overrun is cut
        assert r["truncated_per_pass"] * sum(x.target_passes for x in r["runs"]) == pytest.approx(
            sum(x.accepted for x in r["runs"]) + sum(x.target_passes for x in r["runs"]) - overrun)
    assert "γ=2" in speculative_report_lab.gap_sentence(rows, "gpt", [2], [0.0, 1.0]) or "within" in speculative_report_lab.gap_sentence(rows, "gpt", [2], [0.0, 1.0])
