"""A quantized KV cache for the course GPT: keys and values stored as int8 or fp8 (e4m3) codes with one float32
scale per token per kv head, dequantized when attention reads them.

* `quantize_kv` / `dequantize_kv`: symmetric absmax quantization of each token's head vector (head_dim numbers):
  the scale maps the vector's largest magnitude to the format's largest code (127 for int8, 448 for e4m3), so
  nothing clips; int8 rounds to the nearest integer, fp8 to the nearest e4m3 value (3 mantissa bits).
* `QuantKVCache`: a `helpers.gpt.model.KVCacheLike` like `generation.KVCache`, but storing codes and scales;
  `attend` quantizes the new tokens, dequantizes every cached one to the query's dtype and attends as
  `generation.cached_attention` does. Stores in int8 or float8_e4m3fn (+ float32 scales), computes in the
  query's dtype. A real kernel dequantizes inside the attention kernel; here the dequantized copy is made per
  call, so this cache saves memory, not time.
* `quant_bytes_per_token`: 2 · layers · kv heads · (head_dim code bytes + one scale), the formula beside
  `kv_cache.kv_bytes_per_token`; `quant_budget_rows` the memory-budget rows for `kv_cache.budget_rows`' table.
* `quant_rows`: the formats side by side on a trained model: bytes per token, greedy-token agreement with the
  fp32 cache, and validation loss through the cache (`cached_loss`, on validation_loss's own windows).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers.gpt import data
from helpers.gpt.generation import KVCache, cached_attention, generate
from helpers.gpt.model import GPT, GPTConfig
from helpers.gpt.pretrained import VAL_BATCH
from helpers.measure.params import positive

QMAX = {"int8": 127.0, "fp8": 448.0}  # the largest code: int8's symmetric range, e4m3's largest finite value
STORE = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
SCALE_BYTES = 4  # one float32 scale per token per kv head, for keys and for values


def quantize_kv(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., head_dim) -> (codes in STORE[fmt], scale (..., 1) float32): one scale per token per kv head."""
    # each token's head vector: its largest magnitude maps to the largest code, so no value clips
    scale = x.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / QMAX[fmt]
    y = x.float() / scale
    if fmt == "int8":
        return y.round().clamp(-127, 127).to(torch.int8), scale  # the nearest integer (ties to even)
    return y.to(torch.float8_e4m3fn), scale  # the nearest e4m3 value: 3 mantissa bits, relative error <= 2^-4


