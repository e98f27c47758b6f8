"""The course GPT: shapes, GQA semantics, attention kernels, checkpointing, save/load, parameter counts."""
import math

import pytest
import torch
import torch.nn.functional as F

from helpers.gpt import model as M
from helpers.measure.memory import saved_tensor_bytes
from helpers.gpt.model import GPT, GPTConfig

FP32 = dict(rtol=1e-5, atol=1e-5)  # fp32 kernels that sum in a different order differ by ~1e-6


def tiny(**overrides) -> GPTConfig:
    return GPTConfig.preset("tiny", **{"seq_len": 32, **overrides})


def tokens(batch=2, T=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, T), generator=g), torch.randint(0, 256, (batch, T), generator=g)


@pytest.mark.parametrize("n_kv_head", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_forward_shapes_and_kv_heads(n_kv_head):
    torch.manual_seed(0)
    cfg = tiny(n_kv_head=n_kv_head)
    m = GPT(cfg)
    idx, tgt = tokens()
    logits, loss = m(idx, tgt)
    assert logits.shape == (2, 20, 256) and loss.shape == ()
    attn = m.blocks[0].attn
    assert attn.q_proj.weight.shape == (cfg.n_head * cfg.head_dim, cfg.d_model)
    assert attn.kv_proj.weight.shape == (2 * n_kv_head * cfg.head_dim, cfg.d_model)
    assert m(idx)[1] is None
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, 256), tgt.reshape(-1)))
    assert abs(loss.item() - math.log(256)) < 0.1  # small init: close to uniform over 256 bytes


def test_gqa_equals_mha_with_shared_kv_weights():
    """Query head h must use kv head h // (n_head // n_kv_head): copy kv rows accordingly into MHA."""
    torch.manual_seed(0)
    gqa, mha = GPT(tiny(n_kv_head=2), attn_impl="naive"), GPT(tiny(n_kv_head=4), attn_impl="naive")
    state = gqa.state_dict()
    hd, d, rep = gqa.config.head_dim, gqa.config.d_model, 2
    for i in range(gqa.config.n_layer):
        key = f"blocks.{i}.attn.kv_proj"
        w = state[key + ".weight"].view(2, 2, hd, d).repeat_interleave(rep, dim=1)  # (k|v, H, hd, d)
        b = state[key + ".bias"].view(2, 2, hd).repeat_interleave(rep, dim=1)
        state[key + ".weight"], state[key + ".bias"] = w.reshape(-1, d), b.reshape(-1)
    mha.load_state_dict(state)
    idx, _ = tokens()
    torch.testing.assert_close(mha(idx)[0], gqa(idx)[0], **FP32)


@pytest.mark.parametrize("n_kv_head", [4, 1])
def test_naive_and_sdpa_agree(n_kv_head):
    torch.manual_seed(0)
    m = GPT(tiny(n_kv_head=n_kv_head), attn_impl="naive")
    idx, tgt = tokens(T=31)
    naive_logits, naive_loss = m(idx, tgt)
    m.attn_impl = "sdpa"
    sdpa_logits, sdpa_loss = m(idx, tgt)
    torch.testing.assert_close(sdpa_logits, naive_logits, **FP32)
    torch.testing.assert_close(sdpa_loss, naive_loss, **FP32)


def test_naive_attention_is_causal():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    out = M.naive_attention(q, k, v, True)
    v2 = v.clone()
    v2[:, :, -1] += 100.0  # the last key's value may only change the last query's output
    out2 = M.naive_attention(q, k, v2, True)
    torch.testing.assert_close(out2[:, :, :-1], out[:, :, :-1])
    assert not torch.allclose(out2[:, :, -1], out[:, :, -1])
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), **FP32)


