"""Notebook 10's measurements of one sequence's cache: decode with and without a cache, prefill vs decode on
the roofline, decode as bandwidth, attention variants against a memory budget, and compiled decode.

Every function here times with `helpers.measure.bench` and counts FLOPs with torch's FlopCounterMode (matmuls and
attention, as torch counts them) and bytes by hand (stated in each docstring). The caches are
`helpers.gpt.generation.KVCache` and `helpers.decode.kv_cache`'s; the serving sections (paged cache, batching,
the KV-memory panel) are `helpers.decode.serving_lab`.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from helpers.decode.kv_cache import (LatentKVCache, StaticKVCache, decode_compile_options, factorise_kv,
                                     kv_bytes_per_token, static_step)
from helpers.gpt.generation import KVCache, rewound_step
from helpers.gpt.model import GPT, GPTConfig
from helpers.gpt.pretrained import validation_loss
from helpers.measure import bench
from helpers.measure.params import positive


def _tokens(B: int, T: int, device, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(seed)).to(device)


def _param(model: nn.Module) -> torch.Tensor:
    return next(model.parameters())


def weight_bytes(model: GPT) -> int:
    """Bytes of the weights one decode step reads: every parameter once (a tied LM head once), except the
    position table, of which one row per token is read."""
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    wpe = model.wpe.weight
    return n - wpe.numel() * wpe.element_size() + wpe.size(1) * wpe.element_size()


def counted_flops(fn) -> int:
    """FLOPs of one call of fn() as torch's FlopCounterMode counts them (matmuls and attention)."""
    # heavy: torch.utils.flop_counter imports triton, which must load after the course's kernels switch its
    # interpreter on (helpers.measure.triton_mode)
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.no_grad():
        fn()
    return int(counter.get_total_flops())


def filled_cache(model: GPT, batch: int, context: int, max_len: int | None = None) -> KVCache:
    """A KVCache of `batch` sequences holding `context` tokens, filled by a prefill of random tokens."""
    p = _param(model)
    cache = KVCache(model.config, batch, max_len or context + 1, dtype=p.dtype, device=p.device)
    with torch.no_grad():
        model(_tokens(batch, context, p.device), cache=cache)
    return cache


def decode_step_fn(model: GPT, cache, batch: int):
    """A closure: one decode step of `batch` fixed random tokens at the cache's current length, rewound
    before every call so that every call measures the same position (`rewound_step`)."""
    return rewound_step(model, cache, _tokens(batch, 1, _param(model).device, 1))


def per_position(model: GPT, positions: list[int], reps: int, progress=iter, warmup: int = 1,
                 spreads: dict | None = None) -> dict[str, list[float]]:
    """Seconds for the next token at each context length in `positions`: with a cache (one decode step) and
    without (a forward over the whole context + 1 tokens), timed interleaved after `warmup` untimed calls of
    each. When `spreads` is a dict it receives each variant's IQR / median per position (same keys)."""
    dev = _param(model).device.type
    out = {"with cache": [], "without cache": []}
    if spreads is not None:
        spreads.update({k: [] for k in out})
    cache = filled_cache(model, 1, max(positions), max(positions) + 1)
    seq = _tokens(1, max(positions) + 1, _param(model).device)
    for p in progress(positions):
        cache.length = p
        fns = {"with cache": decode_step_fn(model, cache, 1),
               "without cache": lambda p=p: model(seq[:, :p + 1])[0][:, -1]}
        with torch.no_grad():
            t = bench.benchmark_interleaved(fns, reps=reps, warmup=warmup, device=dev)
        for k in out:
            out[k].append(t[k].median)
            if spreads is not None:
                spreads[k].append(t[k].spread)
    return out