def dequantize_kv(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """codes · scale, in `dtype`: the values attention reads."""
    return (codes.float() * scale).to(dtype)


class QuantKVCache:
    """A contiguous, preallocated KV cache holding int8 or fp8 codes and a float32 scale per token per kv head.

    k, v: (n_layer, B, n_kv_head, max_len, head_dim) codes; k_scale, v_scale: (n_layer, B, n_kv_head, max_len, 1).
    Raises ValueError for a format other than "int8" or "fp8", and when asked to hold more than max_len tokens.
    """

    def __init__(self, config: GPTConfig, batch: int, max_len: int, *, fmt: str = "int8",
                 device: str | torch.device = "cpu"):
        positive("batch", batch)
        positive("max_len", max_len)
        if fmt not in QMAX:
            raise ValueError(f"fmt={fmt!r}: choose one of {', '.join(QMAX)}")
        shape = (config.n_layer, batch, config.n_kv_head, max_len, config.head_dim)
        # the codes: one byte an element, half of bf16's two and a quarter of fp32's four
        self.k = torch.zeros(shape, dtype=STORE[fmt], device=device)
        self.v = torch.zeros(shape, dtype=STORE[fmt], device=device)
        # the scales: one float32 per token, kv head and layer, for keys and for values
        self.k_scale = torch.ones(shape[:-1] + (1,), device=device)
        self.v_scale = torch.ones(shape[:-1] + (1,), device=device)
        self.fmt, self.n_head, self.max_len, self.length = fmt, config.n_head, max_len, 0

    @property
    def nbytes(self) -> int:
        """Bytes allocated: the codes and the scales of keys and values."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.k_scale, self.v_scale))

    def positions(self, T: int) -> torch.Tensor:
        """(B, T) absolute positions of T new tokens."""
        return (self.length + torch.arange(T, device=self.k.device)).expand(self.k.size(1), T)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store k, v quantized and return causal attention (B, n_head, T, head_dim) of q over all cached keys."""
        end = self.length + k.size(2)
        if end > self.max_len:
            raise ValueError(f"the cache holds max_len={self.max_len} tokens; {end} were asked for")
        new = slice(self.length, end)
        # write: the T new tokens' codes and scales, after the `length` cached ones
        self.k[layer, :, :, new], self.k_scale[layer, :, :, new] = quantize_kv(k, self.fmt)
        self.v[layer, :, :, new], self.v_scale[layer, :, :, new] = quantize_kv(v, self.fmt)
        # read: every cached token dequantized to the query's dtype, the new ones too (they were rounded as well)
        keys = dequantize_kv(self.k[layer, :, :, :end], self.k_scale[layer, :, :, :end], q.dtype)
        values = dequantize_kv(self.v[layer, :, :, :end], self.v_scale[layer, :, :, :end], q.dtype)
        return cached_attention(q, keys, values)

    def advance(self, T: int) -> None:
        """Count T more tokens as cached (the model calls this once after its last layer)."""
        self.length += T


def quant_bytes_per_token(n_layer: int, n_kv_head: int, head_dim: int, code_bytes: int = 1) -> int:
    """KV bytes a token occupies in a quantized cache: 2 (k and v) · layers · kv heads · (head_dim codes + one scale)."""
    return 2 * n_layer * n_kv_head * (head_dim * code_bytes + SCALE_BYTES)


def quant_budget_rows(cfg: GPTConfig, variants: dict, budget_bytes: float, weight_bytes_: float) -> list[list]:
    """`kv_cache.budget_rows`' columns for int8 and fp8 caches of each variant named in `variants` ({name:
    n_kv_head}): [name, bytes per token, the longest context in the budget, sequences of cfg.seq_len]."""
    free = max(0.0, budget_bytes - weight_bytes_)
    rows = []
    for name, kv_heads in variants.items():
        per_tok = quant_bytes_per_token(cfg.n_layer, kv_heads, cfg.head_dim)
        rows.append([f"{name}, int8 or fp8 + scales", per_tok, int(free // per_tok), int(free // (per_tok * cfg.seq_len))])
    return rows


def make_cache(fmt: str):
    """A `generate(make_cache=...)` builder for format `fmt`: "fp32" or "bf16" (`KVCache`), "int8" or "fp8"."""
    if fmt in QMAX:
        return lambda config, batch, max_len, dtype=None, device="cpu": QuantKVCache(config, batch, max_len, fmt=fmt,
                                                                                     device=device)
    store = {"fp32": torch.float32, "bf16": torch.bfloat16}[fmt]
    return lambda config, batch, max_len, dtype=None, device="cpu": KVCache(config, batch, max_len, dtype=store,
                                                                            device=device)


@torch.no_grad()
def cached_loss(model: GPT, tokens: torch.Tensor, fmt: str, batches: int, seed: int = 1234) -> float:
    """Mean cross-entropy (nats per byte) of `model` on `validation_loss`'s windows of `tokens` (the same seeded
    draw), each window run as one prefill through a fresh cache of format `fmt`: every layer attends over the
    keys and values as that cache stores them."""
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(batches):
        x, y = data.get_batch(tokens, VAL_BATCH, model.config.seq_len, device, generator=g)
        cache = make_cache(fmt)(model.config, x.size(0), x.size(1), device=device)
        total += float(F.cross_entropy(model(x, cache=cache)[0].flatten(0, 1), y.flatten()))
    return total / batches


def quant_rows(model: GPT, prompts: list[torch.Tensor], n: int, tokens: torch.Tensor, batches: int,
               formats=("fp32", "bf16", "int8", "fp8")) -> list[dict]:
    """Per format: bytes per token of `model`'s cache, greedy tokens (n after each of `prompts`) identical to the
    fp32 cache's, "divergences": per prompt the first new token's index (0-based) where its greedy tokens differ
    from the fp32 cache's (None: none differs), "first divergence": the earliest of them over the prompts (None:
    no prompt's differ), and `cached_loss`. Past a prompt's first difference every greedy token is predicted
    after a different prefix, so the identical count falls from there whatever the cache's error."""
    cfg = model.config
    ref = [generate(model, p, n, make_cache=make_cache("fp32")) for p in prompts]
    rows = []
    for fmt in formats:
        per_tok = (quant_bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim) if fmt in QMAX else
                   2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim * (4 if fmt == "fp32" else 2))
        got = ref if fmt == "fp32" else [generate(model, p, n, make_cache=make_cache(fmt)) for p in prompts]
        same = [(a == b)[0] for a, b in zip(got, ref)]
        each = [None if bool(s.all()) else int((~s).nonzero()[0]) for s in same]
        first = [d for d in each if d is not None]
        rows.append({"format": fmt, "bytes per token": per_tok, "identical": int(sum(int(s.sum()) for s in same)),
                     "of": n * len(prompts), "divergences": each, "first divergence": min(first) if first else None,
                     "val loss": cached_loss(model, tokens, fmt, batches)})
    return rows