def test_custom_attention_callable_and_registry():
    calls = []

    def spy(q, k, v, is_causal):
        calls.append((tuple(q.shape), tuple(k.shape), is_causal))
        return M.naive_attention(q, k, v, is_causal)

    torch.manual_seed(0)
    m = GPT(tiny(n_kv_head=1), attn_impl="naive")
    idx, _ = tokens()
    ref = m(idx)[0]
    m.attn_impl = spy
    torch.testing.assert_close(m(idx)[0], ref)
    assert calls == [((2, 4, 20, 32), (2, 4, 20, 32), True)] * 2  # one per block, kv repeated to 4 heads
    M.register_attention("spy-test", spy)
    try:
        m.attn_impl = "naive"
        m.attn_impl = "spy-test"
        m(idx)
        assert len(calls) == 4 and m.attn_impl == "spy-test"
    finally:
        M.ATTENTION.pop("spy-test")
    with pytest.raises(ValueError, match="flash-v9"):
        m.attn_impl = "flash-v9"


def _grads(m, idx, tgt):
    m.zero_grad(set_to_none=True)
    m(idx, tgt)[1].backward()
    return {n: p.grad.clone() for n, p in m.named_parameters()}


def test_checkpointing_gives_equal_gradients_and_saves_memory():
    torch.manual_seed(0)
    m = GPT(tiny(n_layer=3), attn_impl="naive")
    idx, tgt = tokens()
    params = list(m.parameters())
    plain_grads = _grads(m, idx, tgt)
    plain_bytes = saved_tensor_bytes(lambda: m(idx, tgt), ignore=params)
    for layers, expected in ((True, [0, 1, 2]), ([1], [1])):
        m.set_checkpointing(layers)
        assert m.checkpointed_layers == expected
        ckpt_grads = _grads(m, idx, tgt)
        for name, g in plain_grads.items():
            torch.testing.assert_close(ckpt_grads[name], g, rtol=1e-6, atol=1e-7, msg=name)
        assert saved_tensor_bytes(lambda: m(idx, tgt), ignore=params) < plain_bytes  # it really recomputes
    m.set_checkpointing(False)
    assert m.checkpointed_layers == []
    assert saved_tensor_bytes(lambda: m(idx, tgt), ignore=params) == plain_bytes
    with pytest.raises(ValueError, match=r"\[3\]"):
        m.set_checkpointing([0, 3])


@pytest.mark.parametrize("tie", [True, False])
def test_save_load_round_trip(tmp_path, tie):
    torch.manual_seed(0)
    m = GPT(tiny(n_kv_head=2, tie_embeddings=tie, bias=not tie))
    with torch.no_grad():
        m.lm_head.weight.add_(0.5)  # make sure the head (tied or not) is really restored
    path = M.save_checkpoint(m, tmp_path / "ckpt" / "model.pt")
    loaded = M.load_checkpoint(path)
    assert loaded.config == m.config
    assert (loaded.lm_head.weight is loaded.wte.weight) == tie
    idx, _ = tokens()
    assert torch.equal(loaded(idx)[0], m(idx)[0])


def _hand_count(cfg: GPTConfig) -> int:
    """Parameters from the architecture alone, written out independently of the module tree."""
    d, hd, b = cfg.d_model, cfg.head_dim, int(cfg.bias)
    attn = d * cfg.n_head * hd + d * 2 * cfg.n_kv_head * hd + cfg.n_head * hd * d \
        + b * (cfg.n_head * hd + 2 * cfg.n_kv_head * hd + d)
    mlp = 2 * d * cfg.d_ff + b * (cfg.d_ff + d)
    layer_norms = 2 * (d + b * d)
    embeddings = cfg.vocab_size * d + cfg.seq_len * d
    head = 0 if cfg.tie_embeddings else d * cfg.vocab_size
    return embeddings + cfg.n_layer * (attn + mlp + layer_norms) + (d + b * d) + head


def _meta_model(cfg: GPTConfig) -> GPT:
    with torch.device("meta"):  # shapes only: no memory, no time
        return GPT(cfg)


def test_gpt2_preset_has_124m_parameters():
    m = _meta_model(GPTConfig.preset("gpt2"))
    # 50257*768 (tokens) + 1024*768 (positions) + 12 * 7,087,872 (blocks) + 2*768 (final LN)
    assert m.num_params(non_embedding=False) == 124_439_808
    assert m.num_params() == 124_439_808 - 50257 * 768 - 1024 * 768 == 85_056_000
    assert _meta_model(GPTConfig.preset("gpt2-medium")).num_params(non_embedding=False) == 354_823_168


