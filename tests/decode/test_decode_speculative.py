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


PROMPT = torch.tensor([3, 14, 15, 92, 65, 35, 89, 79])

# p and q on a vocabulary of 6: the wrong rule "accept when p >= q" can never emit tokens 2 or 5 (p < q)
P = torch.tensor([0.30, 0.25, 0.05, 0.20, 0.15, 0.05], dtype=torch.float64)
Q = torch.tensor([0.10, 0.15, 0.30, 0.10, 0.05, 0.30], dtype=torch.float64)
DRAWS, THRESHOLD = 200_000, 0.001


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_speculative_equals_target_greedy(models, gamma):
    target, draft = models
    want = generate(target, PROMPT, 24)[0]
    got = speculative.speculative_generate(target, draft, PROMPT, 24, gamma=gamma, temperature=0)
    assert torch.equal(got.tokens, want)
    assert got.proposed > 0 and got.target_passes < 24  # it did speculate (the draft got some right)


@pytest.mark.slow
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


def test_one_round_in_its_three_pieces(models):
    """The draft loop, the verification pass and the rule applied in order, each against what it stands for."""
    target, draft = models
    g = torch.Generator().manual_seed(0)
    # the draft loop at T = 0 is the draft's own greedy decoding, and leaves its cache holding what it fed
    dcache = KVCache(draft.config, 1, 32)
    prefill(draft, PROMPT[None, :-1], dcache)
    xs, qs = speculative.draft_proposals(draft, dcache, [int(PROMPT[-1])], 4, 0.0, g)
    assert xs == generate(draft, PROMPT, 4)[0].tolist() and dcache.length == len(PROMPT) + 3
    assert all(q.shape == (draft.config.vocab_size,) and float(q[x]) == 1.0 for q, x in zip(qs, xs))
    # the verification pass scores k + 1 positions in one pass: the same distributions as a pass over everything
    tcache = KVCache(target.config, 1, 32)
    prefill(target, PROMPT[None, :-1], tcache)
    ps = speculative.verify(target, tcache, int(PROMPT[-1]), xs, 1.0)
    with torch.no_grad():
        full = torch.softmax(target(torch.tensor([PROMPT.tolist() + xs]))[0][0, -5:].double(), -1)
    assert ps.shape == (5, target.config.vocab_size) and tcache.length == len(PROMPT) + 4
    torch.testing.assert_close(ps, full, rtol=1e-4, atol=1e-6)
    # the rule in order: a perfect draft keeps all γ and adds the bonus; a one-hot mismatch stops at once
    assert speculative.accept_prefix(ps, list(ps[:4]), xs, g)[:4] == xs
    one_hot = [torch.nn.functional.one_hot(torch.tensor(i), 5).double() for i in (2, 3, 1)]
    assert speculative.accept_prefix(torch.stack(one_hot[:1] * 2), [one_hot[1]], [3], g) == [2]
    assert speculative.accept_prefix(torch.stack([one_hot[0], one_hot[2]]), [one_hot[0]], [2], g) == [2, 1]


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


@pytest.mark.slow
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


def test_prompts_open_on_a_line_and_are_seeded():
    text = torch.tensor(list(b"first line\nsecond line of some text\n" * 40))
    a = speculative.prompts(text, 3, 16, seed=1)
    assert len(a) == 3 and all(p.shape == (16,) and p.dtype == torch.long for p in a)
    assert all(torch.equal(x, y) for x, y in zip(a, speculative.prompts(text, 3, 16, seed=1)))
    assert all(chr(int(p[0])) in "fs" for p in a)  # each opens a line ("first ..." or "second ...")
    with pytest.raises(ValueError, match="too few"):
        speculative.prompts(text[:100], 1, 16)


def test_a_request_that_fits_the_positions_is_served_and_a_batch_is_refused():
    torch.manual_seed(0)
    target = GPT(GPTConfig(n_layer=1, n_head=2, d_model=16, d_ff=32, seq_len=32)).eval()
    draft = GPT(GPTConfig(n_layer=1, n_head=2, d_model=8, d_ff=16, seq_len=32)).eval()
    for total in (31, 32):  # gamma 1: the last round writes position prompt + n + gamma - 2 <= 31
        prompt = PROMPT[: 8]
        got = speculative.speculative_generate(target, draft, prompt, total - 8, gamma=1, temperature=0)
        assert torch.equal(got.tokens, generate(target, prompt, total - 8)[0])
    with pytest.raises(ValueError, match="seq_len=32"):
        speculative.speculative_generate(target, draft, PROMPT[:8], 24, gamma=2)  # position 32 would be written
    for batch in (PROMPT.repeat(2, 1), PROMPT[None, None], PROMPT[:0]):
        with pytest.raises(ValueError, match="one sequence"):
            speculative.speculative_generate(target, draft, batch, 4)
    assert speculative.speculative_generate(target, draft, PROMPT[None], 4).tokens.shape == (4,)
