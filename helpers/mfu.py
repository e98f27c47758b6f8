"""Model FLOPs utilisation in practice: timed training steps, timed sub-blocks, training-time estimates.

`helpers.flops` counts FLOPs; this module puts time next to the count. FLOPs are always the
`transformer_flops` convention (FlopCounterMode's): matmuls only, attention scores for the full
T x T square even when a causal kernel skips half of them. The timed path may use a faster kernel
(SDPA, flash on a GPU) than the one that is counted; the FLOPs credited to it stay the same.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Callable, Sequence

import torch

from . import plots
from .bench import benchmark, benchmark_interleaved, release_memory
from .flops import COMPONENTS, SECONDS_PER_DAY, matmul_params, six_nd, transformer_flops
from .model import GPT, Block, GPTConfig, resolve_attention
from .widgets import progress

SECONDS_PER_HOUR = 3_600
ATTENTION_PARTS = ("qkv", "attn_scores", "attn_values", "attn_out")
CORE_PARTS = ("attn_scores", "attn_values")
MLP_PARTS = ("mlp_up", "mlp_down")
SUBLAYERS = ("attention", "attention_core", "mlp")


# ---------------------------------------------------------------- counting

def source_formula_flops(config: GPTConfig, n_tokens: int) -> dict[str, int]:
    """The per-component formulas of source text 003 §3, taken literally (h = d_model, D = tokens).

    attention 2·L·D·h², FFN 2·L·D·4h², 'embedding' 2·D·V·h. (Forward only, one h x h matrix for
    attention, one of the two FFN matrices, and no T-dependent attention term: see notebook 02.)
    """
    L, h, V = config.n_layer, config.d_model, config.vocab_size
    return {"attention": 2 * L * n_tokens * h**2, "ffn": 2 * L * n_tokens * 4 * h**2,
            "embedding": 2 * n_tokens * V * h}


def grouped_flops(config: GPTConfig, batch_size: int, seq_len: int, *, key: str = "forward") -> dict[str, int]:
    """`transformer_flops` summed into the source's three groups: attention, ffn, embedding (= LM head)."""
    f = transformer_flops(config, batch_size, seq_len)
    return {"attention": sum(f[c][key] for c in ATTENTION_PARTS), "ffn": sum(f[c][key] for c in MLP_PARTS),
            "embedding": f["embedding"][key] + f["lm_head"][key]}


def sublayer_flops(config: GPTConfig, batch_size: int, seq_len: int, *, backward: bool = False,
                   causal: bool = False) -> dict[str, int]:
    """FLOPs of ONE block's attention sub-block, its attention core (scores + values) and its MLP sub-block."""
    one = replace(config, n_layer=1, seq_len=max(seq_len, config.seq_len))
    f = transformer_flops(one, batch_size, seq_len, backward=backward, causal=causal)
    return {"attention": sum(f[c]["total"] for c in ATTENTION_PARTS),
            "attention_core": sum(f[c]["total"] for c in CORE_PARTS),
            "mlp": sum(f[c]["total"] for c in MLP_PARTS)}


# ---------------------------------------------------------------- timing the two halves of a block

def sublayer_closures(config: GPTConfig, batch_size: int, seq_len: int, *, device: str = "cpu",
                      dtype: torch.dtype = torch.float32, backward: bool = False,
                      attn_impl: str = "sdpa", seed: int = 0) -> dict[str, Callable[[], object]]:
    """Zero-argument callables running one block's sub-blocks on the same (B, T, d_model) input.

    "attention": LN + q/kv projections + attention + output projection; "attention_core": the
    attention kernel alone on (B, n_head, T, head_dim) q, k, v; "mlp": LN + up + GELU + down.
    With `backward`, each also computes the gradients of its input and its parameters (as a
    training step does); without, it runs under torch.no_grad().
    """
    g = torch.Generator(device="cpu").manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = Block(replace(config, n_layer=1)).to(device=device, dtype=dtype)
    attn_fn = resolve_attention(attn_impl)
    block.attn.attn_fn = attn_fn
    B, T, d, H, hd = batch_size, seq_len, config.d_model, config.n_head, config.head_dim

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype).requires_grad_(backward)

    x = rand(B, T, d)  # (B, T, d_model)
    q, k, v = rand(B, H, T, hd), rand(B, H, T, hd), rand(B, H, T, hd)  # (B, H, T, hd) each
    grad_x = torch.randn(B, T, d, generator=g).to(device=device, dtype=dtype)  # (B, T, d_model)
    grad_core = torch.randn(B, H, T, hd, generator=g).to(device=device, dtype=dtype)  # (B, H, T, hd)
    parts = {
        "attention": (lambda: block.attn(block.ln_1(x)), [x, *block.ln_1.parameters(), *block.attn.parameters()], grad_x),
        "attention_core": (lambda: attn_fn(q, k, v, True), [q, k, v], grad_core),
        "mlp": (lambda: block.mlp(block.ln_2(x)), [x, *block.ln_2.parameters(), *block.mlp.parameters()], grad_x),
    }

    def make(forward, inputs, grad_out):
        def run():
            if not backward:
                with torch.no_grad():
                    return forward()
            for t in inputs:  # fresh gradients each call, as after optimizer.zero_grad(set_to_none=True)
                t.grad = None
            forward().backward(grad_out)
        return run

    return {name: make(*spec) for name, spec in parts.items()}


