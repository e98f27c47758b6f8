"""Key/value caches beyond the course GPT's contiguous one (`helpers.gpt.generation.KVCache`; the paged
cache is `helpers.decode.paged`): their size per token, published models' caches, a static cache for
compiled decode, and an MLA-style latent cache.

* `kv_bytes_per_token` (2 · layers · kv_heads · head_dim · bytes) and `REAL_MODELS`, published
  configurations with their sources; `real_model_rows` their bytes per token and at a context;
  `variant_configs` (MHA, GQA, MQA, an MLA-style latent on one model's dimensions) and `budget_rows`, what
  each holds in a memory budget.
* `StaticKVCache` and `static_step`: a cache whose shapes and position never change between steps,
  so that `torch.compile` can capture one decode step as a CUDA graph (gpt-fast's design, PyTorch
  Labs, 2023); `decode_compile_options` are the Inductor options that step is compiled with.
* `LatentKVCache` and `factorise_kv`: an MLA-style cache (DeepSeek-AI, 2024, DeepSeek-V2) on the course
  GPT: the k/v projection is factorised by a truncated SVD, W ≈ U (Σ Vᵀ), only the rank-r latent
  c = Σ Vᵀ x is cached, and the up-projection U is absorbed into the query and the output at decode.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers.gpt.generation import cache_dtype, causal_offset_mask, compute_dtype
from helpers.gpt.model import GPT, GPTConfig
from helpers.lowbit.quant_linear import FUSED_MATVEC
from helpers.measure.params import positive

# ---------------------------------------------------------------- bytes per token, real models


def kv_bytes_per_token(n_layer: int, n_kv_head: int, head_dim: int, bytes_per_element: float) -> float:
    """KV-cache bytes one token occupies: 2 (k and v) · layers · kv_heads · head_dim · bytes per element."""
    return 2 * n_layer * n_kv_head * head_dim * bytes_per_element


# Published configurations. (layers, query heads, kv heads, head_dim, cached elements per token per layer, source)
REAL_MODELS: dict[str, dict] = {
    "Llama 2 7B (MHA)": dict(layers=32, heads=32, kv_heads=32, head_dim=128, per_layer=2 * 32 * 128,
                             source="Touvron et al., 2023, Llama 2, Table 1; config.json of meta-llama/Llama-2-7b-hf"),
    "Llama 3 8B (GQA)": dict(layers=32, heads=32, kv_heads=8, head_dim=128, per_layer=2 * 8 * 128,
                             source="Meta, Llama 3 model card; config.json of meta-llama/Meta-Llama-3-8B"),
    "Mistral 7B (GQA)": dict(layers=32, heads=32, kv_heads=8, head_dim=128, per_layer=2 * 8 * 128,
                             source="Jiang et al., 2023, Mistral 7B, Table 1"),
    "DeepSeek-V2 (MLA)": dict(layers=60, heads=128, kv_heads=None, head_dim=128, per_layer=512 + 64,
                              source="DeepSeek-AI, 2024, DeepSeek-V2, sec. 2.1 and 3.1.1: latent d_c=512, "
                                     "decoupled RoPE key d_h^R=64, 60 layers"),
}


def real_model_rows(bytes_per_element: int = 2, context: int = 4096) -> list[list]:
    """Rows [model, layers, kv heads, cached elements per token per layer, KiB per token, GiB at `context`
    tokens, source] of REAL_MODELS at `bytes_per_element` (2: bf16)."""
    rows = []
    for name, m in REAL_MODELS.items():
        per_tok = m["layers"] * m["per_layer"] * bytes_per_element
        rows.append([name, m["layers"], m["kv_heads"] or "latent", m["per_layer"], per_tok / 1024,
                     per_tok * context / 2**30, m["source"]])
    return rows


def variant_configs(cfg: GPTConfig, rank: int) -> dict[str, dict]:
    """MHA, GQA (half the kv heads, when that divides), MQA and an MLA-style latent of `rank`, on the
    dimensions of `cfg`: cached elements per token per layer, and the n_kv_head each uses."""
    out = {"MHA": dict(n_kv_head=cfg.n_head, per_layer=2 * cfg.n_head * cfg.head_dim)}
    if cfg.n_head % 2 == 0 and cfg.n_head > 2:
        g = cfg.n_head // 2
        out[f"GQA ({g} kv heads)"] = dict(n_kv_head=g, per_layer=2 * g * cfg.head_dim)
    out["MQA"] = dict(n_kv_head=1, per_layer=2 * cfg.head_dim)
    out[f"MLA-style latent (r={rank})"] = dict(n_kv_head=cfg.n_head, per_layer=rank)
    return out


def budget_rows(cfg: GPTConfig, variants: dict, budget_bytes: float, weight_bytes_: float, el: int) -> list[list]:
    """Per variant: bytes per token, the longest context one sequence could hold in what the budget leaves
    after the weights, and how many sequences of the model's seq_len fit."""
    free = max(0.0, budget_bytes - weight_bytes_)
    rows = []
    for name, v in variants.items():
        per_tok = cfg.n_layer * v["per_layer"] * el
        rows.append([name, per_tok, int(free // per_tok), int(free // (per_tok * cfg.seq_len))])
    return rows


# ---------------------------------------------------------------- a static cache for compiled decode


class StaticKVCache(nn.Module):
    """A KVCacheLike for one-token decode with static shapes, as compiled decode needs (gpt-fast's design):
    buffers k, v (n_layer, B, n_kv_head, max_len, head_dim) and the position `pos` live on the device as
    module buffers; every step attends over all max_len slots with a mask of those filled, so no shape
    and no Python number changes between steps.

    Stores in `dtype` (any of helpers.gpt.generation.CACHE_DTYPES, whatever the model's), computes in
    compute_dtype(query, dtype), the wider of the two, and returns the query's dtype (with equal dtypes
    nothing is converted, so the compiled step is the same). Raises ValueError for another dtype, and for
    a batch or max_len that is not a positive int."""

    def __init__(self, config: GPTConfig, batch: int, max_len: int, *, dtype=torch.float32, device="cpu"):
        super().__init__()
        positive("batch", batch)
        positive("max_len", max_len)
        cache_dtype(dtype)
        shape = (config.n_layer, batch, config.n_kv_head, max_len, config.head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device))
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device))
        self.register_buffer("pos", torch.zeros((), dtype=torch.long, device=device))
        self.register_buffer("slots", torch.arange(max_len, device=device))
        self.group = config.n_head // config.n_kv_head

    def positions(self, T: int) -> torch.Tensor:
        """(B, T) absolute positions of T new tokens, from the device-side `pos`."""
        return (self.pos + self.slots[:T]).expand(self.k.size(1), T)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write k, v (B, n_kv_head, T, head_dim) at slots pos .. pos + T - 1 and return attention
        (B, n_head, T, head_dim) of q over every slot, masked to those filled up to each new token."""
        T = q.size(2)
        idx = self.pos + self.slots[:T]  # (T,)
        self.k[layer].index_copy_(2, idx, k.to(self.k.dtype))
        self.v[layer].index_copy_(2, idx, v.to(self.v.dtype))
        mask = self.slots[None, :] <= idx[:, None]  # (T, max_len): filled slots up to each new token
        dt = compute_dtype(q.dtype, self.k.dtype)
        out_dtype, q, keys, values = q.dtype, q.to(dt), self.k[layer].to(dt), self.v[layer].to(dt)
        if self.group > 1:
            keys, values = keys.repeat_interleave(self.group, 1), values.repeat_interleave(self.group, 1)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask).to(out_dtype)

    def advance(self, T: int) -> None:
        """Count T more tokens as cached (on the device: `pos` += T)."""
        self.pos += T


def static_step(model: GPT, token: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
    """GPT.forward for one token per sequence against a StaticKVCache, without the Python-side bounds check
    (a device-to-host sync that would break a compiled graph): logits (B, vocab)."""
    x = model.wte(token.reshape(-1, 1)) + model.wpe(cache.positions(1))
    for i, block in enumerate(model.blocks):
        x = block(x, cache, i)
    cache.advance(1)
    return model.lm_head(model.ln_f(x))[:, -1]


def decode_compile_options(mode: str = "reduce-overhead") -> dict:
    """Inductor options for the compiled decode step: `mode`'s own ("reduce-overhead" is Inductor's
    {"triton.cudagraphs": True}, "default" none) plus FUSED_MATVEC (coordinate_descent_tuning), under which
    a one-row matmul becomes a multiply-and-sum that Inductor writes itself, so an int8 or int4 weight is
    converted inside the kernel that reads it (gpt-fast sets the same option for every variant it times,
    bf16 included). torch.compile takes a mode or options, not both, hence the dict. Raises ValueError for
    another mode."""
    if mode not in ("default", "reduce-overhead"):
        raise ValueError(f"mode={mode!r}; choose 'default' or 'reduce-overhead'")
    return {**({"triton.cudagraphs": True} if mode == "reduce-overhead" else {}), **FUSED_MATVEC}


# ---------------------------------------------------------------- an MLA-style latent cache


class LowRankKV(nn.Module):
    """The k/v projection factorised: kv = up(down(x)), down (d_model -> r, no bias), up (r -> 2·H_kv·hd, with
    the original bias); `up.weight` has orthonormal columns, so down(x) = upᵀ (kv - bias)."""

    def __init__(self, down: torch.Tensor, up: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        # made in the factors' own dtype and device: a float32 layer would round fp64 factors on the copy below
        self.down = nn.Linear(down.size(1), down.size(0), bias=False, dtype=down.dtype, device=down.device)
        self.up = nn.Linear(up.size(1), up.size(0), bias=bias is not None, dtype=up.dtype, device=up.device)
        with torch.no_grad():
            self.down.weight.copy_(down)
            self.up.weight.copy_(up)
            if bias is not None:
                self.up.bias.copy_(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(x))


def factorise_kv(model: GPT, rank: int) -> tuple[GPT, list[float]]:
    """A copy of `model` whose every k/v projection W (2·H_kv·hd, d_model) is replaced by its best rank-r
    approximation U_r (Σ_r V_rᵀ) from the SVD (Eckart–Young, computed in float64), as a `LowRankKV` in W's
    dtype and on its device. Returns the copy and each layer's relative reconstruction error
    ‖W − W_r‖_F / ‖W‖_F of the factors as stored (in W's dtype). Raises ValueError for a rank outside
    1 .. min(W's shape)."""
    full = 2 * model.config.n_kv_head * model.config.head_dim
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= min(full, model.config.d_model):
        raise ValueError(f"rank={rank!r} must be an int in 1..{min(full, model.config.d_model)}")
    low = copy.deepcopy(model).eval()
    errors = []
    for block in low.blocks:
        lin = block.attn.kv_proj
        W = lin.weight.detach().double()
        U, s, Vh = torch.linalg.svd(W, full_matrices=False)
        dtype = lin.weight.dtype
        up, down = U[:, :rank].to(dtype), (s[:rank, None] * Vh[:rank]).to(dtype)  # the factors as they are stored
        errors.append(float(torch.linalg.norm(W - up.double() @ down.double()) / torch.linalg.norm(W)))
        block.attn.kv_proj = LowRankKV(down, up, None if lin.bias is None else lin.bias.detach())
        block.attn.kv_proj.to(device=lin.weight.device, dtype=dtype)
    return low, errors


class LatentKVCache:
    """MLA-style cache for a `factorise_kv` model: per layer and token only the rank-r latent c is stored.

    c: (n_layer, B, max_len, r). In `attend`, c is recovered from the model's k, v as upᵀ(kv − bias) (equal to
    down(x), up's columns being orthonormal), and the up-projection is absorbed (DeepSeek-V2, sec. 2.1.2):
    scores = (q U_k)·c + q·b_k, output = (softmax · c) U_vᵀ + b_v, so keys and values are never materialised
    for the cached tokens.

    Stores c in `dtype` (any of helpers.gpt.generation.CACHE_DTYPES, whatever the model's), computes in
    compute_dtype(query, dtype), the wider of the two (q, c and the up-projection converted to it), and
    returns the query's dtype. Raises ValueError for another dtype, a batch or max_len that is not a
    positive int, a model not from factorise_kv, and when asked to hold more than max_len tokens.
    """

    def __init__(self, model: GPT, batch: int, max_len: int, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu"):
        cfg = model.config
        positive("batch", batch)
        positive("max_len", max_len)
        cache_dtype(dtype)
        projs = [b.attn.kv_proj for b in model.blocks]
        if not all(isinstance(p, LowRankKV) for p in projs):
            raise ValueError("LatentKVCache needs a model from factorise_kv (its kv projections are LowRankKV)")
        self.rank = projs[0].up.weight.size(1)
        self.c = torch.zeros(cfg.n_layer, batch, max_len, self.rank, dtype=dtype, device=device)
        self.projs, self.cfg, self.max_len, self.length = projs, cfg, max_len, 0

    @property
    def nbytes(self) -> int:
        """Bytes allocated for the latents (numel · element_size)."""
        return self.c.numel() * self.c.element_size()

    def positions(self, T: int) -> torch.Tensor:
        """(B, T) absolute positions of T new tokens."""
        return (self.length + torch.arange(T, device=self.c.device)).expand(self.c.size(1), T)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store the new tokens' latents and return attention (B, H, T, hd) computed on the latents."""
        cfg, up = self.cfg, self.projs[layer].up
        B, H, T, hd = q.shape
        H_kv, g = cfg.n_kv_head, cfg.n_head // cfg.n_kv_head
        kv = torch.stack([k, v]).permute(1, 3, 0, 2, 4).reshape(B, T, 2 * H_kv * hd)  # the model's layout
        if up.bias is not None:
            kv = kv - up.bias.to(kv.dtype)
        end = self.length + T
        if end > self.max_len:
            raise ValueError(f"the cache holds max_len={self.max_len} tokens; {end} were asked for")
        self.c[layer, :, self.length:end] = (kv @ up.weight.to(kv.dtype)).to(self.c.dtype)  # (B, T, r)
        dt = compute_dtype(q.dtype, self.c.dtype)
        out_dtype, q, c = q.dtype, q.to(dt), self.c[layer, :, :end].to(dt)  # c: (B, S, r)
        Wk, Wv = up.weight.to(dt).view(2, H_kv, hd, self.rank)  # (H_kv, hd, r) each
        bk, bv = (up.bias.to(dt).view(2, H_kv, hd) if up.bias is not None
                  else torch.zeros(2, H_kv, hd, dtype=dt, device=q.device))
        Wk, Wv = Wk.repeat_interleave(g, 0), Wv.repeat_interleave(g, 0)  # (H, hd, r)
        bk, bv = bk.repeat_interleave(g, 0), bv.repeat_interleave(g, 0)  # (H, hd)
        q_lat = torch.einsum("bhtd,hdr->bhtr", q, Wk)  # the query, absorbed into latent space
        scores = (q_lat @ c.transpose(1, 2)[:, None] + (q * bk[:, None]).sum(-1, keepdim=True)) / math.sqrt(hd)
        scores = scores.masked_fill(~causal_offset_mask(T, end, q.device), float("-inf"))
        o_lat = scores.softmax(-1) @ c[:, None]  # (B, H, T, r)
        return (torch.einsum("bhtr,hdr->bhtd", o_lat, Wv) + bv[:, None]).to(out_dtype)

    def advance(self, T: int) -> None:
        """Count T more tokens as cached."""
        self.length += T
