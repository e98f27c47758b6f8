"""Speculative decoding (helpers/decode/speculative.py): exact on distributions, exact on the course GPT, caches rolled back.

The models here are small random GPTs with scaled-up weights (sharp distributions, far from ties), so that
the tests take seconds and do not need the trained checkpoints."""
from __future__ import annotations

import math

import pytest
import torch

from helpers.decode import speculative
from helpers.gpt.generation import KVCache, generate, prefill
from helpers.gpt.model import GPT, GPTConfig


def _gpt(n_layer: int, d_model: int, seed: int, scale: float = 3.0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=n_layer, n_head=2, d_model=d_model, d_ff=2 * d_model, seq_len=96)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model


@pytest.fixture(scope="module")
def models():
    return _gpt(2, 32, 0), _gpt(1, 16, 1)


PROMPT = torch.tensor([3, 14, 15, 92, 65, 35, 89, 79])

# p and q on a vocabulary of 6: the wrong rule "accept when p >= q" can never emit tokens 2 or 5 (p < q)
P = torch.tensor([0.30, 0.25, 0.05, 0.20, 0.15, 0.05], dtype=torch.float64)
Q = torch.tensor([0.10, 0.15, 0.30, 0.10, 0.05, 0.30], dtype=torch.float64)
DRAWS, THRESHOLD = 200_000, 0.001


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_speculative_equals_target_greedy(models, gamma):
    target, draft = models
    want = generate(target, PROMPT, 24)[0]
    got = speculative.speculative_generate(target, draft, PROMPT, 24, gamma=gamma, temperature=0)
    assert torch.equal(got.tokens, want)
    assert got.proposed > 0 and got.target_passes < 24  # it did speculate (the draft got some right)


def test_greedy_with_the_ngram_draft_and_a_one_token_prompt(models):
    target, _ = models
    for prompt in (PROMPT, PROMPT[:1]):
        want = generate(target, prompt, 24)[0]
        got = speculative.speculative_generate(target, speculative.NGramDraft(2), prompt, 24, gamma=4, temperature=0)
        assert torch.equal(got.tokens, want)


def test_a_draft_equal_to_the_target_is_always_accepted(models):
    target, _ = models
    got = speculative.speculative_generate(target, target, PROMPT, 30, gamma=3, temperature=1.0, seed=4)
    assert got.accepted == got.proposed and got.alpha == pytest.approx(1.0)
    assert got.tokens_per_pass == pytest.approx(30 / got.target_passes) and got.tokens_per_pass > 3


def test_the_exact_rule_emits_p_and_the_wrong_rule_does_not():
    torch.testing.assert_close(speculative.emitted_distribution(P, Q, speculative.accept_probability(P, Q), speculative.residual(P, Q)), P,
                               rtol=0, atol=1e-12)
    wrong = speculative.emitted_distribution(P, Q, (P >= Q).double(), speculative.residual(P, Q))
    assert (wrong - P).abs().max() > 0.04


def test_chi_square_passes_the_exact_rule_and_fails_the_wrong_one():
    g = torch.Generator().manual_seed(0)
    right = speculative.chi_square(torch.bincount(speculative.sample_rule(P, Q, DRAWS, generator=g), minlength=6), P, THRESHOLD)
    wrong = speculative.chi_square(torch.bincount(speculative.sample_rule(P, Q, DRAWS, rule="p>=q", generator=g), minlength=6), P,
                          THRESHOLD)
    assert right.passes and right.dof == 5
    assert not wrong.passes and wrong.p_value < 1e-100
    # a fair sample of p itself passes too, and a sample of q fails
    assert speculative.chi_square(torch.bincount(torch.multinomial(P, DRAWS, True, generator=g), minlength=6), P).passes
    assert not speculative.chi_square(torch.bincount(torch.multinomial(Q, DRAWS, True, generator=g), minlength=6), P).passes