def time_sublayers(config: GPTConfig, batch_size: int, seq_len: int, *, device: str = "cpu",
                   dtype: torch.dtype = torch.float32, backward: bool = False, attn_impl: str = "sdpa",
                   reps: int = 10, warmup: int = 3) -> dict[str, dict]:
    """Seconds, counted FLOPs and achieved TFLOP/s of each sub-block on the same tokens.

    The sub-blocks are timed interleaved (attention, core, MLP, attention, ...), one shared-timer
    call each, so a burst of other work on the machine hits all of them alike; every part's
    dict keeps its raw `samples` for `efficiency_ratio`.
    """
    fns = sublayer_closures(config, batch_size, seq_len, device=device, dtype=dtype, backward=backward,
                            attn_impl=attn_impl)
    counted = sublayer_flops(config, batch_size, seq_len, backward=backward)
    timings = benchmark_interleaved({name: fns[name] for name in SUBLAYERS}, reps=reps, warmup=warmup,
                                    device=device)
    return {name: {"seconds": t.median, "spread": t.spread, "flops": counted[name],
                   "tflops": counted[name] / t.median / 1e12, "samples": t.samples} for name, t in timings.items()}


def efficiency_ratio(result: dict[str, dict], numerator: str = "mlp", denominator: str = "attention") -> float:
    """Median over interleaved repetitions of (numerator TFLOP/s) / (denominator TFLOP/s)."""
    n, d = result[numerator], result[denominator]
    return statistics.median((n["flops"] / tn) / (d["flops"] / td) for tn, td in zip(n["samples"], d["samples"]))


# ---------------------------------------------------------------- timing a training step

def train_step_closure(model: GPT, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                       autocast_dtype: torch.dtype | None = None) -> Callable[[], None]:
    """One training step on (x, y): forward (under autocast if a dtype is given), backward, optimizer step."""
    device_type = x.device.type

    def step() -> None:
        with torch.autocast(device_type=device_type, dtype=autocast_dtype or torch.bfloat16,
                            enabled=autocast_dtype is not None):
            _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def measure_train_step(config: GPTConfig, batch_size: int, seq_len: int, *, device: str = "cpu",
                       autocast_dtype: torch.dtype | None = None, attn_impl: str = "sdpa",
                       reps: int = 10, warmup: int = 3, seed: int = 0) -> dict[str, float]:
    """Build the model and AdamW, time full training steps on random tokens; tokens/s and TFLOP/s."""
    torch.manual_seed(seed)
    model = GPT(config, attn_impl=attn_impl).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    x = torch.randint(0, config.vocab_size, (batch_size, seq_len), device=device)  # (B, T)
    y = torch.randint(0, config.vocab_size, (batch_size, seq_len), device=device)  # (B, T)
    t = benchmark(train_step_closure(model, optimizer, x, y, autocast_dtype), warmup=warmup, reps=reps, device=device)
    tokens = batch_size * seq_len
    counted = transformer_flops(config, batch_size, seq_len)["total"]["total"]
    n_params = model.num_params(non_embedding=False)
    del model, optimizer
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"batch_size": batch_size, "seq_len": seq_len, "seconds": t.median, "spread": t.spread,
            "tokens_per_s": tokens / t.median, "flops": counted, "tflops": counted / t.median / 1e12,
            "tflops_6n": six_nd(matmul_params(config), tokens) / t.median / 1e12, "params": n_params}


