"""How the course GPT generates text: the contiguous key/value cache, prefill, one decode step, sampling.

* `KVCache`: preallocated contiguous buffers k, v of shape (n_layer, B, n_kv_head, max_len, head_dim),
  filled by one method, `update`; it implements `helpers.gpt.model.KVCacheLike`, so `GPT.forward(idx,
  cache=cache)` runs any number of new tokens against everything cached (MHA, GQA and MQA alike).
* `prefill(model, tokens, cache)` runs the prompt once and returns the last position's logits;
  `decode_one(model, token, cache)` runs one new token per sequence; `rewound_step(model, cache, tokens)`
  runs new tokens always at the same position (for timing); `generate(model, prompt, n, sampler,
  cache=True)` loops prefill and decode, or (cache=False) reruns the whole sequence at every step, the
  quadratic baseline. Greedy tokens are identical either way (tests/test_gpt_generation.py).
* `Sampler`: greedy (temperature 0), temperature, top-k and top-p (nucleus; Holtzman et al., 2020)
  with its own seeded torch.Generator, so a seed reproduces the text.

Notebook 10 teaches the cache; notebook 08 times decode steps of quantised models with it; the static,
paged and latent caches are in `helpers.decode`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from helpers.gpt.model import GPT, GPTConfig
from helpers.measure.params import positive

# ---------------------------------------------------------------- the contiguous KV cache


def causal_offset_mask(T: int, S: int, device) -> torch.Tensor:
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
        positive("batch", batch)
        positive("max_len", max_len)
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
    mask = None if T == 1 else causal_offset_mask(T, S, q.device)
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
        if self.top_k is not None:
            positive("top_k", self.top_k)
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
    positive("n", n)
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


def rewound_step(model: GPT, cache, tokens: torch.Tensor):
    """A closure running `tokens` against `cache` at the cache's current length, rewound to that length
    before every call, so that every call measures the same position.

    tokens: (B,) or (B, 1) for one decode step, (B, T) for T new tokens per sequence (e.g. a speculative
    verification pass). Each call returns the logits of the last new position, (B, vocab), without
    gradients. `cache` is any KVCacheLike with a settable `length` (KVCache, LatentKVCache).
    """
    start = cache.length
    tokens = tokens.reshape(-1, 1) if tokens.dim() == 1 else tokens

    @torch.no_grad()
    def step():
        cache.length = start
        return model(tokens, cache=cache)[0][:, -1]
    return step
