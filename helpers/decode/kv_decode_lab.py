"""Notebook 10's decode-speed measurements on the KV cache: batch-1 decode as a bandwidth problem and batch size
against tokens/s, the attention variants (MHA, GQA, MQA, an MLA-style latent) timed, and compiled decode on a
static cache.

Timed by the course's protocol through `helpers.decode.kv_cache_lab` (`compare`, `timed`), bytes counted by
`helpers.gpt.footprint.decode_step_bytes` (the weights once, one position row, every sequence's K/V), FLOPs by
torch's FlopCounterMode (`kv_cache_lab.counted_flops`). The caches are `helpers.gpt.generation.KVCache` and
`helpers.decode.kv_cache`'s (`StaticKVCache`, `LatentKVCache`).
"""
from __future__ import annotations

import torch

from helpers.decode.kv_cache import (LatentKVCache, StaticKVCache, decode_compile_options, factorise_kv,
                                     kv_bytes_per_token, static_step)
from helpers.decode.kv_cache_lab import (FULL_BUDGET_S, SMOKE_BUDGET_S, compare, counted_flops, decode_step_fn,
                                         filled_cache, first_parameter, random_tokens, timed)
from helpers.gpt.footprint import decode_step_bytes
from helpers.gpt.generation import rewound_step
from helpers.gpt.model import GPT, GPTConfig
from helpers.gpt.pretrained import validation_loss
from helpers.measure import bench, protocol
from helpers.measure.params import positive


def random_model(preset: str, dtype: torch.dtype, device: str, **overrides) -> GPT:
    """An untrained course GPT of `preset` in `dtype` on `device` (speed does not depend on training)."""
    torch.manual_seed(0)
    with torch.device(device):  # built where it runs: a 1.3B model initialised on a CPU takes long
        model = GPT(GPTConfig.preset(preset, **overrides))
    return model.to(dtype=dtype).eval()


def decode_case(model: GPT, context: int, batch: int, name: str) -> tuple:
    """(step closure, row without its timings) for one decode step of `batch` sequences at `context` tokens."""
    p, cfg = first_parameter(model), model.config
    kv = kv_bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, p.element_size())
    fn = decode_step_fn(model, filled_cache(model, batch, context), batch)
    nbytes = decode_step_bytes(model) + batch * (context + 1) * kv
    flops = counted_flops(fn)
    return fn, {"model": name, "params_m": sum(q.numel() for q in model.parameters()) / 1e6, "batch": batch,
                "context": context, "bytes": nbytes, "flops": flops, "intensity": flops / nbytes}


def _rates(row: dict, t: bench.Timing) -> dict:
    return timed({**row, "tokens_per_s": row["batch"] / t.median, "gbps": row["bytes"] / t.median / 1e9,
                  "tflops": row["flops"] / t.median / 1e12}, t)


def bandwidth_row(model: GPT, context: int, batch: int, reps: int, name: str = "",
                  budget_s: float = SMOKE_BUDGET_S) -> dict:
    """One decode step of `batch` sequences at `context` cached tokens, timed by the protocol: seconds
    (median, quartiles, IQR spread, samples), tokens/s, bytes read (weights once + every sequence's K/V),
    achieved GB/s, counted FLOPs and FLOP/byte."""
    fn, row = decode_case(model, context, batch, name)
    with torch.no_grad():
        return _rates(row, protocol.measure(fn, device=first_parameter(model).device.type, min_reps=reps,
                                            max_reps=max(30, 2 * reps), budget_s=budget_s))


def bandwidth_rows(cases: list[tuple[str, GPT, int, int]], reps: int, interleave: bool,
                   budget_s: float = SMOKE_BUDGET_S) -> list[dict]:
    """`bandwidth_row` for each (name, model, context, batch). With `interleave` (for a CPU shared with other
    work) every case is set up first and all are compared by the protocol in interleaved rounds, so a burst of
    other work slows all alike; otherwise one after another, each case's cache freed before the next (for
    large models on a GPU)."""
    if not interleave:
        return [bandwidth_row(m, ctx, b, reps, name, budget_s) for name, m, ctx, b in cases]
    built = [decode_case(m, ctx, b, name) for name, m, ctx, b in cases]
    with torch.no_grad():
        c = compare({i: fn for i, (fn, _) in enumerate(built)}, first_parameter(cases[0][1]).device.type, reps, budget_s)
    return [_rates(row, c[i]) for i, (_, row) in enumerate(built)]


