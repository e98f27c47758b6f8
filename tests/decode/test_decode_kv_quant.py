"""The quantized KV cache: int8 against PyTorch's fake quantization, fp8 within e4m3's rounding, the bytes
formula against the allocation, and logits through it close to the full forward's."""
import pytest
import torch

from helpers.decode import kv_quant
from helpers.gpt.generation import KVCache, generate
from helpers.gpt.model import GPT, GPTConfig


def test_int8_matches_torch_fake_quantization_and_fp8_stays_within_e4m3_rounding():
    x = 5 * torch.randn(2, 3, 7, 16, generator=torch.Generator().manual_seed(0))
    x[0, 0, 0] = 0.0  # an all-zero head vector: a tiny scale, codes 0, no NaN
    codes, scale = kv_quant.quantize_kv(x, "int8")
    assert codes.dtype == torch.int8 and scale.shape == (2, 3, 7, 1)
    flat = x.reshape(-1, 16)
    ref = torch.fake_quantize_per_channel_affine(flat, scale.reshape(-1), torch.zeros(flat.size(0), dtype=torch.int32),
                                                 0, -127, 127)
    torch.testing.assert_close(kv_quant.dequantize_kv(codes, scale, torch.float32).reshape(-1, 16), ref, rtol=0, atol=1e-6)
    assert int(codes.abs().amax(-1).min()) == 0 and int(codes.abs().amax()) == 127  # absmax maps to 127
    codes, scale = kv_quant.quantize_kv(x, "fp8")
    back = kv_quant.dequantize_kv(codes, scale, torch.float32)
    assert codes.dtype == torch.float8_e4m3fn and not back.isnan().any()
    assert bool(((back - x).abs() <= 2**-4 * x.abs() + scale * 2**-10).all())
    with pytest.raises(ValueError):
        kv_quant.QuantKVCache(GPTConfig.preset("tiny"), 1, 8, fmt="int4")


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_the_cache_allocates_its_formula_and_generates_like_the_fp32_cache(fmt):
    cfg = GPTConfig.preset("tiny", n_kv_head=2)
    cache = kv_quant.QuantKVCache(cfg, 3, 20, fmt=fmt)
    assert cache.nbytes == 3 * 20 * kv_quant.quant_bytes_per_token(cfg.n_layer, 2, cfg.head_dim)
    assert kv_quant.quant_bytes_per_token(cfg.n_layer, 2, cfg.head_dim) < KVCache(cfg, 1, 1, dtype=torch.bfloat16).nbytes
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    seq = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    cache = kv_quant.QuantKVCache(cfg, 2, 12, fmt=fmt)
    with torch.no_grad():
        got = torch.cat([model(seq[:, :6], cache=cache)[0]] + [model(seq[:, t:t + 1], cache=cache)[0] for t in range(6, 12)], 1)
        full = model(seq)[0]
    assert cache.length == 12
    # 8-bit keys and values: the logits move by a small share of their range, not by nothing and not by much
    err = float((got - full).abs().max() / full.abs().max())
    assert 0 < err < 0.05, err
    prompt = seq[:, :6]
    assert generate(model, prompt, 4, make_cache=kv_quant.make_cache(fmt)).shape == (2, 4)
    with pytest.raises(ValueError):  # 6 + 4 tokens need 9 slots (the last one is never fed back)
        generate(model, prompt, 4, make_cache=lambda c, b, n, **kw: kv_quant.QuantKVCache(c, b, n - 2, fmt=fmt))


def test_rows_put_the_fp32_cache_first_and_its_loss_is_validation_loss():
    from helpers.gpt.pretrained import validation_loss
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny")).eval()
    tokens = torch.randint(0, 256, (2000,), generator=torch.Generator().manual_seed(2))
    assert abs(kv_quant.cached_loss(model, tokens, "fp32", 1) - validation_loss(model, tokens, batches=1)) < 1e-5
    rows = kv_quant.quant_rows(model, [tokens[:5]], 4, tokens, 1)
    assert [r["format"] for r in rows] == ["fp32", "bf16", "int8", "fp8"]
    assert rows[0]["identical"] == rows[0]["of"] == 4 and rows[0]["first divergence"] is None
    assert [r["bytes per token"] for r in rows] == [2 * 2 * 4 * 32 * 4, 2 * 2 * 4 * 32 * 2] + [2 * 2 * 4 * (32 + 4)] * 2
    assert rows[0]["divergences"] == [None]


def test_divergences_are_each_prompts_first_different_token_and_the_earliest_is_their_minimum(monkeypatch):
    ref = torch.arange(6)[None]
    flips = {"bf16": {}, "int8": {0: 4, 2: 1}, "fp8": {1: 0}}  # per format: prompt -> first token that differs

    def fake_generate(model, prompt, n, make_cache):
        out = ref.clone()
        at = flips.get(make_cache, {}).get(int(prompt[0]))
        if at is not None:
            out[0, at:] += 100  # every token from the first difference on differs, as greedy decoding does
        return out
    monkeypatch.setattr(kv_quant, "make_cache", lambda fmt: fmt)
    monkeypatch.setattr(kv_quant, "generate", fake_generate)
    monkeypatch.setattr(kv_quant, "cached_loss", lambda *a, **k: 1.0)
    model = GPT(GPTConfig.preset("tiny"))
    rows = {r["format"]: r for r in kv_quant.quant_rows(model, [torch.tensor([i]) for i in range(3)], 6, ref, 1)}
    assert rows["fp32"]["divergences"] == rows["bf16"]["divergences"] == [None, None, None]
    assert rows["int8"]["divergences"] == [4, None, 1] and rows["int8"]["first divergence"] == 1
    assert rows["int8"]["identical"] == 4 + 6 + 1
    assert rows["fp8"]["divergences"] == [None, 0, None] and rows["fp8"]["first divergence"] == 0
