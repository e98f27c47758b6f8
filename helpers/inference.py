"""Generation for the course GPT: prefill, one decode step, sampling, and key/value caches (MHA/GQA/MQA, MLA-style).

The pieces, each small and pure:

* `KVCache`: preallocated contiguous buffers k, v of shape (n_layer, B, n_kv_head, max_len, head_dim),
  filled by one method, `update`; it implements `helpers.model.KVCacheLike`, so `GPT.forward(idx,
  cache=cache)` runs any number of new tokens against everything cached.
* `prefill(model, tokens, cache)` runs the prompt once and returns the last position's logits;
  `decode_one(model, token, cache)` runs one new token per sequence; `generate(model, prompt, n,
  sampler, cache=True)` loops them, or (cache=False) reruns the whole sequence at every step, the
  quadratic baseline. Greedy tokens are identical either way (tests/test_inference.py).
* `Sampler`: greedy (temperature 0), temperature, top-k and top-p (nucleus; Holtzman et al., 2020)
  with its own seeded torch.Generator, so a seed reproduces the text.
* `kv_bytes_per_token` (2 · layers · kv_heads · head_dim · bytes) and `REAL_MODELS`, published
  configurations with their sources.
* `LatentKVCache` and `factorise_kv`: an MLA-style cache (DeepSeek-AI, 2024, DeepSeek-V2) on the course
  GPT: the k/v projection is factorised by a truncated SVD, W ≈ U (Σ Vᵀ), only the rank-r latent
  c = Σ Vᵀ x is cached, and the up-projection U is absorbed into the query and the output at decode.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from .model import GPT, GPTConfig

# ---------------------------------------------------------------- the contiguous KV cache


def _causal_offset_mask(T: int, S: int, device) -> torch.Tensor:
    """(T, S) bool: new token t (at cache position S - T + t) sees keys 0 .. S - T + t."""
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)


class KVCache:
    """A contiguous, preallocated key/value cache for B sequences that advance together.

    k, v: (n_layer, B, n_kv_head, max_len, head_dim) in `dtype`, allocated once; `length` tokens of
    each sequence are filled. `update(layer, k, v)` is the only write; `attend` is what the model calls.
    Raises ValueError when asked to hold more than max_len tokens.
    """

    def __init__(self, config: GPTConfig, batch: int, max_len: int, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu"):
        for name, value in (("batch", batch), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive int")
        shape = (config.n_layer, batch, config.n_kv_head, max_len, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.n_head, self.max_len, self.length = config.n_head, max_len, 0

    @property
    def nbytes(self) -> int:
        """Bytes allocated for keys and values (numel · element_size of both buffers)."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def positions(self, T: int) -> torch.Tensor:
        """(B, T) absolute positions of T new tokens."""
        B = self.k.size(1)
        return (self.length + torch.arange(T, device=self.k.device)).expand(B, T)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, n_kv_head, T, head_dim) after the `length` cached tokens of `layer`;
        return views of everything cached, (B, n_kv_head, length + T, head_dim) each."""
        end = self.length + k.size(2)
        if end > self.max_len:
            raise ValueError(f"the cache holds max_len={self.max_len} tokens; {end} were asked for")
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store k, v and return causal attention (B, n_head, T, head_dim) of q over all cached keys."""
        keys, values = self.update(layer, k, v)
        return cached_attention(q, keys, values)

    def advance(self, T: int) -> None:
        """Count T more tokens as cached (the model calls this once after its last layer)."""
        self.length += T