def decode_sweep(models: dict[str, GPT], context: int, batches: list[int], reps: int, interleave: bool,
                 budget_s: float = SMOKE_BUDGET_S) -> tuple[list[dict], list[dict]]:
    """Batch-1 decode of every model in `models` and the last model at every batch of `batches`, each case
    measured once (`bandwidth_rows`): returns (batch-1 rows, one per model, in order; the last model's rows,
    one per batch). The last model's batch-1 case is one measurement, the same row object in both lists, so
    the bandwidth table and the batch table cannot quote two different numbers for it. Context is capped at
    each model's seq_len - 2."""
    names = list(models)
    last = names[-1]
    cases = [(n, models[n], min(context, models[n].config.seq_len - 2), 1) for n in names]
    extra = [(last, models[last], cases[-1][2], b) for b in batches if b != 1]
    rows = bandwidth_rows(cases + extra, reps, interleave, budget_s)
    bw, rest = rows[:len(cases)], iter(rows[len(cases):])
    return bw, [bw[-1] if b == 1 else next(rest) for b in batches]


# ---------------------------------------------------------------- attention variants


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
    p = first_parameter(low)
    cache = LatentKVCache(low, 1, context + 1, dtype=p.dtype, device=p.device)
    with torch.no_grad():
        low(random_tokens(1, context, p.device), cache=cache)
    return rewound_step(low, cache, random_tokens(1, 1, p.device, 1)), cache


def variant_speeds(models: dict[str, GPT], latent: tuple[str, GPT] | None, context: int, reps: int,
                   budget_s: float = SMOKE_BUDGET_S) -> list[dict]:
    """Batch-1 decode at `context` cached tokens for each named model (contiguous KV cache) and, when `latent`
    is (name, factorised model), through a LatentKVCache. Every case is set up first and all are compared
    by the protocol in interleaved rounds, so other work on the machine slows them alike.
    Returns per case `timed`'s keys, "variant" and "kv_share" (the K/V's share of the bytes a step reads;
    None for the latent)."""
    positive("reps", reps)
    fns, shares = {}, {}
    for name, m in models.items():
        fn, row = decode_case(m, context, 1, name)
        fns[name], shares[name] = fn, 1 - decode_step_bytes(m) / row["bytes"]
    if latent is not None:
        fns[latent[0]], _ = _latent_step(latent[1], context)
        shares[latent[0]] = None
    dev = first_parameter(next(iter(models.values())) if models else latent[1]).device.type
    with torch.no_grad():
        c = compare(fns, dev, reps, budget_s)
    return [timed({"variant": k, "kv_share": shares[k]}, c[k]) for k in fns]


# ---------------------------------------------------------------- compiled decode


def compiled_decode(model: GPT, context: int, reps: int, mode: str = "reduce-overhead") -> dict:
    """CUDA only: batch-1 decode at `context` tokens, eager KVCache vs torch.compile(static_step) with a
    StaticKVCache (`mode` "reduce-overhead" adds CUDA graphs; `decode_compile_options` says what else is
    set). Returns seconds (the compiled step's median, q25 and q75) and bytes read per token."""
    options = decode_compile_options(mode)
    p = first_parameter(model)
    cfg = model.config
    static = StaticKVCache(cfg, 1, context + 1, dtype=p.dtype, device=p.device)
    with torch.no_grad():
        model(random_tokens(1, context, p.device), cache=static)  # prefill through the same buffers
    tok = random_tokens(1, 1, p.device, 1)
    step = torch.compile(static_step, fullgraph=True, options=options)

    def run():
        static.pos.fill_(context)
        torch.compiler.cudagraph_mark_step_begin()
        return step(model, tok, static).clone()
    with torch.no_grad():
        t = protocol.measure(run, device="cuda", min_reps=reps, max_reps=max(30, 2 * reps), budget_s=FULL_BUDGET_S)
    eager = bandwidth_row(model, context, 1, reps)
    nbytes = decode_step_bytes(model) + (context + 1) * kv_bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim,
                                                                       p.element_size())
    return {"eager_s": eager["seconds"], "compiled_s": t.median, "compiled_spread": t.spread, "bytes": nbytes,
            "compiled_q25": t.q25, "compiled_q75": t.q75,
            "compiled_gbps": nbytes / t.median / 1e9, "eager_gbps": eager["gbps"], "mode": mode}
