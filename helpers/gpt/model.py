"""The course GPT: a GPT-2-style decoder with grouped-query attention and a pluggable attention kernel.

Layout (Radford et al., 2019, as in GPT-2): token + learned position embeddings, `n_layer`
pre-LayerNorm blocks (x + attn(LN(x)), then x + MLP(LN(x))), a final LayerNorm and an LM head that
shares the token-embedding matrix when `tie_embeddings`.

Attention is grouped-query (Ainslie et al., 2023): `n_head` query heads share `n_kv_head` key/value
heads (`n_kv_head == n_head` is multi-head attention, `n_kv_head == 1` multi-query attention). The
projections are two linears, `q_proj` (d_model -> n_head*head_dim) and `kv_proj`
(d_model -> 2*n_kv_head*head_dim), so the k/v projection's weight shape shows the number of KV
heads. For FLOPs this equals one fused qkv linear: 2*tokens*d_model*(n_head + 2*n_kv_head)*head_dim.

The attention kernel is any `fn(q, k, v, is_causal) -> out` on (B, n_head, T, head_dim) tensors
(k and v already repeated to n_head heads): "naive" and "sdpa" are built in, `register_attention`
adds more and `model.attn_impl = ...` switches at run time. Dropout is applied to the embeddings
and to each residual branch, never inside attention, so every kernel computes the same function.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Iterable, Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from helpers.measure.params import positive

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]


class KVCacheLike(Protocol):
    """What `GPT.forward(idx, cache=...)` needs of a key/value cache (contiguous, paged, latent, ...).

    The cache tracks B sequences. For T new tokens of each: `positions(T)` gives their absolute
    positions (B, T); `attend(layer, q, k, v)` with q (B, H, T, hd) and k, v (B, H_kv, T, hd) stores
    k and v after what the layer holds for each sequence and returns causal attention (B, H, T, hd)
    of q over the cached and new keys (new token t sees the cached ones and new ones up to t);
    `advance(T)` is called once after the last layer.

    Dtypes: a cache stores k and v in its own dtype, whatever the model's, and `attend` returns q's dtype
    (the model's); attention computes in a dtype no narrower than q's or the cache's (the caches of
    `helpers.gpt.generation` and `helpers.decode` compute in `generation.compute_dtype`, the wider of the
    two; the paged cache in float32 at least). Each cache's docstring says "stores in X, computes in Y".
    """

    def positions(self, T: int) -> torch.Tensor: ...

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...

    def advance(self, T: int) -> None: ...


@dataclass(kw_only=True)
class GPTConfig:
    """Architecture of the course GPT (sizes only; nothing about training or kernels)."""

    n_layer: int  # number of transformer blocks
    n_head: int  # query heads per attention layer
    n_kv_head: int | None = None  # key/value heads, dividing n_head (None: n_head, i.e. plain MHA)
    d_model: int  # width of the residual stream; head_dim = d_model // n_head
    d_ff: int  # hidden width of the MLP (4 * d_model in GPT-2)
    vocab_size: int = 256  # 256 byte tokens for the stdlib corpus; 50257 for GPT-2's BPE
    seq_len: int  # longest context: rows of the position-embedding table
    dropout: float = 0.0  # on embeddings and residual branches during training
    bias: bool = True  # biases in the linears and LayerNorms (GPT-2 has them)
    tie_embeddings: bool = True  # LM head reuses the token-embedding matrix (GPT-2 does)

    def __post_init__(self) -> None:
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        for name in ("n_layer", "n_head", "n_kv_head", "d_model", "d_ff", "vocab_size", "seq_len"):
            positive(name, getattr(self, name))
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_head={self.n_head}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head={self.n_head} must be divisible by n_kv_head={self.n_kv_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout!r} must be in [0, 1)")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.n_head

    @classmethod
    def preset(cls, name: str, **overrides) -> "GPTConfig":
        """A named configuration from PRESETS, with any field overridden."""
        if name not in PRESETS:
            raise ValueError(f"preset {name!r} is unknown; choose one of {', '.join(map(repr, PRESETS))}")
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown GPTConfig field(s) {sorted(unknown)}")
        return cls(**{**PRESETS[name], **overrides})


PRESETS: dict[str, dict] = {
    # smoke runs on a CPU: ~0.43M parameters
    "tiny": dict(n_layer=2, n_head=4, d_model=128, d_ff=512, seq_len=128),
    # the course's trainable model on the stdlib corpus: ~10.6M parameters (nanoGPT's char-level size)
    "small10m": dict(n_layer=6, n_head=6, d_model=384, d_ff=1536, seq_len=256),
    # GPT-2 small, 124M (Radford et al., 2019)
    "gpt2": dict(n_layer=12, n_head=12, d_model=768, d_ff=3072, vocab_size=50257, seq_len=1024),
    # GPT-2 medium, 350M
    "gpt2-medium": dict(n_layer=24, n_head=16, d_model=1024, d_ff=4096, vocab_size=50257, seq_len=1024),
    # a 1.3B model (GPT-3 XL's depth and width; Brown et al., 2020) for FLOP and memory arithmetic only
    "1.3b": dict(n_layer=24, n_head=32, d_model=2048, d_ff=8192, vocab_size=50257, seq_len=2048),
}


# ---------------------------------------------------------------- attention kernels

def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(head_dim)) v with every score materialised; masked scores set to -inf.

    q (..., T, head_dim), k and v (..., S, head_dim) -> (..., T, head_dim), in q's dtype.

    The causal mask keeps key j for query i when j <= i (top-left aligned when T != S, as in SDPA).
    """
    T, S = q.size(-2), k.size(-2)
    # scale q before the product, as SDPA's math path does: in fp16 the unscaled q kᵀ can overflow
    # to inf (|q kᵀ| > 65504) where the scaled scores fit, and inf - inf in the softmax gives NaN
    scores = (q * (1.0 / math.sqrt(q.size(-1)))) @ k.transpose(-2, -1)  # (B, H, T, S)
    if is_causal:
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril()  # (T, S)
        scores = scores.masked_fill(~mask, float("-inf"))  # (B, H, T, S)
    probs = torch.softmax(scores, dim=-1)  # (B, H, T, S)
    return probs @ v  # (B, H, T, head_dim)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> torch.Tensor:
    """PyTorch's fused scaled_dot_product_attention (flash / memory-efficient / math backend)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)  # (B, H, T, head_dim)


ATTENTION: dict[str, AttentionFn] = {"naive": naive_attention, "sdpa": sdpa_attention}


def register_attention(name: str, fn: AttentionFn) -> None:
    """Make `fn(q, k, v, is_causal) -> out` selectable as `model.attn_impl = name`."""
    if not callable(fn):
        raise TypeError(f"attention {name!r} must be callable, got {type(fn).__name__}")
    ATTENTION[name] = fn


def resolve_attention(impl: str | AttentionFn) -> AttentionFn:
    """The kernel for a registered name, or `impl` itself when it is callable."""
    if callable(impl):
        return impl
    if impl not in ATTENTION:
        raise ValueError(f"attn_impl={impl!r} is unknown; choose one of {', '.join(map(repr, ATTENTION))} "
                         f"or pass a callable fn(q, k, v, is_causal)")
    return ATTENTION[impl]


# ---------------------------------------------------------------- the model

class CausalSelfAttention(nn.Module):
    """Grouped-query causal attention: q = x W_q, [k, v] = x W_kv, y = attn(q, k, v) W_o."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_head * cfg.head_dim, bias=cfg.bias)
        self.kv_proj = nn.Linear(cfg.d_model, 2 * cfg.n_kv_head * cfg.head_dim, bias=cfg.bias)
        self.out_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=cfg.bias)
        self.resid_drop = nn.Dropout(cfg.dropout)
        self.attn_fn: AttentionFn = sdpa_attention

    def forward(self, x: torch.Tensor, cache: "KVCacheLike | None" = None, layer: int = 0) -> torch.Tensor:
        B, T, _ = x.shape
        H, H_kv, hd = self.n_head, self.n_kv_head, self.head_dim
        q = self.q_proj(x).view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
        k, v = self.kv_proj(x).view(B, T, 2, H_kv, hd).permute(2, 0, 3, 1, 4)  # 2 x (B, H_kv, T, hd)
        if cache is not None:  # the cache stores k, v after what it holds and attends over all of it
            y = cache.attend(layer, q, k, v)  # (B, H, T, hd)
            return self.resid_drop(self.out_proj(y.transpose(1, 2).reshape(B, T, H * hd)))
        if H_kv != H:  # each kv head serves H // H_kv consecutive query heads
            k = k.repeat_interleave(H // H_kv, dim=1)  # (B, H, T, hd)
            v = v.repeat_interleave(H // H_kv, dim=1)  # (B, H, T, hd)
        y = self.attn_fn(q, k, v, True)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, H * hd)  # (B, T, d_model)
        return self.resid_drop(self.out_proj(y))  # (B, T, d_model)


class MLP(nn.Module):
    """y = GELU(x W_up + b_up) W_down + b_down, with GPT-2's tanh approximation of GELU."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.up(x), approximate="tanh")  # (B, T, d_ff)
        return self.drop(self.down(h))  # (B, T, d_model)


class Block(nn.Module):
    """Pre-LayerNorm block: x + attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)
        self.checkpointed = False  # recompute this block in backward instead of keeping activations

    def forward(self, x: torch.Tensor, cache: "KVCacheLike | None" = None, layer: int = 0) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache, layer)  # (B, T, d_model)
        return x + self.mlp(self.ln_2(x))  # (B, T, d_model)


