"""helpers.gpt.generation: cached generation equals uncached, the cache allocates what the formula says and
refuses to overflow, a rewound step measures the same position every call, sampling is reproducible; the cache
in every dtype under a model of every dtype stays within a stated tolerance of the fp32 cache, and the
sampler's cut-offs are exact at their boundaries."""
from __future__ import annotations

import math

import pytest
import torch

from helpers.gpt import generation
from helpers.gpt.model import GPT, GPTConfig
from kv_support import DTYPES, assert_close_to_reference, small_gpt, tolerance




@pytest.mark.slow
@pytest.mark.parametrize("n_kv_head", [4, 2, 1])  # MHA, GQA (a divisor), MQA
def test_greedy_identical_with_and_without_cache(n_kv_head):
    model = small_gpt(n_kv_head)
    prompt = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    with_cache = generation.generate(model, prompt, 30, cache=True)
    without = generation.generate(model, prompt, 30, cache=False)
    assert with_cache.shape == (2, 30)
    assert torch.equal(with_cache, without)


@pytest.mark.slow
@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_cached_logits_match_full_forward(n_kv_head):
    model = small_gpt(n_kv_head)
    seq = torch.randint(0, 256, (3, 20), generator=torch.Generator().manual_seed(2))
    full = model(seq)[0]
    cache = generation.KVCache(model.config, 3, 20)
    first = model(seq[:, :9], cache=cache)[0]  # a chunk, then tokens one at a time
    rest = [generation.decode_one(model, seq[:, t], cache) for t in range(9, 20)]
    torch.testing.assert_close(first, full[:, :9], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.stack(rest, 1), full[:, 9:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_kv_head,dtype", [(4, torch.float32), (2, torch.bfloat16), (1, torch.float16)])
def test_cache_allocates_two_tensors_of_layers_kv_heads_length_and_head_dim(n_kv_head, dtype):
    cfg = small_gpt(n_kv_head).config
    cache = generation.KVCache(cfg, batch=3, max_len=17, dtype=dtype)
    per_token = 2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim * (torch.finfo(dtype).bits // 8)
    assert cache.nbytes == per_token * 3 * 17
    assert cache.nbytes == sum(t.numel() * t.element_size() for t in (cache.k, cache.v))


def test_cache_overflow_and_bad_sizes_raise():
    model = small_gpt(2)
    cache = generation.KVCache(model.config, 1, 4)
    with pytest.raises(ValueError, match="max_len=4"):
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="batch=0 must be a positive int"):
        generation.KVCache(model.config, 0, 4)
    with pytest.raises(ValueError, match="seq_len"):
        generation.generate(model, torch.zeros(40, dtype=torch.long), 10)
    with pytest.raises(ValueError, match="n=0 must be a positive int"):
        generation.generate(model, torch.zeros(4, dtype=torch.long), 0)


@pytest.mark.slow
@pytest.mark.parametrize("T", [1, 3])
def test_rewound_step_runs_at_the_same_position_every_call(T):
    model = small_gpt(2)
    seq = torch.randint(0, 256, (2, 10 + T), generator=torch.Generator().manual_seed(3))
    cache = generation.KVCache(model.config, 2, 10 + T)
    generation.prefill(model, seq[:, :10], cache)
    step = generation.rewound_step(model, cache, seq[:, 10:] if T > 1 else seq[:, 10])
    first, second = step(), step()
    assert cache.length == 10 + T and torch.equal(first, second)
    torch.testing.assert_close(first, model(seq)[0][:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_greedy_top1_and_seeded_sampling():
    model = small_gpt(2)
    prompt = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(4))
    greedy = generation.generate(model, prompt, 5)
    assert greedy.shape == (2, 5) and not model.training
    assert torch.equal(greedy[:, 0], model(prompt)[0][:, -1].argmax(-1))
    top1 = generation.Sampler(temperature=1.0, top_k=1, seed=0)
    assert torch.equal(generation.generate(model, prompt, 5, top1), greedy)  # top-1 sampling is greedy
    a = generation.generate(model, prompt, 4, generation.Sampler(temperature=1.0, seed=1))
    b = generation.generate(model, prompt, 4, generation.Sampler(temperature=1.0, seed=1))
    assert torch.equal(a, b)


@pytest.mark.slow
def test_sampling_reproducible_and_restricted():
    logits = torch.randn(4, 256, generator=torch.Generator().manual_seed(3))
    a = generation.Sampler(temperature=0.8, top_k=20, seed=5)(logits)
    b = generation.Sampler(temperature=0.8, top_k=20, seed=5)(logits)
    assert torch.equal(a, b)
    top1 = generation.Sampler(temperature=1.0, top_k=1, seed=0)(logits)
    assert torch.equal(top1, logits.argmax(-1))
    tiny_p = generation.Sampler(temperature=1.0, top_p=1e-6, seed=0)(logits)  # the nucleus holds only the top token
    assert torch.equal(tiny_p, logits.argmax(-1))
    s = generation.Sampler(temperature=1.0, top_k=5, seed=1)
    draws = torch.stack([s(logits) for _ in range(50)])  # (50, 4)
    top5 = logits.topk(5).indices  # (4, 5)
    assert all(bool((draws[:, i, None] == top5[i]).any(-1).all()) for i in range(4))
    model = small_gpt(2)
    prompt = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(4))
    x = generation.generate(model, prompt, 12, generation.Sampler(temperature=1.0, top_p=0.9, seed=7))
    y = generation.generate(model, prompt, 12, generation.Sampler(temperature=1.0, top_p=0.9, seed=7))
    assert torch.equal(x, y)
    for bad in (dict(temperature=-1.0), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            generation.Sampler(**bad)


# ---------------------------------------------------------------- cache dtypes

def _teacher_forced(model, seq, cache, split=6):
    """Logits (B, S, vocab) of seq through the cache: a prefill of `split` tokens, then one token at a time."""
    with torch.no_grad():
        first = model(seq[:, :split], cache=cache)[0]
        rest = [generation.decode_one(model, seq[:, t], cache)[:, None] for t in range(split, seq.size(1))]
    return torch.cat([first] + rest, 1)


@pytest.mark.slow
@pytest.mark.parametrize("model_dtype", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_contiguous_cache_in_any_dtype_under_a_model_of_any_dtype(model_dtype, dtype):
    model = small_gpt(2).to(model_dtype)
    seq = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(5))
    cache = generation.KVCache(model.config, 2, 16, dtype=dtype)
    got = _teacher_forced(model, seq, cache)
    ref = _teacher_forced(model, seq, generation.KVCache(model.config, 2, 16, dtype=torch.float32))
    assert cache.k.dtype == cache.v.dtype == dtype  # stores in the cache's dtype
    assert got.dtype == model_dtype  # and hands the model back its own
    assert_close_to_reference(got, ref, tolerance(model_dtype, dtype))
    # computes in the wider of the two dtypes, returns the query's
    q = torch.randn(2, 4, 3, 8).to(model_dtype)
    keys, values = torch.randn(2, 2, 5, 8).to(dtype), torch.randn(2, 2, 5, 8).to(dtype)
    out = generation.cached_attention(q, keys, values)
    wide = generation.compute_dtype(model_dtype, dtype)
    assert out.dtype == model_dtype and wide == torch.promote_types(model_dtype, dtype)
    want = generation.cached_attention(q.to(wide), keys.to(wide), values.to(wide)).to(model_dtype)
    assert torch.equal(out, want)


@pytest.mark.slow
@pytest.mark.parametrize("model_dtype", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_generate_with_any_cache_dtype(model_dtype, dtype):
    model = small_gpt(2).to(model_dtype)
    prompt = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(6))
    got = generation.generate(model, prompt, 12, dtype=dtype)
    ref = generation.generate(model, prompt, 12, dtype=torch.float32)
    assert got.shape == (2, 12)
    # the tokens agree until a step where the fp32-cache run's top two logits are within tolerance
    logits = _teacher_forced(model, torch.cat([prompt, ref], 1)[:, :-1],
                             generation.KVCache(model.config, 2, 18), split=7)[:, 6:].float()  # (2, 12, vocab)
    tol, scale = tolerance(model_dtype, dtype), float(logits.abs().max())
    top2 = logits.topk(2, dim=-1).values
    close = top2[..., 0] - top2[..., 1] <= 2 * tol * scale  # (2, 12)
    for b in range(2):
        differ = (got[b] != ref[b]).nonzero()
        if len(differ):
            assert bool(close[b, int(differ[0])]), f"row {b} leaves the fp32-cache tokens at a clear step"


def test_cache_dtypes_the_api_does_not_allow_are_refused():
    model = small_gpt(2)
    prompt = torch.zeros(4, dtype=torch.long)
    for bad in (torch.int8, torch.float8_e4m3fn, torch.complex64, "bf16"):
        with pytest.raises(ValueError, match="cannot hold a KV cache; choose one of torch.float32"):
            generation.KVCache(model.config, 1, 4, dtype=bad)
        with pytest.raises(ValueError, match="cannot hold a KV cache"):
            generation.generate(model, prompt, 2, dtype=bad)
    assert generation.generate(model, prompt, 2, dtype=torch.float64).shape == (1, 2)  # float64 is allowed


# ---------------------------------------------------------------- the sampler's boundaries


def _spread_logits(B=3, V=256, seed=0):
    """Logits far apart (std 12): the top tokens hold almost all the mass, the tail ~1e-30 each."""
    return 12 * torch.randn(B, V, generator=torch.Generator().manual_seed(seed))


def _draws(sampler, logits, n=40):
    return torch.stack([sampler(logits) for _ in range(n)])


@pytest.mark.parametrize("logits", [_spread_logits(), _spread_logits(seed=1) / 12])  # std 12 and std 1
@pytest.mark.parametrize("no_cut", [dict(top_k=None), dict(top_k=256), dict(top_k=10_000), dict(top_p=None),
                                    dict(top_p=1.0), dict(top_p=1), dict(top_k=256, top_p=1.0)])
def test_a_cut_that_means_no_cut_changes_nothing(no_cut, logits):
    plain = generation.Sampler(temperature=0.7, seed=3)
    same = generation.Sampler(temperature=0.7, seed=3, **no_cut)
    assert torch.equal(same.probabilities(logits), plain.probabilities(logits))  # bit for bit
    assert torch.equal(_draws(same, logits), _draws(plain, logits))  # so the same draws for the seed


def test_top_p_one_keeps_the_tail_that_fp32_rounding_would_cut():
    logits = _spread_logits()
    probs = generation.Sampler(temperature=1.0, top_p=1.0).probabilities(logits)
    assert bool((probs > 0).all())  # every token keeps its (tiny) probability


def _tied_logits():
    """Row 0: tokens 3 and 7 tie at the top; row 1: tokens 0, 1 and 2 tie; row 2: no tie."""
    logits = torch.randn(3, 16, generator=torch.Generator().manual_seed(2))
    logits[0, 3] = logits[0, 7] = 5.0
    logits[1, :3] = 5.0
    logits[2, 9] = 5.0
    return logits


@pytest.mark.parametrize("seed", range(5))
def test_top_k_one_is_greedy_even_with_ties(seed):
    logits = _tied_logits()
    greedy = generation.Sampler()(logits)
    assert greedy.tolist() == [3, 0, 9]  # argmax: the lowest id among tied maxima
    top1 = generation.Sampler(temperature=1.5, top_k=1, seed=seed)
    assert all(torch.equal(d, greedy) for d in _draws(top1, logits, 30))
    assert torch.equal(top1.probabilities(logits), generation.Sampler().probabilities(logits))


@pytest.mark.parametrize("seed", range(5))
def test_a_top_p_that_leaves_one_token_is_greedy_even_with_ties(seed):
    logits = _tied_logits()
    greedy = generation.Sampler()(logits)
    top_prob = generation.Sampler(temperature=1.0).probabilities(logits).max(-1).values
    for top_p in (1e-9, float(top_prob.min())):  # at or below the top token's probability: it alone reaches top_p
        s = generation.Sampler(temperature=1.0, top_p=top_p, seed=seed)
        assert all(torch.equal(d, greedy) for d in _draws(s, logits, 30))


def test_ties_at_the_kth_place_keep_exactly_k_tokens_the_lower_ids_first():
    logits = torch.tensor([[1.0, 5.0, 5.0, 5.0, 0.0, 5.0]])
    probs = generation.Sampler(temperature=1.0, top_k=2).probabilities(logits)
    assert (probs > 0).nonzero()[:, 1].tolist() == [1, 2]
    torch.testing.assert_close(probs[0, [1, 2]], torch.tensor([0.5, 0.5]))


def test_top_p_keeps_the_smallest_prefix_whose_mass_reaches_it_exactly_at_the_boundary():
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(7))
    full = generation.Sampler(temperature=1.0).probabilities(logits)
    ranked = full.sort(dim=-1, descending=True, stable=True).values.double()
    for m in (1, 2, 5):
        for row in range(4):
            mass = float(ranked[row, :m].sum())  # exactly what the first m tokens hold
            at = generation.Sampler(temperature=1.0, top_p=mass).probabilities(logits[row:row + 1])
            above = generation.Sampler(temperature=1.0, top_p=math.nextafter(mass, 1.0))
            assert int((at > 0).sum()) == m  # reaching top_p exactly stops the set
            assert int((above.probabilities(logits[row:row + 1]) > 0).sum()) == m + 1  # one ulp more: the next


def test_temperature_boundaries():
    logits = _tied_logits()
    raw = generation.Sampler(temperature=1.0).probabilities(logits)
    assert torch.equal(raw, logits.softmax(-1))  # T=1: the model's softmax, bit for bit
    assert torch.equal(generation.Sampler(temperature=0).probabilities(logits),
                       torch.nn.functional.one_hot(logits.argmax(-1), 16).float())
    for tiny in (1e-30, 1e-45, 1e-300):  # logits / T overflows (or T rounds to 0 in fp32): the limit T -> 0
        probs = generation.Sampler(temperature=tiny).probabilities(logits)
        assert bool(torch.isfinite(probs).all())
        torch.testing.assert_close(probs[0, [3, 7]], torch.tensor([0.5, 0.5]))  # the tied top tokens share it
        torch.testing.assert_close(probs[1, :3], torch.full((3,), 1 / 3))
        assert float(probs[2, 9]) == 1.0
        draws = _draws(generation.Sampler(temperature=tiny, seed=1), logits, 20)
        assert bool((draws[:, 2] == 9).all()) and set(draws[:, 0].tolist()) <= {3, 7}
    flat = generation.Sampler(temperature=1e30).probabilities(logits)  # a huge T: uniform
    torch.testing.assert_close(flat, torch.full_like(flat, 1 / 16))
    for bad in (dict(temperature=float("inf")), dict(temperature=True), dict(top_p=True), dict(top_k=2.0)):
        with pytest.raises(ValueError):
            generation.Sampler(**bad)
