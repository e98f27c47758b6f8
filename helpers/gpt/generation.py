"""How the course GPT generates text: the contiguous key/value cache, prefill, one decode step, sampling.

* `KVCache`: preallocated contiguous buffers k, v of shape (n_layer, B, n_kv_head, max_len, head_dim),
  filled by one method, `update`; it implements `helpers.gpt.model.KVCacheLike`, so `GPT.forward(idx,
  cache=cache)` runs any number of new tokens against everything cached (MHA, GQA and MQA alike).
* The dtype rule every cache of the course follows (this one, and `helpers.decode`'s static, latent and
  paged caches): keys and values are stored in the cache's dtype, one of `CACHE_DTYPES` (`cache_dtype`
  refuses any other); attention computes in `compute_dtype(query, cache)`, the wider of the two
  (`torch.promote_types`: an fp32 model on a bf16 cache computes in fp32, bf16 with fp16 in fp32), the
  paged cache in float32 at least; and `attend` returns the query's dtype, the model's.
* `prefill(model, tokens, cache)` runs the prompt once and returns the last position's logits;
  `decode_one(model, token, cache)` runs one new token per sequence; `rewound_step(model, cache, tokens)`
  runs new tokens always at the same position (for timing); `generate(model, prompt, n, sampler,
  cache=True)` loops prefill and decode, or (cache=False) reruns the whole sequence at every step, the
  quadratic baseline. Greedy tokens are identical either way (tests/gpt/test_gpt_generation.py).
* `Sampler`: greedy (temperature 0), temperature, top-k and top-p (nucleus; Holtzman et al., 2020)
  with its own seeded torch.Generator, so a seed reproduces the text; `probabilities` is the
  distribution it draws from. A value that means "no cut" (top_k >= vocab, top_p = 1, None) changes
  nothing, and top_k=1 is greedy.

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

# the dtypes a KV cache may store keys and values in (SDPA and every cache's attention accept them)
CACHE_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def cache_dtype(dtype) -> torch.dtype:
    """Return `dtype` if a KV cache may store in it (one of CACHE_DTYPES), else raise a ValueError saying so."""
    if not isinstance(dtype, torch.dtype) or dtype not in CACHE_DTYPES:
        raise ValueError(f"dtype={dtype!r} cannot hold a KV cache; choose one of "
                         f"{', '.join(map(str, CACHE_DTYPES))}")
    return dtype


def compute_dtype(query: torch.dtype, cache: torch.dtype) -> torch.dtype:
    """The dtype cached attention computes in: the wider of the query's and the cache's
    (torch.promote_types; equal dtypes give that dtype, bf16 with fp16 gives fp32), so that neither the
    model's query nor a stored key loses precision."""
    return torch.promote_types(query, cache)



def causal_offset_mask(T: int, S: int, device) -> torch.Tensor:
    """(T, S) bool: new token t (at cache position S - T + t) sees keys 0 .. S - T + t."""
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)


