"""Notebook 10's decode-speed measurements on the KV cache: batch-1 decode as a bandwidth problem and batch size
against tokens/s, the attention variants (MHA, GQA, MQA, an MLA-style latent) timed, compiled decode on a
static cache, and GQA and MQA made from the trained MHA model (`helpers.decode.gqa_uptrain`) by held-out loss,
before and after uptraining, beside an MHA control uptrained alike (`gqa_sweep`, its sentences and ledger row).

Timed by the course's protocol through `helpers.decode.kv_cache_lab` (`compare`, `timed`), bytes counted by
`helpers.gpt.footprint.decode_step_bytes` (the weights once, one position row, every sequence's K/V), FLOPs by
torch's FlopCounterMode (`kv_cache_lab.counted_flops`). The caches are `helpers.gpt.generation.KVCache` and
`helpers.decode.kv_cache`'s (`StaticKVCache`, `LatentKVCache`).
"""
from __future__ import annotations

import torch

from helpers.decode.gqa_uptrain import PAPER_SHARE, convert, uptrain
from helpers.decode.kv_cache import (LatentKVCache, StaticKVCache, decode_compile_options, factorise_kv,
                                     kv_bytes_per_token, static_step)
from helpers.decode.kv_cache_lab import (FULL_BUDGET_S, SMOKE_BUDGET_S, compare, counted_flops, decode_step_fn,
                                         filled_cache, first_parameter, random_tokens, timed)
from helpers.gpt import heldout
from helpers.gpt.footprint import decode_step_bytes
from helpers.gpt.generation import rewound_step
from helpers.gpt.model import GPT, GPTConfig
from helpers.gpt.pretrained import validation_loss
from helpers.measure import bench, protocol
from helpers.measure.params import positive
from helpers.show.units import percent


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
    """`bandwidth_row` for each (name, model, context, batch), in the order given. With `interleave` (for a CPU
    shared with other work) the cases of each model are set up first and compared by the protocol in interleaved
    rounds, so a burst of other work slows them alike; each model gets a comparison of its own, so that every
    step of a model follows steps of that model, as it does in generation, never a larger model's step.
    Otherwise one after another, each case's cache freed before the next (for large models on a GPU)."""
    if not interleave:
        return [bandwidth_row(m, ctx, b, reps, name, budget_s) for name, m, ctx, b in cases]
    rows: list[dict] = [{} for _ in cases]
    for model in {id(m): m for _, m, _, _ in cases}.values():  # each model once, in the order it first appears
        built = {i: decode_case(m, ctx, b, name) for i, (name, m, ctx, b) in enumerate(cases) if m is model}
        with torch.no_grad():
            c = compare({i: fn for i, (fn, _) in built.items()}, first_parameter(model).device.type, reps, budget_s)
        for i, (_, row) in built.items():
            rows[i] = _rates(row, c[i])
    return rows


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


# ---------------------------------------------------------------- GQA and MQA uptrained from the MHA model


def gqa_sweep(model: GPT, kv_heads: list[int], schedule: dict, val_tokens: torch.Tensor, val_batches: int,
              val_batch: int, *, seed: int = 0, convert_fn=convert) -> dict:
    """For each number of kv heads in `kv_heads` (each a divisor of n_head): the trained multi-head `model`
    mean-pooled to that many kv heads (`gqa_uptrain.convert`; n_head itself is the model unchanged) and the same
    model uptrained (`gqa_uptrain.uptrain` with `schedule`, from `uptrain_schedule`, and `seed`, the same batches for every
    variant: at n_head this is the MHA control), each scored on the same held-out windows
    (`heldout.window_losses`, `val_batches` batches of `val_batch`). Returns {"rows": one dict per variant (kv
    heads, name, bytes per token of its cache in the model's dtype (`kv_bytes_per_token`), pooled and
    uptrained validation loss, nats/byte), "windows": {kv heads: (pooled, uptrained) per-window losses},
    "steps", "batch": the schedule's}. Rows in the order of `kv_heads`; raises ValueError when n_head is not among them (no control).
    `convert_fn(model, n_kv_head)` makes each variant: the notebook passes the `convert` it defines on stage."""
    cfg = model.config
    if cfg.n_head not in kv_heads:
        raise ValueError(f"kv_heads={kv_heads} must include n_head={cfg.n_head}: the multi-head model uptrained "
                         f"alike is the control every variant is compared with")
    size = first_parameter(model).element_size()
    rows, windows = [], {}
    for kv in kv_heads:
        pooled = convert_fn(model, kv)
        up = uptrain(pooled, schedule, seed=seed)
        w = tuple(heldout.window_losses(m, val_tokens, batches=val_batches, batch=val_batch) for m in (pooled, up))
        windows[kv] = w
        name = "MHA" if kv == cfg.n_head else "MQA" if kv == 1 else "GQA"
        rows.append({"kv heads": kv, "variant": f"{name} ({kv} kv head{'s' if kv > 1 else ''})",
                     "bytes per token": kv_bytes_per_token(cfg.n_layer, kv, cfg.head_dim, size),
                     "pooled": float(w[0].mean()), "uptrained": float(w[1].mean())})
    return {"rows": rows, "windows": windows, "steps": schedule["steps"], "batch": schedule["batch"]}