def sweep_train_steps(presets: Sequence[str], batch_sizes: Sequence[int], seq_len: int, *, device: str = "cpu",
                      autocast_dtype: torch.dtype | None = None, reps: int = 10, warmup: int = 3,
                      seed: int = 0) -> tuple[list[dict], list[str]]:
    """measure_train_step for every preset and batch size (T capped at the preset's context).

    Returns the rows (each with its "model") and the "preset B=b" points that ran out of GPU memory,
    which a sweep on a 16-40 GB GPU may reach; those are skipped and the sweep goes on.
    """
    rows, too_big = [], []
    for name in progress(presets, desc="models"):
        config = GPTConfig.preset(name)
        for b in batch_sizes:
            try:
                row = measure_train_step(config, b, min(seq_len, config.seq_len), device=device,
                                         autocast_dtype=autocast_dtype, reps=reps, warmup=warmup, seed=seed)
            except torch.cuda.OutOfMemoryError:
                too_big.append(f"{name} B={b}")
                row = None
            if row is None:  # after the except block, so the failed step's tensors are gone
                release_memory()
            else:
                rows.append(row | {"model": name})
    return rows, too_big


# ---------------------------------------------------------------- estimates from 6ND

def gpu_hours(n_params: float, n_tokens: float, peak_flops_per_s: float, mfu: float) -> float:
    """GPU-hours to train on 6·N·D FLOPs at the given MFU (independent of how many GPUs share them)."""
    if peak_flops_per_s <= 0 or not 0 < mfu <= 1:
        raise ValueError(f"peak_flops_per_s={peak_flops_per_s!r} must be positive and mfu={mfu!r} in (0, 1]")
    return six_nd(n_params, n_tokens) / (peak_flops_per_s * mfu) / SECONDS_PER_HOUR


def implied_mfu(n_params: float, n_tokens: float, peak_flops_per_s: float, reported_gpu_hours: float) -> float:
    """The MFU that 6·N·D FLOPs in `reported_gpu_hours` GPU-hours at `peak_flops_per_s` amounts to."""
    if peak_flops_per_s <= 0 or reported_gpu_hours <= 0:
        raise ValueError("peak_flops_per_s and reported_gpu_hours must be positive")
    return six_nd(n_params, n_tokens) / (peak_flops_per_s * reported_gpu_hours * SECONDS_PER_HOUR)


def days_from_gpu_hours(hours: float, n_gpus: int) -> float:
    """Wall-clock days when `n_gpus` share `hours` GPU-hours perfectly."""
    return hours * SECONDS_PER_HOUR / n_gpus / SECONDS_PER_DAY


# ---------------------------------------------------------------- instructor panel

def per_token_breakdown(config: GPTConfig, seq_len: int | None = None) -> dict[str, float]:
    """Training FLOPs per token of each component (forward + backward), at seq_len (default: the config's)."""
    T = seq_len or config.seq_len
    f = transformer_flops(config, 1, T)
    return {c: f[c]["total"] / T for c in COMPONENTS if c != "embedding"}


def flops_panel(n_layer: int, d_model: int, seq_len: int, vocab_size: int, *, head_dim: int = 64,
                ff_mult: int = 4):
    """Notebook 02: a model shape -> training FLOPs per token by component, with 6N beside the exact count."""
    if d_model % head_dim:
        raise ValueError(f"d_model={d_model} must be a multiple of head_dim={head_dim}")
    cfg = GPTConfig(n_layer=n_layer, n_head=d_model // head_dim, d_model=d_model, d_ff=ff_mult * d_model,
                    vocab_size=vocab_size, seq_len=seq_len)
    parts = per_token_breakdown(cfg)
    total = sum(parts.values())
    six_n = 6 * matmul_params(cfg)
    attention_term = parts["attn_scores"] + parts["attn_values"]
    print(f"L={n_layer}, d={d_model}, T={seq_len}, V={vocab_size}: {total / 1e9:.4g} GFLOP per token "
          f"= 6N {six_n / 1e9:.4g} + attention scores/values {attention_term / 1e9:.4g} "
          f"({attention_term / total:.1%}); MLP {(parts['mlp_up'] + parts['mlp_down']) / total:.1%}, "
          f"LM head {parts['lm_head'] / total:.1%}")
    return plots.bars({k: v / 1e9 for k, v in parts.items()}, ylabel="GFLOP per token (forward + backward)",
                      title=f"{total / 1e9:.3g} GFLOP/token: L={n_layer}, d={d_model}, T={seq_len}", annotate="{:.3g}")