@pytest.mark.parametrize("name,low,high", [("tiny", 0.2e6, 1e6), ("small10m", 9e6, 12e6),
                                           ("gpt2-medium", 340e6, 360e6), ("1.3b", 1.25e9, 1.35e9)])
def test_preset_sizes(name, low, high):
    cfg = GPTConfig.preset(name)
    n = _meta_model(cfg).num_params(non_embedding=False)
    assert low < n < high and n == _hand_count(cfg)


@pytest.mark.parametrize("overrides", [dict(n_kv_head=1, bias=False), dict(n_kv_head=2, tie_embeddings=False)])
def test_param_count_matches_hand_formula(overrides):
    cfg = tiny(**overrides)
    m = GPT(cfg)
    assert m.num_params(non_embedding=False) == _hand_count(cfg)
    # token and position tables leave; an untied LM head is a matmul weight and stays
    assert m.num_params() == _hand_count(cfg) - cfg.d_model * (cfg.vocab_size + cfg.seq_len)
    assert m.num_params() < m.num_params(non_embedding=False)


def test_config_validation_and_presets():
    with pytest.raises(ValueError, match="n_head=3"):
        GPTConfig(n_layer=1, n_head=3, d_model=64, d_ff=128, seq_len=8)
    with pytest.raises(ValueError, match="n_kv_head=3"):
        GPTConfig(n_layer=1, n_head=4, n_kv_head=3, d_model=64, d_ff=128, seq_len=8)
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig(n_layer=1, n_head=4, d_model=64, d_ff=128, seq_len=8, dropout=1.0)
    with pytest.raises(ValueError, match="'gpt5'"):
        GPTConfig.preset("gpt5")
    with pytest.raises(ValueError, match="n_heads"):
        GPTConfig.preset("tiny", n_heads=2)
    cfg = GPTConfig.preset("gpt2", n_kv_head=4)
    assert (cfg.n_layer, cfg.n_head, cfg.n_kv_head, cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.seq_len) \
        == (12, 12, 4, 768, 3072, 50257, 1024)
    assert GPTConfig.preset("tiny", n_head=8).n_kv_head == 8  # unset kv heads follow n_head
    assert GPTConfig.preset("1.3b").head_dim == 64


def test_too_long_input_is_rejected():
    m = GPT(tiny(seq_len=8))
    with pytest.raises(ValueError, match="seq_len=8"):
        m(torch.zeros(1, 9, dtype=torch.long))


class _ConcatCache:
    """The simplest KVCacheLike: per layer, keys and values concatenated along the sequence."""

    def __init__(self, batch, n_layer):
        self.k, self.v, self.length, self.batch = [None] * n_layer, [None] * n_layer, 0, batch

    def positions(self, T):
        return (self.length + torch.arange(T)).expand(self.batch, T)

    def attend(self, layer, q, k, v):
        if self.k[layer] is not None:
            k, v = torch.cat([self.k[layer], k], dim=2), torch.cat([self.v[layer], v], dim=2)
        self.k[layer], self.v[layer] = k, v
        rep = q.size(1) // k.size(1)
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        T, S = q.size(2), k.size(2)
        mask = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)  # new token t sees cache + new up to t
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def advance(self, T):
        self.length += T


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_forward_with_a_cache_matches_the_full_forward(kv_heads):
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", n_kv_head=kv_heads)).eval()
    idx = torch.randint(0, 256, (2, 11))
    full, _ = model(idx)
    cache = _ConcatCache(2, model.config.n_layer)
    with torch.no_grad():
        first, _ = model(idx[:, :7], cache=cache)  # prefill 7 tokens, then two chunks
        second, _ = model(idx[:, 7:8], cache=cache)
        third, _ = model(idx[:, 8:], cache=cache)
    got = torch.cat([first, second, third], dim=1)
    torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)
    assert cache.length == 11
    with pytest.raises(ValueError, match="past seq_len"):
        model(torch.zeros(2, model.config.seq_len, dtype=torch.long), cache=cache)