def gqa_recovery(sweep: dict) -> dict:
    """What pooling and uptraining did, from `gqa_sweep`'s per-window losses (nats/byte), so that the sentences,
    the takeaway and the ledger quote one computation. n_head is the sweep's largest kv-head count (every count
    divides it and it is always swept). Returns {"control": {"before": the trained MHA's loss, "after": the MHA
    model's after the same uptraining, "change": after - before, "se": its paired standard error, "separated":
    whether the change exceeds `heldout.NOISE_K` of them}, and per GQA/MQA kv-head count {"cost": pooled loss minus
    the trained MHA's, "left": uptrained loss minus the control's, "closed": 1 - left / cost, the share of
    pooling's cost uptraining won back against the control, or None where pooling's cost is not a rise beyond
    the noise}}."""
    windows = sweep["windows"]
    n_head = max(windows)
    base, control = windows[n_head]
    change, se = heldout.loss_gap(control, base)
    out = {"control": {"before": float(base.mean()), "after": float(control.mean()), "change": change, "se": se,
                       "separated": heldout.gap_separated(control, base)}}
    for kv, (pooled, up) in windows.items():
        if kv == n_head:
            continue
        cost, left = float((pooled - base).mean()), float((up - control).mean())
        closed = 1 - left / cost if heldout.gap_separated(pooled, base) and cost > 0 else None
        out[kv] = {"cost": cost, "left": left, "closed": closed}
    return out


def control_change(control: dict) -> str:
    """The MHA control's change under uptraining in words, from `gqa_recovery(...)["control"]`: "rose from a to b
    nats/byte (+d)", "fell ...", or "did not move beyond the noise (a to b, +d)"."""
    a, b, d = control["before"], control["after"], control["change"]
    if not control["separated"]:
        return f"did not move beyond the noise ({a:.3f} to {b:.3f} nats/byte, {d:+.4f})"
    return f"{'rose' if d > 0 else 'fell'} from {a:.3f} to {b:.3f} nats/byte ({d:+.4f})"


def gqa_sentences(sweep: dict, n_head: int, share: float) -> list[str]:
    """Sentences on `gqa_sweep`'s result: what uptraining did to the MHA model itself (the control: its loss's
    measured direction and size, and that this change is the yardstick the variants are set against), then for
    each GQA/MQA variant what pooling cost against the trained MHA model, where uptraining left it against the
    control uptrained alike, and the share of the gap it closed (`gqa_recovery`). Every comparison is
    `heldout.compare_losses` (a gap within twice its standard error: cannot be told apart). `share`: the
    uptraining steps as a share of the pre-training's."""
    rows = {r["kv heads"]: r for r in sweep["rows"]}
    base, control = sweep["windows"][n_head]
    rec = gqa_recovery(sweep)
    c = rec["control"]
    steps = f"{sweep['steps']} uptraining steps ({percent(share)} of the pre-training's)"
    why = ""
    if c["separated"] and c["change"] > 0:
        why = (" Uptraining is not free for a model that had settled: AdamW restarts with empty moment estimates, "
               f"warms up again and sees new batches of {sweep['batch']} windows; this run does not tell these apart.")
    out = [f"Control, MHA after {steps}: its loss {control_change(c)}; {heldout.yardstick(control, base)}. "
           "That change is what the short uptraining does to a model by itself, with nothing pooled: GQA and MQA "
           "after uptraining are set against this control, not against the trained model, so it is counted neither "
           "as their cost nor as their recovery." + why]
    for kv, (pooled, up) in sweep["windows"].items():
        if kv == n_head:
            continue
        name = rows[kv]["variant"]
        text = (f"{name}, {rows[n_head]['bytes per token'] / rows[kv]['bytes per token']:.0f}x fewer cache bytes: pooled, "
                + heldout.compare_losses(f"pooled {name.split()[0]}", pooled, "the trained MHA", base)
                + f"; after {sweep['steps']} steps, "
                + heldout.compare_losses(f"uptrained {name.split()[0]}", up, "the MHA control", control))
        if rec[kv]["closed"] is not None:
            text += (f"; uptraining closed {percent(rec[kv]['closed'])} of the {rec[kv]['cost']:.3f} nats/byte gap "
                     "pooling opened (measured against the control)")
        out.append(text + ".")
    return out