class GPT(nn.Module):
    """The course GPT; `forward(idx, targets)` returns (logits, loss or None).

    `attn_impl` picks the attention kernel: a name in ATTENTION ("sdpa" by default) or a callable.
    """

    def __init__(self, config: GPTConfig, attn_impl: str | AttentionFn = "sdpa"):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.seq_len, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model, bias=config.bias)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # one matrix, used at both ends
        self.apply(self._init_weights)
        for block in self.blocks:  # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer)
            for w in (block.attn.out_proj.weight, block.mlp.down.weight):
                nn.init.normal_(w, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        self.attn_impl = attn_impl

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    @property
    def attn_impl(self) -> str | AttentionFn:
        """The attention kernel in use: a name from ATTENTION or a callable."""
        return self._attn_impl

    @attn_impl.setter
    def attn_impl(self, impl: str | AttentionFn) -> None:
        fn = resolve_attention(impl)
        for block in self.blocks:
            block.attn.attn_fn = fn
        self._attn_impl = impl

    def set_checkpointing(self, layers: bool | Iterable[int]) -> None:
        """Recompute the given blocks (True: all, False: none, or block indices) during backward."""
        n = len(self.blocks)
        if isinstance(layers, bool):
            chosen = set(range(n)) if layers else set()
        else:
            chosen = set(layers)
            bad = sorted(i for i in chosen if not isinstance(i, int) or not 0 <= i < n)
            if bad:
                raise ValueError(f"block indices {bad} are out of range; this model has blocks 0..{n - 1}")
        for i, block in enumerate(self.blocks):
            block.checkpointed = i in chosen

    @property
    def checkpointed_layers(self) -> list[int]:
        """Indices of the blocks that are recomputed in backward."""
        return [i for i, block in enumerate(self.blocks) if block.checkpointed]

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count, shared tensors once; non_embedding leaves out the token and position tables."""
        n = sum(p.numel() for p in self.parameters())  # a tied LM head is the token table, counted once
        if non_embedding:
            n -= self.wte.weight.numel() + self.wpe.weight.numel()
        return n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: "KVCacheLike | None" = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, vocab_size) for token ids idx (B, T); mean cross-entropy when targets are given.

        With a `cache` (see KVCacheLike), idx holds only the T new tokens of each of the B sequences
        the cache tracks: their positions come from the cache, each attention layer stores its keys
        and values there and attends over everything cached, and the cache advances by T at the end.
        Raises ValueError when a position would pass seq_len.
        """
        B, T = idx.shape
        if cache is None:
            if T > self.config.seq_len:
                raise ValueError(f"sequence of length {T} is longer than seq_len={self.config.seq_len}")
            pos = torch.arange(T, device=idx.device)  # (T,)
        else:
            pos = cache.positions(T)  # (B, T) absolute positions of the new tokens
            if int(pos.max()) >= self.config.seq_len:
                raise ValueError(f"position {int(pos.max())} is past seq_len={self.config.seq_len}")
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, d_model)
        for i, block in enumerate(self.blocks):
            if cache is not None:
                x = block(x, cache, i)  # (B, T, d_model)
            elif block.checkpointed and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)  # (B, T, d_model), activations dropped
            else:
                x = block(x)  # (B, T, d_model)
        if cache is not None:
            cache.advance(T)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab_size)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T), ignore_index=-1)
        return logits, loss


def save_checkpoint(model: GPT, path: str | os.PathLike) -> Path:
    """Write {config, state_dict} with torch.save; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"config": asdict(model.config), "state_dict": model.state_dict()}, path)
    return path


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> GPT:
    """Rebuild a GPT from `save_checkpoint`'s file (loaded with weights_only=True)."""
    payload = torch.load(path, map_location=map_location, weights_only=True)
    model = GPT(GPTConfig(**payload["config"]))
    model.load_state_dict(payload["state_dict"])
    return model.to(map_location)