def cached_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Attention of T new queries q (B, H, T, hd) over S cached keys/values (B, H_kv, S, hd), the last T of
    which are the new tokens' own: query t sees keys 0 .. S - T + t. Returns (B, H, T, hd)."""
    H, H_kv, T, S = q.size(1), keys.size(1), q.size(2), keys.size(2)
    if H_kv != H:  # each kv head serves H // H_kv consecutive query heads, as in the model
        keys = keys.repeat_interleave(H // H_kv, dim=1)
        values = values.repeat_interleave(H // H_kv, dim=1)
    mask = None if T == 1 else _causal_offset_mask(T, S, q.device)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


# ---------------------------------------------------------------- generation


@torch.no_grad()
def prefill(model: GPT, tokens: torch.Tensor, cache) -> torch.Tensor:
    """Run the prompt tokens (B, T) through the model, filling `cache`; logits of the last position (B, vocab)."""
    return model(tokens, cache=cache)[0][:, -1]


@torch.no_grad()
def decode_one(model: GPT, token: torch.Tensor, cache) -> torch.Tensor:
    """Run one new token per sequence, token (B,) or (B, 1), against the cache; logits (B, vocab)."""
    return model(token.reshape(-1, 1), cache=cache)[0][:, -1]


@dataclass
class Sampler:
    """Picks the next token from logits (B, vocab): greedy when temperature is 0, else a sample from
    softmax(logits / temperature) restricted to the top_k most likely tokens and to the smallest set whose
    probability reaches top_p. Draws come from its own generator, seeded by `seed`."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    generator: torch.Generator = field(init=False, repr=False)

    def __post_init__(self):
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature={self.temperature!r} must be a finite number >= 0")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)
                                       or self.top_k <= 0):
            raise ValueError(f"top_k={self.top_k!r} must be a positive int or None")
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p={self.top_p!r} must be in (0, 1] or None")
        self.generator = torch.Generator().manual_seed(self.seed)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """Next token ids (B,) for logits (B, vocab)."""
        if self.temperature == 0:
            return logits.argmax(dim=-1)
        logits = logits.float() / self.temperature
        if self.top_k is not None:
            kth = torch.topk(logits, min(self.top_k, logits.size(-1))).values[:, -1:]  # (B, 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p is not None:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            probs = sorted_logits.softmax(-1)
            drop = probs.cumsum(-1) - probs >= self.top_p  # mass before this token already reaches top_p
            logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
        probs = logits.softmax(-1).cpu()
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(1).to(logits.device)


@torch.no_grad()
def generate(model: GPT, prompt: torch.Tensor, n: int, sampler: Sampler | None = None, *, cache: bool = True,
             dtype: torch.dtype | None = None, make_cache=None) -> torch.Tensor:
    """n new tokens (B, n) after prompt (B, T) or (T,); greedy when sampler is None.

    cache=True: one prefill, then one `decode_one` per token against a `KVCache` of length T + n
    (dtype: the model's; make_cache(config, batch, max_len, dtype=, device=) builds another KVCacheLike
    in its place). cache=False: the whole sequence is rerun at every step (no cache).
    Raises ValueError when T + n passes the model's seq_len.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"n={n!r} must be a positive int")
    prompt = prompt.reshape(1, -1) if prompt.dim() == 1 else prompt
    B, T = prompt.shape
    if T + n > model.config.seq_len:
        raise ValueError(f"prompt {T} + n {n} tokens pass the model's seq_len={model.config.seq_len}")
    sampler = sampler or Sampler()
    model.eval()
    out = []
    if cache:
        p = next(model.parameters())
        kv = (make_cache or KVCache)(model.config, B, T + n, dtype=dtype or p.dtype, device=p.device)
        logits = prefill(model, prompt, kv)
        for i in range(n):
            out.append(sampler(logits))
            if i < n - 1:
                logits = decode_one(model, out[-1], kv)
    else:
        seq = prompt
        for _ in range(n):
            out.append(sampler(model(seq)[0][:, -1]))
            seq = torch.cat([seq, out[-1][:, None]], dim=1)
    return torch.stack(out, dim=1)


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


# ---------------------------------------------------------------- an MLA-style latent cache


class LowRankKV(nn.Module):
    """The k/v projection factorised: kv = up(down(x)), down (d_model -> r, no bias), up (r -> 2·H_kv·hd, with
    the original bias); `up.weight` has orthonormal columns, so down(x) = upᵀ (kv - bias)."""

    def __init__(self, down: torch.Tensor, up: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.down = nn.Linear(down.size(1), down.size(0), bias=False)
        self.up = nn.Linear(up.size(1), up.size(0), bias=bias is not None)
        with torch.no_grad():
            self.down.weight.copy_(down)
            self.up.weight.copy_(up)
            if bias is not None:
                self.up.bias.copy_(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(x))


def factorise_kv(model: GPT, rank: int) -> tuple[GPT, list[float]]:
    """A copy of `model` whose every k/v projection W (2·H_kv·hd, d_model) is replaced by its best rank-r
    approximation U_r (Σ_r V_rᵀ) from the SVD (Eckart–Young), as a `LowRankKV`. Returns the copy and each
    layer's relative reconstruction error ‖W − W_r‖_F / ‖W‖_F. Raises ValueError for a rank outside
    1 .. min(W's shape)."""
    import copy

    full = 2 * model.config.n_kv_head * model.config.head_dim
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= min(full, model.config.d_model):
        raise ValueError(f"rank={rank!r} must be an int in 1..{min(full, model.config.d_model)}")
    low = copy.deepcopy(model).eval()
    errors = []
    for block in low.blocks:
        lin = block.attn.kv_proj
        W = lin.weight.detach().double()
        U, s, Vh = torch.linalg.svd(W, full_matrices=False)
        up, down = U[:, :rank], s[:rank, None] * Vh[:rank]
        errors.append(float(torch.linalg.norm(W - up @ down) / torch.linalg.norm(W)))
        dtype = lin.weight.dtype
        block.attn.kv_proj = LowRankKV(down.to(dtype), up.to(dtype), None if lin.bias is None else lin.bias.detach())
        block.attn.kv_proj.to(lin.weight.device)
    return low, errors


class LatentKVCache:
    """MLA-style cache for a `factorise_kv` model: per layer and token only the rank-r latent c is stored.

    c: (n_layer, B, max_len, r). In `attend`, c is recovered from the model's k, v as upᵀ(kv − bias) (equal to
    down(x), up's columns being orthonormal), and the up-projection is absorbed (DeepSeek-V2, sec. 2.1.2):
    scores = (q U_k)·c + q·b_k, output = (softmax · c) U_vᵀ + b_v, so keys and values are never materialised
    for the cached tokens.
    """

    def __init__(self, model: GPT, batch: int, max_len: int, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu"):
        cfg = model.config
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
            kv = kv - up.bias
        end = self.length + T
        if end > self.max_len:
            raise ValueError(f"the cache holds max_len={self.max_len} tokens; {end} were asked for")
        self.c[layer, :, self.length:end] = (kv @ up.weight).to(self.c.dtype)  # (B, T, r)
        c = self.c[layer, :, :end].to(q.dtype)  # (B, S, r)
        Wk, Wv = up.weight.view(2, H_kv, hd, self.rank)  # (H_kv, hd, r) each
        bk, bv = (up.bias.view(2, H_kv, hd) if up.bias is not None else torch.zeros(2, H_kv, hd, device=q.device))
        Wk, Wv = Wk.repeat_interleave(g, 0), Wv.repeat_interleave(g, 0)  # (H, hd, r)
        bk, bv = bk.repeat_interleave(g, 0), bv.repeat_interleave(g, 0)  # (H, hd)
        q_lat = torch.einsum("bhtd,hdr->bhtr", q, Wk)  # the query, absorbed into latent space
        scores = (q_lat @ c.transpose(1, 2)[:, None] + (q * bk[:, None]).sum(-1, keepdim=True)) / math.sqrt(hd)
        scores = scores.masked_fill(~_causal_offset_mask(T, end, q.device), float("-inf"))
        o_lat = scores.softmax(-1) @ c[:, None]  # (B, H, T, r)
        return torch.einsum("bhtr,hdr->bhtd", o_lat, Wv) + bv[:, None]

    def advance(self, T: int) -> None:
        """Count T more tokens as cached."""
        self.length += T