def gqa_takeaway(sweep: dict, share: float, claim_row: dict) -> str:
    """One closing line on `gqa_sweep`: the MHA control's change under the uptraining (the yardstick), then each
    variant's cache bytes, what pooling cost, the share of it uptraining closed (`gqa_recovery`) and its held-out
    loss after uptraining beside the control's, the uptraining's length, and the ledger's verdict (`claim_row`, as
    `claims.verdict` recorded it)."""
    rows = sweep["rows"]
    control_row = max(rows, key=lambda r: r["kv heads"])
    rec = gqa_recovery(sweep)
    parts = []
    for r in rows:
        if r is control_row:
            continue
        got = rec[r["kv heads"]]
        closed = (f"uptraining closed {percent(got['closed'])} of it" if got["closed"] is not None else
                  "not a rise beyond the noise, so no share closed is given")
        parts.append(f"{r['variant'].split(' (')[0]} with {r['kv heads']} kv head{'s' * (r['kv heads'] != 1)} "
                     f"({r['bytes per token']} B/token): pooling cost {got['cost']:.3f} nats/byte, {closed}, loss "
                     f"{r['uptrained']:.3f}, {got['left']:+.3f} against the control")
    verdict = claim_row["verdict"] + (f" ({claim_row['reason'].split(';')[0]})" if claim_row.get("reason") else "")
    return (f"- GQA and MQA from the trained MHA model, key and value heads mean-pooled and uptrained {sweep['steps']} "
            f"steps ({percent(share)} of the pre-training's). The MHA control ({control_row['bytes per token']} B/token), "
            f"uptrained alike: its loss {control_change(rec['control'])}, what the uptraining alone does, the yardstick "
            "for the others. " + "; ".join(parts) + f". 'GQA balances quality and efficiency': {verdict}.")


def gqa_claim(sweep: dict, n_head: int, share: float) -> dict:
    """`claims.verdict`'s keyword arguments for the second source text's section 4 ("GQA balances quality and
    efficiency"), judged on the GQA variant with the most kv heads below n_head: its uptrained held-out loss over
    the MHA control's (uptrained alike) as a ratio, with bounds from the paired per-window gap plus and minus
    `heldout.NOISE_K` standard errors, against "at most 1x" (a ceiling: the whole range above it contradicts).
    "not testable" when the sweep has no GQA variant (n_head has no divisor between 1 and itself there). A
    `share` below the paper's (PAPER_SHARE) is "not testable" too, with the value still recorded: so short an
    uptraining is not the recipe the claim rests on, and a loss it has not yet won back would read as a verdict."""
    base = {"notebook": "10", "source": "the second source text, section 4", "unit": "x", "claimed": (None, 1.0),
            "above": "contradicted",
            "claim": "GQA balances quality and efficiency: grouped kv heads keep multi-head attention's quality "
                     "(held-out loss no higher than MHA's) while caching n_head / n_kv_head times fewer bytes"}
    gqa = [r for r in sweep["rows"] if 1 < r["kv heads"] < n_head]
    if not gqa:
        why = f"this model's {n_head} query heads leave no GQA between MQA and MHA"
        return {**base, "measured": why, "verdict": "not testable", "reason": why}
    row = max(gqa, key=lambda r: r["kv heads"])
    _, control = sweep["windows"][n_head]
    gap, se = heldout.loss_gap(sweep["windows"][row["kv heads"]][1], control)
    ref = float(control.mean())
    lo, hi = (ref + gap - heldout.NOISE_K * se) / ref, (ref + gap + heldout.NOISE_K * se) / ref
    fewer = sweep["rows"][0]["bytes per token"] / row["bytes per token"] if sweep["rows"][0]["kv heads"] == n_head else None
    return {**base, "value": row["uptrained"] / ref, "spread": (lo, hi),
            "measured": f"uptrained {row['variant']} held-out loss {row['uptrained']:.4f} against the MHA control's "
                        f"{ref:.4f} nats/byte (both {sweep['steps']} uptraining steps of {sweep['batch']} windows, {percent(share)} "
                        f"of the pre-training's steps; "
                        f"pooled before uptraining {row['pooled']:.4f}): GQA's loss over the control's "
                        f"{row['uptrained'] / ref:.4f} ({lo:.4f}-{hi:.4f} from the paired gap +/- {heldout.NOISE_K:g} "
                        "standard errors; 1 is the control's quality, the claim asks for at most 1)"
                        + (f", caching {fewer:.0f}x fewer bytes per token" if fewer else ""),
            **({"reason": ""} if share >= PAPER_SHARE else
               {"verdict": "not testable",
                "reason": f"this run uptrained for {percent(share)} of the pre-training's steps, less than the paper's "
                          f"{percent(PAPER_SHARE)}, so it does not test the recipe the claim rests on (the full profile "
                          "uptrains for the paper's share)"})}


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