def prefill_decode(model: GPT, prompt_len: int, reps: int) -> list[dict]:
    """Prefill of `prompt_len` tokens vs one decode step at that context, batch 1: counted FLOPs, minimum
    bytes (weights read once + K/V written for prefill; weights + K/V read + written for decode), the
    intensity (FLOP/byte), measured seconds and the achieved TFLOP/s and GB/s."""
    dev, p = _param(model).device.type, _param(model)
    cfg, el = model.config, p.element_size()
    kv_tok = kv_bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, el)
    toks = _tokens(1, prompt_len, p.device)
    cache = KVCache(cfg, 1, prompt_len + 1, dtype=p.dtype, device=p.device)
    pre = rewound_step(model, cache, toks)  # the prompt, always from an empty cache
    pre()
    dec = decode_step_fn(model, cache, 1)
    rows = []
    for name, fn, nbytes in (("prefill", pre, weight_bytes(model) + prompt_len * kv_tok),
                             ("decode", dec, weight_bytes(model) + (prompt_len + 1) * kv_tok)):
        flops = counted_flops(fn)
        with torch.no_grad():
            t = bench.benchmark(fn, warmup=1, reps=reps, device=dev)
        rows.append({"phase": name, "tokens": prompt_len if name == "prefill" else 1, "flops": flops,
                     "bytes": nbytes, "intensity": flops / nbytes, "seconds": t.median, "spread": t.spread,
                     "tflops": flops / t.median / 1e12, "gbps": nbytes / t.median / 1e9})
    return rows


def random_model(preset: str, dtype: torch.dtype, device: str, **overrides) -> GPT:
    """An untrained course GPT of `preset` in `dtype` on `device` (speed does not depend on training)."""
    torch.manual_seed(0)
    with torch.device(device):  # built where it runs: a 1.3B model initialised on a CPU takes long
        model = GPT(GPTConfig.preset(preset, **overrides))
    return model.to(dtype=dtype).eval()


def _decode_case(model: GPT, context: int, batch: int, name: str) -> tuple:
    """(step closure, row without timings) for one decode step of `batch` sequences at `context` tokens."""
    p, cfg = _param(model), model.config
    kv = kv_bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, p.element_size())
    fn = decode_step_fn(model, filled_cache(model, batch, context), batch)
    nbytes = weight_bytes(model) + batch * (context + 1) * kv
    flops = counted_flops(fn)
    return fn, {"model": name, "params_m": sum(q.numel() for q in model.parameters()) / 1e6, "batch": batch,
                "context": context, "bytes": nbytes, "flops": flops, "intensity": flops / nbytes}


def _timed(row: dict, t: bench.Timing) -> dict:
    return {**row, "seconds": t.median, "spread": t.spread, "tokens_per_s": row["batch"] / t.median,
            "gbps": row["bytes"] / t.median / 1e9, "tflops": row["flops"] / t.median / 1e12}


def bandwidth_row(model: GPT, context: int, batch: int, reps: int, name: str = "") -> dict:
    """One decode step of `batch` sequences at `context` cached tokens: seconds (median, IQR spread), tokens/s,
    bytes read (weights once + every sequence's K/V), achieved GB/s, counted FLOPs and FLOP/byte."""
    fn, row = _decode_case(model, context, batch, name)
    with torch.no_grad():
        return _timed(row, bench.benchmark(fn, warmup=1, reps=reps, device=_param(model).device.type))


def bandwidth_rows(cases: list[tuple[str, GPT, int, int]], reps: int, interleave: bool) -> list[dict]:
    """`bandwidth_row` for each (name, model, context, batch). With `interleave` (for a CPU shared with other
    work) every case is set up first and the steps are timed round-robin, so a burst of other work slows all
    alike; otherwise one after another, each case's cache freed before the next (for large models on a GPU)."""
    if not interleave:
        return [bandwidth_row(m, ctx, b, reps, name) for name, m, ctx, b in cases]
    built = [_decode_case(m, ctx, b, name) for name, m, ctx, b in cases]
    with torch.no_grad():
        t = bench.benchmark_interleaved({i: fn for i, (fn, _) in enumerate(built)}, reps=reps, warmup=1,
                                        device=_param(cases[0][1]).device.type)
    return [_timed(row, t[i]) for i, (_, row) in enumerate(built)]