class KVCache:
    """A contiguous, preallocated key/value cache for B sequences that advance together.

    k, v: (n_layer, B, n_kv_head, max_len, head_dim) in `dtype`, allocated once; `length` tokens of
    each sequence are filled. `update(layer, k, v)` is the only write; `attend` is what the model calls.

    Stores in `dtype` (any of CACHE_DTYPES, whatever the model's), computes in compute_dtype(query, dtype)
    (`cached_attention`) and returns the query's dtype. Raises ValueError for another dtype, and when asked
    to hold more than max_len tokens.
    """

    def __init__(self, config: GPTConfig, batch: int, max_len: int, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu"):
        positive("batch", batch)
        positive("max_len", max_len)
        cache_dtype(dtype)
        # one slot per layer, sequence, kv head and position: GQA and MQA keep fewer kv heads than query
        # heads, so their cache is n_head / n_kv_head times smaller
        shape = (config.n_layer, batch, config.n_kv_head, max_len, config.head_dim)
        # allocated once, for the longest sequence: no step ever reallocates or copies what is cached
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        # length: the positions 0 .. length-1 filled in every layer (the model counts them up with `advance`)
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
        """Write k, v (B, n_kv_head, T, head_dim) after the `length` cached tokens of `layer`, converted to
        the cache's dtype; return views of everything cached, (B, n_kv_head, length + T, head_dim) each."""
        end = self.length + k.size(2)
        if end > self.max_len:
            raise ValueError(f"the cache holds max_len={self.max_len} tokens; {end} were asked for")
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store k, v and return causal attention (B, n_head, T, head_dim) of q over all cached keys."""
        keys, values = self.update(layer, k, v)  # write the T new tokens; read back all length + T of them
        return cached_attention(q, keys, values)

    def advance(self, T: int) -> None:
        """Count T more tokens as cached (the model calls this once after its last layer)."""
        self.length += T


def cached_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Attention of T new queries q (B, H, T, hd) over S cached keys/values (B, H_kv, S, hd), the last T of
    which are the new tokens' own: query t sees keys 0 .. S - T + t. Returns (B, H, T, hd) in q's dtype.

    Computes in compute_dtype(q.dtype, keys.dtype): q or the cached keys/values are converted to the wider
    of the two (nothing is converted when they agree)."""
    H, H_kv, T, S = q.size(1), keys.size(1), q.size(2), keys.size(2)
    # read: every cached key and value, in the wider dtype (a bf16 cache under an fp32 model computes in fp32)
    dt = compute_dtype(q.dtype, keys.dtype)
    out_dtype, q, keys, values = q.dtype, q.to(dt), keys.to(dt), values.to(dt)
    if H_kv != H:  # each kv head serves H // H_kv consecutive query heads, as in the model
        keys = keys.repeat_interleave(H // H_kv, dim=1)
        values = values.repeat_interleave(H // H_kv, dim=1)
    # one new token (decode) may see every key, so no mask; T new tokens (prefill, or a chunk) see the cache
    # and their own causal triangle: query t stops at key S - T + t
    mask = None if T == 1 else causal_offset_mask(T, S, q.device)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask).to(out_dtype)


# ---------------------------------------------------------------- generation


@torch.no_grad()
def prefill(model: GPT, tokens: torch.Tensor, cache) -> torch.Tensor:
    """Run the prompt tokens (B, T) through the model, filling `cache`; logits of the last position (B, vocab)."""
    # every layer writes all T keys and values and attends causally over them; only the last position's
    # logits predict the first new token
    return model(tokens, cache=cache)[0][:, -1]


@torch.no_grad()
def decode_one(model: GPT, token: torch.Tensor, cache) -> torch.Tensor:
    """Run one new token per sequence, token (B,) or (B, 1), against the cache; logits (B, vocab)."""
    # the same forward with T = 1: each layer computes one query, key and value and reads the rest from the cache
    return model(token.reshape(-1, 1), cache=cache)[0][:, -1]


@dataclass
class Sampler:
    """Picks the next token from logits (B, vocab): greedy when temperature is 0, else a draw from
    `probabilities(logits)`, softmax(logits / temperature) restricted to the top_k most likely tokens and
    then to the smallest set of those whose probability reaches top_p. Draws come from its own generator,
    seeded by `seed`.

    Boundaries, exactly: top_k=None or top_k >= vocab, and top_p=None or top_p=1, cut nothing (the same
    distribution, bit for bit, so the same draws for a seed); top_k=1, and a top_p at or below the top
    token's probability, keep one token, the greedy one. Ties: tokens are ranked by logit, equal logits by
    token id (the lower first, the one argmax picks), so top_k keeps exactly k tokens and top_p a prefix of
    that ranking; temperature 0 picks the lowest id among tied maxima. A temperature so small that
    logits / temperature overflows is taken as its limit: the distribution is shared by the top logits.
    Raises ValueError for a temperature that is negative or not finite, a top_k that is not a positive
    int, a top_p outside (0, 1].
    """

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
        if self.top_p is not None and (isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float))
                                       or not 0 < self.top_p <= 1):
            raise ValueError(f"top_p={self.top_p!r} must be a number in (0, 1] or None")
        self.generator = torch.Generator().manual_seed(self.seed)

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution (B, vocab) float32 the next token is drawn from, for logits (B, vocab): one-hot
        on the argmax at temperature 0, else softmax of logits / temperature after the top_k and top_p cuts
        (a cut token has probability 0)."""
        if self.temperature == 0:
            return F.one_hot(logits.argmax(dim=-1), logits.size(-1)).float()
        logits = logits.float()
        scaled = logits / self.temperature
        if bool((~torch.isfinite(scaled) & torch.isfinite(logits)).any()):
            # logits / temperature overflowed: shift by the row's max first (softmax does not change), in
            # float64, so the top logit stays 0 and the others fall to -inf at worst
            scaled = ((logits - logits.amax(-1, keepdim=True)).double() / self.temperature).float()
        V = scaled.size(-1)
        cut_k = self.top_k is not None and self.top_k < V
        cut_p = self.top_p is not None and self.top_p < 1
        if not (cut_k or cut_p):
            return scaled.softmax(-1)
        sorted_logits, order = scaled.sort(dim=-1, descending=True, stable=True)  # equal logits: lower id first
        drop = torch.zeros_like(sorted_logits, dtype=torch.bool)  # (B, V), in ranked order
        if cut_k:
            drop[:, self.top_k:] = True
        if cut_p:  # on the distribution left by top_k, its probabilities summed in float64
            kept = scaled.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
            ranked = kept.softmax(-1).gather(-1, order).double()  # (B, V), in ranked order
            before = torch.cat([ranked.new_zeros(ranked.size(0), 1), ranked.cumsum(-1)[:, :-1]], -1)
            drop |= before >= self.top_p  # the mass ranked above this token already reaches top_p
        return scaled.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf"))).softmax(-1)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """Next token ids (B,) for logits (B, vocab)."""
        if self.temperature == 0:
            return logits.argmax(dim=-1)
        probs = self.probabilities(logits).cpu()
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(1).to(logits.device)


@torch.no_grad()
def generate(model: GPT, prompt: torch.Tensor, n: int, sampler: Sampler | None = None, *, cache: bool = True,
             dtype: torch.dtype | None = None, make_cache=None) -> torch.Tensor:
    """n new tokens (B, n) after prompt (B, T) or (T,); greedy when sampler is None.

    cache=True: one prefill, then one `decode_one` per token against a `KVCache` of length T + n
    (make_cache(config, batch, max_len, dtype=, device=) builds another KVCacheLike in its place). dtype:
    the cache's, any of CACHE_DTYPES whatever the model's (None: the model's); attention then computes as
    the cache's docstring says. cache=False: the whole sequence is rerun at every step (no cache).
    Raises ValueError when T + n passes the model's seq_len, and for a dtype no cache may hold.
    """
    positive("n", n)
    if dtype is not None:
        cache_dtype(dtype)
    prompt = prompt.reshape(1, -1) if prompt.dim() == 1 else prompt
    B, T = prompt.shape
    if T + n > model.config.seq_len:
        raise ValueError(f"prompt {T} + n {n} tokens pass the model's seq_len={model.config.seq_len}")
    sampler = sampler or Sampler()
    model.eval()
    out = []
    if cache:
        p = next(model.parameters())
        # one cache for the whole generation, the prompt plus the n new tokens, allocated once
        kv = (make_cache or KVCache)(model.config, B, T + n, dtype=dtype or p.dtype, device=p.device)
        logits = prefill(model, prompt, kv)  # the prompt once, all T tokens in parallel: the cache holds T
        for i in range(n):
            out.append(sampler(logits))  # new token i, from the last position's logits
            if i < n - 1:  # the last token needs no forward: nothing is generated after it
                logits = decode_one(model, out[-1], kv)  # one token against the cache, which then holds T + i + 1
    else:
        seq = prompt
        for _ in range(n):  # the quadratic baseline: every step reruns the whole sequence so far
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
