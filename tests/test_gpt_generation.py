"""helpers.gpt.generation: cached generation equals uncached, the cache allocates what the formula says and
refuses to overflow, a rewound step measures the same position every call, sampling is reproducible."""
from __future__ import annotations

import pytest
import torch

from helpers.gpt import generation
from helpers.gpt.model import GPT, GPTConfig


def _model(n_kv_head: int, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(n_layer=2, n_head=4, n_kv_head=n_kv_head, d_model=32, d_ff=64, seq_len=48)
    model = GPT(cfg).eval()
    with torch.no_grad():  # larger weights than the init so that logits are far from ties
        for p in model.parameters():
            p.mul_(3.0)
    return model


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])  # MHA, GQA (a divisor), MQA
def test_greedy_identical_with_and_without_cache(n_kv_head):
    model = _model(n_kv_head)
    prompt = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    with_cache = generation.generate(model, prompt, 30, cache=True)
    without = generation.generate(model, prompt, 30, cache=False)
    assert with_cache.shape == (2, 30)
    assert torch.equal(with_cache, without)


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_cached_logits_match_full_forward(n_kv_head):
    model = _model(n_kv_head)
    seq = torch.randint(0, 256, (3, 20), generator=torch.Generator().manual_seed(2))
    full = model(seq)[0]
    cache = generation.KVCache(model.config, 3, 20)
    first = model(seq[:, :9], cache=cache)[0]  # a chunk, then tokens one at a time
    rest = [generation.decode_one(model, seq[:, t], cache) for t in range(9, 20)]
    torch.testing.assert_close(first, full[:, :9], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.stack(rest, 1), full[:, 9:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_kv_head,dtype", [(4, torch.float32), (2, torch.bfloat16), (1, torch.float16)])
def test_cache_allocates_two_tensors_of_layers_kv_heads_length_and_head_dim(n_kv_head, dtype):
    cfg = _model(n_kv_head).config
    cache = generation.KVCache(cfg, batch=3, max_len=17, dtype=dtype)
    per_token = 2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim * (torch.finfo(dtype).bits // 8)
    assert cache.nbytes == per_token * 3 * 17
    assert cache.nbytes == sum(t.numel() * t.element_size() for t in (cache.k, cache.v))


def test_cache_overflow_and_bad_sizes_raise():
    model = _model(2)
    cache = generation.KVCache(model.config, 1, 4)
    with pytest.raises(ValueError, match="max_len=4"):
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="batch=0 must be a positive int"):
        generation.KVCache(model.config, 0, 4)
    with pytest.raises(ValueError, match="seq_len"):
        generation.generate(model, torch.zeros(40, dtype=torch.long), 10)
    with pytest.raises(ValueError, match="n=0 must be a positive int"):
        generation.generate(model, torch.zeros(4, dtype=torch.long), 0)


@pytest.mark.parametrize("T", [1, 3])
def test_rewound_step_runs_at_the_same_position_every_call(T):
    model = _model(2)
    seq = torch.randint(0, 256, (2, 10 + T), generator=torch.Generator().manual_seed(3))
    cache = generation.KVCache(model.config, 2, 10 + T)
    generation.prefill(model, seq[:, :10], cache)
    step = generation.rewound_step(model, cache, seq[:, 10:] if T > 1 else seq[:, 10])
    first, second = step(), step()
    assert cache.length == 10 + T and torch.equal(first, second)
    torch.testing.assert_close(first, model(seq)[0][:, -1], rtol=1e-5, atol=1e-5)


def test_greedy_top1_and_seeded_sampling():
    model = _model(2)
    prompt = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(4))
    greedy = generation.generate(model, prompt, 5)
    assert greedy.shape == (2, 5) and not model.training
    assert torch.equal(greedy[:, 0], model(prompt)[0][:, -1].argmax(-1))
    top1 = generation.Sampler(temperature=1.0, top_k=1, seed=0)
    assert torch.equal(generation.generate(model, prompt, 5, top1), greedy)  # top-1 sampling is greedy
    a = generation.generate(model, prompt, 4, generation.Sampler(temperature=1.0, seed=1))
    b = generation.generate(model, prompt, 4, generation.Sampler(temperature=1.0, seed=1))
    assert torch.equal(a, b)


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
    model = _model(2)
    prompt = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(4))
    x = generation.generate(model, prompt, 12, generation.Sampler(temperature=1.0, top_p=0.9, seed=7))
    y = generation.generate(model, prompt, 12, generation.Sampler(temperature=1.0, top_p=0.9, seed=7))
    assert torch.equal(x, y)
    for bad in (dict(temperature=-1.0), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            generation.Sampler(**bad)
