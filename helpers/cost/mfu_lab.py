"""Notebook 02's lab: its parameters, timed training steps and sub-blocks, the FLOPs panel, figures, verdicts.

The FLOP counts and the MFU arithmetic are in `helpers.cost.flops` and `helpers.cost.mfu`; this
module puts time next to them. The timed path may use a faster kernel (SDPA, flash on a GPU) than
the one that is counted; the FLOPs credited to it stay the `transformer_flops` count.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Callable, Sequence

import torch

from helpers.cost.flops import matmul_params, six_nd, transformer_flops
from helpers.cost.mfu import (GAP_BAND, GAP_CLAIM, SUBLAYERS, gap_claimed, intensity_bounds, judged_point,
                              per_token_breakdown, sublayer_flops, withheld as mfu_withheld)
from helpers.gpt.model import GPT, PRESETS, Block, GPTConfig, resolve_attention
from helpers.measure import claims, params
from helpers.measure.bench import benchmark, benchmark_interleaved, quartiles
from helpers.measure.memory import release_memory
from helpers.show import plots
from helpers.show.widgets import progress


def resolve_parameters(S: params.Setup, *, MODELS, SEQ_LEN, BATCH_SIZES, SUB_PRESET, SUB_SEQ_LENS, SUB_BATCH_SIZES,
                       SUB_PASS, REPS, ASSUMED_MFU, N_GPUS) -> dict:
    """Notebook 02's parameters, validated at once and with the profile's defaults filled in: {name: value}
    (the batch sizes and sequence lengths sorted). Raises ValueError naming the first bad parameter;
    ASSUMED_MFU must be a float in (0, 1]."""
    in_presets = lambda name, v: params.choices(name, v, PRESETS)  # noqa: E731
    R = S.resolve
    out = {"MODELS": R("MODELS", MODELS, smoke=["tiny", "small10m"], full=["small10m", "gpt2", "gpt2-medium"],
                       check=in_presets),
           "SEQ_LEN": R("SEQ_LEN", SEQ_LEN, smoke=64, full=1024, check=params.positive),
           "BATCH_SIZES": sorted(R("BATCH_SIZES", BATCH_SIZES, smoke=[1, 2, 4], full=[8, 16, 32], check=params.positives)),
           "SUB_PRESET": R("SUB_PRESET", SUB_PRESET, smoke="small10m", full="gpt2-medium",
                           check=lambda name, v: params.choose(name, v, PRESETS)),
           "SUB_SEQ_LENS": sorted(R("SUB_SEQ_LENS", SUB_SEQ_LENS, smoke=[64, 128, 256, 512],
                                    full=[256, 512, 1024, 2048, 4096], check=params.positives)),
           "SUB_BATCH_SIZES": sorted(R("SUB_BATCH_SIZES", SUB_BATCH_SIZES, smoke=[1, 2], full=[1, 8, 32],
                                       check=params.positives)),
           "SUB_PASS": params.choose("SUB_PASS", SUB_PASS, ("train", "forward")),
           "REPS": R("REPS", REPS, smoke=5, full=10, check=params.positive)}
    params.positive("ASSUMED_MFU", ASSUMED_MFU, float)
    if not ASSUMED_MFU <= 1:  # NaN too
        raise ValueError(f"ASSUMED_MFU={ASSUMED_MFU!r} must be in (0, 1]")
    return {**out, "ASSUMED_MFU": ASSUMED_MFU, "N_GPUS": params.positive("N_GPUS", N_GPUS)}


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
    return {name: {"seconds": t.median, "spread": t.spread, "q25": t.q25, "q75": t.q75, "flops": counted[name],
                   "tflops": counted[name] / t.median / 1e12, "samples": t.samples} for name, t in timings.items()}


def efficiency_ratio(result: dict[str, dict], numerator: str = "mlp", denominator: str = "attention") -> float:
    """Median over interleaved repetitions of (numerator TFLOP/s) / (denominator TFLOP/s)."""
    return ratio_quartiles(result, numerator, denominator)[1]


def ratio_quartiles(result: dict[str, dict], numerator: str = "mlp",
                    denominator: str = "attention") -> tuple[float, float, float]:
    """(25th percentile, median, 75th percentile) of the per-repetition efficiency ratios."""
    n, d = result[numerator], result[denominator]
    ratios = [(n["flops"] / tn) / (d["flops"] / td) for tn, td in zip(n["samples"], d["samples"])]
    med, q25, q75 = quartiles(ratios)
    return q25, med, q75


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
            "q25": t.q25, "q75": t.q75,
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


# ---------------------------------------------------------------- instructor panel

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


# ---------------------------------------------------------------- sentences generated from a run's numbers

def over_ceiling_note(fractions: dict[str, float], ceiling_source: str) -> str:
    """'' when every fraction is at most 1, else a sentence calling the ceiling into question."""
    over = {k: v for k, v in fractions.items() if v is not None and v > 1}
    if not over:
        return ""
    worst = max(over, key=over.get)
    return (f"CEILING PROBLEM: {len(over)} measurement(s) exceed 100% of the measured ceiling (worst: {worst} at "
            f"{over[worst]:.0%}), which a ceiling must never allow. The ceiling ({ceiling_source}) was measured "
            "at other sizes or under other load than these points, so it underestimates this device: read every "
            "fraction here as relative, and re-measure the ceiling on an idle machine at the model's own shapes.")


def pct(fraction: float | None) -> str:
    """A fraction as a percentage, flagged with '(!)' above 100% (see `over_ceiling_note`); "n/a" for None (withheld)."""
    return "n/a" if fraction is None else f"{fraction:.0%}" + (" (!)" if fraction > 1 else "")


def projection_takeaway(config: GPTConfig, points: Sequence[dict], backward: bool) -> str:
    """How much of the 'attention half' is projections, by counted FLOPs and by measured time.

    `points` are the sweep's rows with "B", "T", "attention_seconds" and "attention_core_seconds".
    """
    counts = [sublayer_flops(config, p["B"], p["T"], backward=backward) for p in points]
    shares = [1 - c["attention_core"] / c["attention"] for c in counts]
    times = [p["attention_core_seconds"] / p["attention_seconds"] for p in points]
    text = (f"At these shapes (d={config.d_model}, T={min(p['T'] for p in points)}–{max(p['T'] for p in points)}) "
            f"the q/kv/output projections are {min(shares):.0%}–{max(shares):.0%} of the attention half's FLOPs, "
            f"so the scores-softmax-values core that the claim is about is only {1 - max(shares):.0%}–"
            f"{1 - min(shares):.0%} of them; timed alone, the core took {min(times):.0%}–{max(times):.0%} of the "
            "attention half's time.")
    if min(shares) > 0.5:
        text += (" The attention half measured here is therefore mostly matmuls like the MLP's, and its efficiency "
                 "says little about the core")
        text += (f"; the core passes half of the attention FLOPs only beyond T = {2 * config.d_model} (2d, for "
                 "MHA)." if config.n_kv_head == config.n_head else ".")
    return text


def roofline_takeaway(ridge: float, config: GPTConfig, points: Sequence[dict], bytes_per_element: int) -> str:
    """Where the sweep's parts sit against this device's ridge point (FLOP/B), generated from the numbers."""
    smallest = min(points, key=lambda p: (p["T"], p["B"]))
    b = intensity_bounds(config, smallest["B"], smallest["T"], bytes_per_element)
    lo, hi = b["attention_core"]
    gemm = min(b["q_proj"], b["mlp_up"])
    head = (f"This device's ridge point is {ridge:.3g} FLOP/B (measured ceiling / measured bandwidth). At the "
            f"sweep's smallest point (B={smallest['B']}, T={smallest['T']}) the projection and MLP matmuls reach at "
            f"least {gemm:.3g} FLOP/B and the attention core {lo:.3g} (every intermediate in memory) to "
            f"{hi:.3g} (fused, compulsory traffic only) FLOP/B.")
    if lo > ridge and gemm > ridge:
        return head + (" Every part is right of the ridge even in the worst byte model, so nothing in this sweep is "
                       "memory-bound on this device: the source's mechanism (attention limited by memory bandwidth) "
                       "cannot show here, and differences between the halves come from how well each kernel uses "
                       "the compute units.")
    if hi < ridge:
        return head + " Even the fused core is left of the ridge: attention is memory-bound here, as the claim says."
    return head + (" The ridge lies between the core's two byte models: whether the core is memory-bound here depends "
                   "on how much of the T x T scores its kernel keeps in cache; the matmuls are "
                   + ("compute-bound." if gemm > ridge else "memory-bound too."))


def attention_vs_mlp_verdict(points: Sequence[dict], batch_sizes: Sequence[int], seq_lens: Sequence[int],
                             ceiling: float, *, ceiling_source: str = "measured", claim: float = GAP_CLAIM,
                             band: float = GAP_BAND) -> tuple[list[str], dict]:
    """Bullets on the attention-vs-MLP sweep, generated from its rows, and a summary for `record`.

    `points`: rows with "B", "T", "ratio", "ratio_q25", "ratio_q75", "<part>_tflops" and "<part>_spread" for
    attention, attention_core and mlp; `ceiling` in TFLOP/s. Each shape is judged by the course's verdict rule
    against claim / band to claim * band (`mfu.judged_point`); the summary names the shape the claim is judged at
    ("judged") and how many shapes got each verdict ("by_shape"). The bullets quote those verdicts, never their own.
    """
    ratios = [p["ratio"] for p in points]
    attn = [p["attention_tflops"] / ceiling for p in points]
    mlp_ = [p["mlp_tflops"] / ceiling for p in points]
    spread = sorted(max(p["attention_spread"], p["mlp_spread"]) for p in points)[len(points) // 2]
    lo, hi = min(ratios), max(ratios)
    claimed = gap_claimed(claim, band)
    judged, by_shape = judged_point(list(points), claimed)
    lines = [f"attention reached {pct(min(attn))}–{pct(max(attn))} of the measured ceiling, the MLP "
             f"{pct(min(mlp_))}–{pct(max(mlp_))} (the claim: ~45% and ~75–80%).",
             f"MLP/attention efficiency ratio: {lo:.2f}–{hi:.2f} over B={list(batch_sizes)}, T={list(seq_lens)} "
             f"(the claim: ~{claim} everywhere); median timing spread (IQR) {spread:.0%}."]
    trends = {}
    for B in batch_sizes:
        rs = [p for p in points if p["B"] == B]
        change = rs[-1]["ratio"] / rs[0]["ratio"]
        trends[B] = "grows" if change > band else "shrinks" if change < 1 / band else f"stays within ±{band - 1:.0%}"
        core = rs[-1]["attention_core_tflops"] / rs[0]["attention_core_tflops"]
        lines.append(f"B={B}: from T={rs[0]['T']} to T={rs[-1]['T']} the ratio {trends[B]} ({rs[0]['ratio']:.2f} -> "
                     f"{rs[-1]['ratio']:.2f}); the attention core's TFLOP/s changes {core:.2f}x")
    mid = statistics.median(ratios)
    how = ("more efficiently than" if mid > band else "less efficiently than" if mid < 1 / band
           else f"within ±{band - 1:.0%} of")
    lines.append(f"median ratio {mid:.2f}: per counted FLOP, the MLP half ran {how} the attention half on this device.")
    counts = ", ".join(f"{n} {v}" for v, n in by_shape.items())
    lines.append(f"each shape's ratio and its IQR against the claimed {claimed[0]:.2f}–{claimed[1]:.2f}x (widened by "
                 f"{claims.CLOSE:.0%} at each end), by the course's verdict rule: {counts} (of {len(points)}); the claim "
                 f"of one universal gap is judged at B={judged['B']}, T={judged['T']} ({judged['ratio']:.2f}x, IQR "
                 f"{judged['ratio_q25']:.2f}–{judged['ratio_q75']:.2f}), the shape farthest from it"
                 + (" among those the rule finds against it" if by_shape.get("contradicted") else "") + ".")
    if spread > band - 1:
        lines.append(f"caution: timings were noisy on this machine (median IQR {spread:.0%}), so ratio differences "
                     "smaller than that are not evidence of anything")
    note = over_ceiling_note({f"{k} B={p['B']} T={p['T']}": p[f"{k}_tflops"] / ceiling
                              for p in points for k in ("attention", "mlp")}, ceiling_source)
    if note:
        lines.append(note)
    summary = {"ratio_min": lo, "ratio_max": hi, "ratio_median": mid, "attention_fraction_max": max(attn),
               "mlp_fraction_max": max(mlp_), "trend_with_T": {str(b): t for b, t in trends.items()},
               "median_spread": spread, "claimed": list(claimed), "by_shape": by_shape,  # the median shape's IQR, below:
               "ratio_iqr_median": [statistics.median(p[k] for p in points) for k in ("ratio_q25", "ratio_q75")],
               "judged": {k: judged[k] for k in ("B", "T", "ratio", "ratio_q25", "ratio_q75")}}
    return lines, summary


def formats_sentence(dtype: str, device: str) -> str:
    """One sentence on the formats MFU may be computed for here: the steps' `dtype`, and which 16-bit formats
    `device` runs natively or emulates (`hardware.emulated`); MFU is never computed for an emulated one."""
    emulated = [d for d in ("bf16", "fp16") if mfu_withheld(d, device)]
    native = [d for d in ("bf16", "fp16") if d not in emulated]
    here = (f"this run's {dtype} is emulated here, so its MFU is withheld" if dtype in emulated else
            f"this run times {dtype}, which runs natively here")
    return (f"MFU is never computed for a format this {'CPU' if str(device) == 'cpu' else 'GPU'} emulates (its time "
            f"measures the emulation): here {' and '.join(native) or 'no 16-bit format'} "
            f"{'is' if len(native) == 1 else 'are'} native and {' and '.join(emulated) or 'none'} emulated; {here}.")


def extremes_sentence(steps: Sequence[dict]) -> str:
    """Which timed step reached the highest and the lowest MFU, said only as far as the IQRs allow: each is named
    when its MFU range (`mfu.step_fractions`' lo-hi) clears every other step's, else the steps whose ranges reach it
    are named as tied."""
    rows = [r for r in steps if r.get("mfu_ceiling") is not None]
    if not rows:
        return "no MFU was computed for these steps"
    name = lambda r: f"{r['model']} B={r['batch_size']}"  # noqa: E731
    best = max(rows, key=lambda r: r["mfu_ceiling"])
    worst = min(rows, key=lambda r: r["mfu_ceiling"])
    tied = [r for r in rows if r is not best and r["mfu_ceiling_hi"] >= best["mfu_ceiling_lo"]]
    span = lambda r: f"{pct(r['mfu_ceiling'])} (IQR {r['mfu_ceiling_lo']:.0%}–{r['mfu_ceiling_hi']:.0%})"  # noqa: E731
    head = (f"highest MFU: {name(best)} at {span(best)} of the measured ceiling, clear of every other step's IQR"
            if not tied else f"this run cannot tell which step reached the highest MFU: {name(best)} at {span(best)} "
            f"and {', '.join(name(r) for r in tied)}, whose IQRs reach it")
    low_tied = [r for r in rows if r is not worst and r["mfu_ceiling_lo"] <= worst["mfu_ceiling_hi"]]
    return head + (f"; lowest: {name(worst)} at {span(worst)}" if not low_tied else
                   f"; the lowest cannot be told apart: {name(worst)} at {span(worst)} and "
                   f"{', '.join(name(r) for r in low_tied)}")


# ---------------------------------------------------------------- figures and profiles

def plot_fractions(x: Sequence[float], series: dict[str, tuple[Sequence, Sequence, Sequence]], *, xlabel: str,
                   ylabel: str, title: str, hlines: dict[str, float] | None = None, logx: bool = True, ax=None):
    """Lines with IQR error bars: series {label: (medians, q25s, q75s)} (None entries skipped).

    The y-axis starts at 0 (no truncated axis magnifying a few percent) and the legend sits outside
    the axes, so it never covers data.
    """
    if ax is None:
        fig, ax = plots.figure()
    else:
        fig = ax.figure
    for i, (label, (ys, los, his)) in enumerate(series.items()):
        pts = [(xi, y, lo, hi) for xi, y, lo, hi in zip(x, ys, los, his) if y is not None]
        if not pts:
            continue
        xs, ys_, lo_, hi_ = zip(*pts)
        err = [[max(y - lo, 0) for y, lo in zip(ys_, lo_)], [max(hi - y, 0) for y, hi in zip(ys_, hi_)]]
        ax.errorbar(xs, ys_, yerr=err, marker="o", capsize=3, label=label, color=plots.COLORS[i % len(plots.COLORS)])
    for i, (label, y) in enumerate((hlines or {}).items()):
        ax.axhline(y, ls="--", lw=1, color=plots.COLORS[-1 - i % 3], label=label)
    if logx:
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(x), [str(v) for v in x])
    ax.set_ylim(bottom=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    return fig


def kernel_share(rows: Sequence[tuple], words: Sequence[str] = ("mm", "attention", "linear", "conv")) -> float:
    """Share of profiled self time in matmul-like ops: `rows` are `profiling.Profile.rows`
    (op, ms, calls, share); an op counts when its name contains one of `words`."""
    return sum(share for name, _, _, share in rows if any(w in name.rsplit("::", 1)[-1] for w in words))