def test_chi_square_p_value_matches_a_known_quantile():
    # one degree of freedom: P(X >= x) = erfc(sqrt(x / 2)); counts 60/40 against 1/2 give a statistic of 4
    res = speculative.chi_square(torch.tensor([60.0, 40.0]), torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert res.statistic == pytest.approx(4.0) and res.dof == 1
    assert res.p_value == pytest.approx(math.erfc(math.sqrt(2.0)), rel=1e-9)
    # a token of probability 0 that was emitted fails outright
    assert not speculative.chi_square(torch.tensor([5.0, 1.0]), torch.tensor([1.0, 0.0])).passes


def test_alpha_is_the_sum_of_min_and_the_acceptance_rate():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    assert float(speculative.alpha(p, q)) == pytest.approx(0.7)
    assert float(speculative.alpha(P, Q)) == pytest.approx(0.10 + 0.15 + 0.05 + 0.10 + 0.05 + 0.05)
    # the rule's acceptance probability averaged over x ~ q is alpha
    assert float((Q * speculative.accept_probability(P, Q)).sum()) == pytest.approx(float(speculative.alpha(P, Q)))
    assert float(speculative.alpha(P, P)) == pytest.approx(1.0)


def test_formulas():
    assert speculative.expected_tokens(0.0, 4) == 1.0
    assert speculative.expected_tokens(1.0, 4) == 5.0
    assert speculative.expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert speculative.predicted_speedup(0.5, 2, 0.25) == pytest.approx(1.75 / 1.5)
    assert speculative.predicted_speedup(0.8, 1, 0.0) == pytest.approx(1.8)
    for bad in (dict(alpha=1.2, gamma=2, c=0.1), dict(alpha=0.5, gamma=-1, c=0.1), dict(alpha=0.5, gamma=2, c=-1.0)):
        with pytest.raises(ValueError):
            speculative.predicted_speedup(**bad)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rollback_leaves_each_cache_equal_to_a_fresh_prefill(models, temperature):
    target, draft = models
    res, tcache, dcache, held = speculative.speculative_generate(target, draft, PROMPT, 30, gamma=3, temperature=temperature,
                                                        seed=1, return_caches=True)
    assert temperature == 0 or res.accepted < res.proposed  # a rejection happened, so a rollback did
    assert tcache.length == len(held) and len(held) >= len(PROMPT) + 29
    assert len(held) - 1 <= dcache.length <= len(held)
    for model, cache in ((target, tcache), (draft, dcache)):
        L = cache.length
        fresh = KVCache(model.config, 1, L)
        prefill(model, torch.tensor([held[:L]]), fresh)
        torch.testing.assert_close(cache.k[:, :, :, :L], fresh.k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cache.v[:, :, :, :L], fresh.v, rtol=1e-5, atol=1e-5)


def test_rollback_validates():
    cache = KVCache(GPTConfig(n_layer=1, n_head=2, d_model=8, d_ff=16, seq_len=16), 1, 8)
    cache.length = 5
    speculative.rollback(cache, 2)
    assert cache.length == 2
    for bad in (-1, 3, 2.0, True):
        with pytest.raises(ValueError):
            speculative.rollback(cache, bad)


def test_ngram_draft_proposes_what_followed_the_last_match():
    d = speculative.NGramDraft(2)
    assert d.propose([1, 2, 3, 4, 9, 1, 2], 3) == [3, 4, 9]
    assert d.propose([1, 2, 3, 1, 2, 7, 1, 2], 2) == [7, 1]  # the latest occurrence wins
    assert d.propose([1, 2, 3], 4) == []
    with pytest.raises(ValueError):
        speculative.NGramDraft(0)


def test_parameters_are_validated(models):
    target, draft = models
    for kwargs in (dict(n=0), dict(gamma=0), dict(temperature=-1.0), dict(n=200)):
        with pytest.raises(ValueError):
            speculative.speculative_generate(target, draft, PROMPT, **{"n": 10, **kwargs})
    with pytest.raises(ValueError):
        speculative.sample_rule(P, Q, 10, rule="p>q")
    with pytest.raises(ValueError):
        speculative.sample_rule(P, Q * 2, 10)


# ---------------------------------------------------------------- notebook 11's lab (helpers/decode/spec_lab.py)


def test_lab_validators_and_rule_check():
    from helpers.decode import spec_lab as L

    assert L.check_temperatures("TEMPERATURES", [1, 0.0, 0.5, 1.0]) == [0.0, 0.5, 1.0]
    for bad in ([], [-0.1], [float("nan")], [True], 0.5):
        with pytest.raises(ValueError, match="TEMPERATURES"):
            L.check_temperatures("TEMPERATURES", bad)
    assert L.check_fraction("THRESHOLD", 0.01) == 0.01
    for bad in (0, 1, 1.5, "0.1", True):
        with pytest.raises(ValueError, match="THRESHOLD"):
            L.check_fraction("THRESHOLD", bad)
    checks = L.rule_check(P, Q, 50_000, seed=1)
    assert checks["exact"]["test"].passes and not checks["p>=q"]["test"].passes
    assert int(checks["exact"]["counts"].sum()) == 50_000


def test_speed_grid_rows_are_consistent(models):
    from helpers.decode import spec_lab as L

    target, draft = models
    drafts = {"gpt": draft, "lookup": speculative.NGramDraft(2)}
    costs = L.decode_costs(target, draft, PROMPT, [2], reps=2)
    rows = L.speed_grid(target, drafts, [PROMPT, PROMPT.flip(0)], 12, [2], [0.0, 1.0], costs)
    assert len(rows) == 4 and {(r["draft"], r["temperature"]) for r in rows} == {
        (d, t) for d in drafts for t in (0.0, 1.0)}
    for r in rows:
        assert 0 <= r["alpha"] <= 1 and r["speedup_q25"] <= r["speedup"] <= r["speedup_q75"]
        assert 1 <= r["tokens_per_pass"] <= 3 and r["expected"] == pytest.approx(speculative.expected_tokens(r["alpha"], 2))
        assert r["predicted"] == pytest.approx(speculative.predicted_speedup(r["alpha"], 2, r["c"]))
        assert r["c_q25"] <= r["c"] <= r["c_q75"]
        assert r["proposal_rate"] == (1.0 if r["draft"] == "gpt" else r["proposal_rate"]) and len(r["runs"]) == 2
    (row,) = L.greedy_rows(target, {"gpt": draft}, PROMPT, 12, [2])
    assert row[:4] == ["gpt", 2, 12, 12] and row[5] is None  # identical, so no tie gap
    by_i, by_pos = L.position_rows(rows[0]["runs"], 2, 12, bins=3)
    assert [row[0] for row in by_i] == [0, 1][:len(by_i)] and sum(row[1] for row in by_pos) == sum(
        len(x.betas) for x in rows[0]["runs"])
    for r in rows:  # the ceiling: tokens per pass over at least one decode step; noise flags a speedup above it
        assert r["ceiling"] == pytest.approx(r["tokens_per_pass"])
        assert r["noise"] == (r["speedup"] > r["ceiling"]) and r["baseline_drift"] >= 0
        overrun = sum(len(x.tokens) for x in r["runs"])  # 12 per run, after the last round's overrun is cut
        assert r["truncated_per_pass"] * sum(x.target_passes for x in r["runs"]) == pytest.approx(
            sum(x.accepted for x in r["runs"]) + sum(x.target_passes for x in r["runs"]) - overrun)
    assert "γ=2" in L.gap_sentence(rows, "gpt", [2], [0.0, 1.0]) or "within" in L.gap_sentence(rows, "gpt", [2], [0.0, 1.0])


def _row(draft, speedup, noise, gamma=1, other=0.0):
    return {"draft": draft, "gamma": gamma, "temperature": 1.0, "speedup": speedup, "noise": noise,
            "proposal_rate": 0.1, "tokens_per_pass": 1.1, "ceiling": 1.1, "speedup_q25": speedup,
            "speedup_q75": speedup, "other_ms_per_token": other}


def test_lab_sentences_follow_the_numbers():
    from helpers.measure import bench
    from helpers.decode import spec_lab as L

    with pytest.raises(ValueError, match="GAMMAS=.*string.*-y"):
        L.check_gammas("GAMMAS", "[1, 2]")
    with pytest.raises(ValueError, match="TEMPERATURES=.*string"):
        L.check_temperatures("TEMPERATURES", "[0.0]")
    assert L.check_gammas("GAMMAS", (1, 2)) == [1, 2]
    with pytest.raises(ValueError, match="GAMMAS"):
        L.check_gammas("GAMMAS", [0])
    assert L.trend([0.71, 0.75, 0.80, 0.77]) == "roughly flat"
    assert L.trend([0.68, 0.68, 0.82, 0.93]) == "rises" and L.trend([0.9, 0.7]) == "falls"
    quiet, loud = bench.Timing(1.0, 0.95, 1.05, []), bench.Timing(1.0, 0.8, 1.4, [])
    assert L.cost_warnings({"a": quiet}, {1: 1.2}) == []
    warn = L.cost_warnings({"a": quiet, "b": loud}, {1: 0.8, 2: 1.1})
    assert len(warn) == 2 and "b ±" in warn[0] and "a ±" not in warn[0] and "γ=1: 0.80" in warn[1] and "γ=2" not in warn[1]
    assert L.outside(_row("x", 1, False, other=-0.12)) == "0 ms (within noise)"
    assert L.outside(_row("x", 1, False, other=0.5)) == "0.50 ms"
    # the fastest prompt-lookup row not flagged as noise; the flagged one is counted, never reported as a result
    rows = [_row("prompt-lookup", 1.9, True, 1), _row("prompt-lookup", 1.05, False, 2), _row("prompt-lookup", 0.8, False, 4)]
    text = L.lookup_sentence(rows)
    assert "γ=2" in text and "1.05x" in text and "1.9" not in text and "1 of its 3 rows" in text
    assert "fastest" not in L.lookup_sentence([_row("prompt-lookup", 1.9, True)])


def _gap_rows(ratios, gamma=4):
    """Grid rows of one draft at one γ whose tokens per pass are `ratios` × the formula's, one per temperature."""
    run = speculative.SpecResult(tokens=torch.zeros(10, dtype=torch.long))
    return [{"draft": "gpt", "gamma": gamma, "temperature": float(t), "tokens_per_pass": 2.0 * r, "expected": 2.0,
             "runs": [run], "truncated_per_pass": 0.0, "alpha": 0.5} for t, r in enumerate(ratios)]


def test_gap_sentence_states_the_sign_the_gaps_have():
    """Below the formula at every temperature, but not all by more than 5%, must not read 'no sign shared'."""
    from helpers.decode import spec_lab as L

    small_below = L.gap_sentence(_gap_rows([0.97, 0.96]), "gpt", [4], [0.0, 1.0])
    assert "no sign shared" not in small_below and "below it at every temperature, by 3%-4%" in small_below
    uneven = L.gap_sentence(_gap_rows([0.90, 0.98]), "gpt", [4], [0.0, 1.0])
    assert "below it at every temperature, by 2%-10%" in uneven and "systematic" in uneven
    above = L.gap_sentence(_gap_rows([1.08, 1.12]), "gpt", [4], [0.0, 1.0])
    assert "exceed the formula at every temperature (by 8%-12%)" in above and "within" not in above
    mixed = L.gap_sentence(_gap_rows([0.97, 1.02]), "gpt", [4], [0.0, 1.0])
    assert "no sign shared" in mixed and "within 3%" in mixed
    assert "equal to it" in L.gap_sentence(_gap_rows([1.0, 1.0]), "gpt", [4], [0.0, 1.0])
    assert "at or below" in L.gap_sentence(_gap_rows([1.0, 0.98]), "gpt", [4], [0.0, 1.0])
    below = L.gap_sentence(_gap_rows([0.90, 0.85]), "gpt", [4], [0.0, 1.0])
    assert "fall below the formula at every temperature (by 10%-15%)" in below