# ---------------------------------------------------------------- attention variants


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


def mla_sweep(model: GPT, ranks: list[int], val_tokens: torch.Tensor, val_batches: int) -> list[dict]:
    """For each rank: the k/v projections' mean relative reconstruction error, and the validation loss of the
    factorised model (nats/byte), beside the original's."""
    rows = []
    for r in ranks:
        low, errs = factorise_kv(model, r)
        rows.append({"rank": r, "recon_error": sum(errs) / len(errs),
                     "val_loss": validation_loss(low, val_tokens, batches=val_batches)})
    return rows


def _latent_step(low: GPT, context: int):
    """(step closure, cache) for one decode step through a LatentKVCache at `context` tokens (batch 1)."""
    p = _param(low)
    cache = LatentKVCache(low, 1, context + 1, dtype=p.dtype, device=p.device)
    with torch.no_grad():
        low(_tokens(1, context, p.device), cache=cache)
    return rewound_step(low, cache, _tokens(1, 1, p.device, 1)), cache


def variant_speeds(models: dict[str, GPT], latent: tuple[str, GPT] | None, context: int, reps: int,
                   warmup: int = 3) -> list[dict]:
    """Batch-1 decode at `context` cached tokens for each named model (contiguous KV cache) and, when `latent`
    is (name, factorised model), through a LatentKVCache. Every case is set up first and all are timed
    round-robin after `warmup` untimed calls each, so other work on the machine slows them alike.
    Returns per case: "variant", "seconds" (median), "spread" (IQR / median) and "kv_share" (the K/V's share
    of the bytes a step reads; None for the latent)."""
    positive("reps", reps)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be an int >= 0")
    fns, shares = {}, {}
    for name, m in models.items():
        fn, row = _decode_case(m, context, 1, name)
        fns[name], shares[name] = fn, 1 - weight_bytes(m) / row["bytes"]
    if latent is not None:
        fns[latent[0]], _ = _latent_step(latent[1], context)
        shares[latent[0]] = None
    dev = _param(next(iter(models.values())) if models else latent[1]).device.type
    with torch.no_grad():
        t = bench.benchmark_interleaved(fns, reps=reps, warmup=warmup, device=dev)
    return [{"variant": k, "seconds": t[k].median, "spread": t[k].spread, "kv_share": shares[k]} for k in fns]


# ---------------------------------------------------------------- compiled decode


def compiled_decode(model: GPT, context: int, reps: int, mode: str = "reduce-overhead") -> dict:
    """CUDA only: batch-1 decode at `context` tokens, eager KVCache vs torch.compile(static_step) with a
    StaticKVCache (`mode` "reduce-overhead" adds CUDA graphs; `decode_compile_options` says what else is
    set). Returns seconds and bytes read per token."""
    options = decode_compile_options(mode)
    p = _param(model)
    cfg = model.config
    static = StaticKVCache(cfg, 1, context + 1, dtype=p.dtype, device=p.device)
    with torch.no_grad():
        model(_tokens(1, context, p.device), cache=static)  # prefill through the same buffers
    tok = _tokens(1, 1, p.device, 1)
    step = torch.compile(static_step, fullgraph=True, options=options)

    def run():
        static.pos.fill_(context)
        torch.compiler.cudagraph_mark_step_begin()
        return step(model, tok, static).clone()
    with torch.no_grad():
        t = bench.benchmark(run, warmup=3, reps=reps, device="cuda")
    eager = bandwidth_row(model, context, 1, reps)
    nbytes = weight_bytes(model) + (context + 1) * kv_bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim,
                                                                       p.element_size())
    return {"eager_s": eager["seconds"], "compiled_s": t.median, "compiled_spread": t.spread, "bytes": nbytes,
            "compiled_gbps": nbytes / t.median / 1e9, "eager_gbps": eager["gbps"], "mode": mode}
