"""Notebook 10's parameters (`resolve_parameters`) and measurements of one sequence's cache: decode with and
without a cache, and prefill against decode on the roofline; the helpers both KV labs time with.

Every headline here is timed by the course's protocol (`helpers.measure.protocol.compare`: warm-up until
steady, interleaved rounds until the variants separate, the budget runs out or `max_reps`), and counts FLOPs
with torch's FlopCounterMode (matmuls and attention, as torch counts them) and bytes by hand
(`helpers.gpt.footprint.decode_step_bytes` for the weights, stated in each docstring). The caches are
`helpers.gpt.generation.KVCache` and `helpers.decode.kv_cache`'s; decode as bandwidth, the attention variants
and compiled decode are `helpers.decode.kv_decode_lab`; the serving measurements are `helpers.decode.paged_lab`
and `helpers.decode.serving_lab`. `copy_fraction` and `decode_bandwidth_claim` give the summary's share of the
copy bandwidth and gpt-fast's 70% claim, judged on it.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from helpers.decode.kv_cache import budget_rows, kv_bytes_per_token, variant_configs
from helpers.gpt.footprint import decode_step_bytes
from helpers.gpt.generation import KVCache, rewound_step
from helpers.gpt.model import GPT, PRESETS, GPTConfig
from helpers.measure import bench, params, protocol
from helpers.measure.params import positive
from helpers.show import plots


SMOKE_BUDGET_S, FULL_BUDGET_S = 3.0, 10.0  # seconds of timed rounds per comparison after the minimum rounds


def random_tokens(B: int, T: int, device, seed: int = 0) -> torch.Tensor:
    """(B, T) int64 tokens drawn uniformly from 0-255 by a generator seeded with `seed`, on `device`."""
    return torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(seed)).to(device)


def first_parameter(model: nn.Module) -> torch.Tensor:
    """The model's first parameter: where its device and dtype are read from."""
    return next(model.parameters())


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
    p = first_parameter(model)
    cache = KVCache(model.config, batch, max_len or context + 1, dtype=p.dtype, device=p.device)
    with torch.no_grad():
        model(random_tokens(batch, context, p.device), cache=cache)
    return cache


def decode_step_fn(model: GPT, cache, batch: int):
    """A closure: one decode step of `batch` fixed random tokens at the cache's current length, rewound
    before every call so that every call measures the same position (`rewound_step`)."""
    return rewound_step(model, cache, random_tokens(batch, 1, first_parameter(model).device, 1))


def timed(row: dict, t: bench.Timing) -> dict:
    """`row` with a timing's median ("seconds"), quartiles, spread (IQR / median) and raw samples added: plain
    numbers, so that a record can hold it and `timing(row)` can rebuild the Timing."""
    return {**row, "seconds": t.median, "q25": t.q25, "q75": t.q75, "spread": t.spread, "samples": list(t.samples)}


def timing(row: dict) -> bench.Timing:
    """The bench.Timing a `timed` row holds (median, quartiles, samples)."""
    return bench.Timing(row["seconds"], row["q25"], row["q75"], list(row["samples"]))


def compare(fns: dict, device: str, reps: int, budget_s: float) -> protocol.Comparison:
    """`protocol.compare` with at least `reps` rounds, at most max(30, 2 * reps), `budget_s` seconds after them."""
    positive("reps", reps)
    return protocol.compare(fns, device=device, min_reps=reps, max_reps=max(30, 2 * reps), budget_s=budget_s)


def per_position(model: GPT, positions: list[int], reps: int, progress=iter,
                 budget_s: float = SMOKE_BUDGET_S) -> dict[str, list[bench.Timing]]:
    """The next token's time at each context length in `positions`: with a cache (one decode step, each position
    its own cache) and without (a forward over the whole context + 1 tokens). Every case is set up first and all
    are compared in one protocol run (`compare`, at least `reps` rounds, its order rotated each round), so that
    no position is timed first or alone under a spell of other work. Returns {"with cache": [Timing per
    position], "without cache": [...]}."""
    dev = first_parameter(model).device.type
    seq = random_tokens(1, max(positions) + 1, first_parameter(model).device)
    fns = {}
    for p in progress(positions):
        fns[f"with cache {p}"] = decode_step_fn(model, filled_cache(model, 1, p), 1)
        fns[f"without cache {p}"] = lambda p=p: model(seq[:, :p + 1])[0][:, -1]
    with torch.no_grad():
        c = compare(fns, dev, reps, budget_s)
    return {k: [c[f"{k} {p}"] for p in positions] for k in ("with cache", "without cache")}


def position_report(positions: list[int], timings: dict[str, list[bench.Timing]], title: str) -> dict:
    """Table rows, figure and sentences for `per_position`'s timings: per position the two medians with
    their IQR, the uncached / cached ratio with its IQR bounds and whether the run can rank them; the figure
    draws each median with its IQR as a band, so an unranked point shows as overlapping bands. Returns
    {"rows", "figure", "sentences", "ratio" (the last position's protocol.Ratio)}."""
    rows, sentences = [], []
    for p, a, b in zip(positions, timings["with cache"], timings["without cache"]):
        r = protocol.ratio(b, a)
        rows.append([p, str(a), str(b), str(r), "yes" if r.separated else "no: IQRs overlap"])
    fig = plots.sweep(positions, {k: [1e3 * t.median for t in v] for k, v in timings.items()},
                      xlabel="context length (tokens)", ylabel="ms for the next token (median, IQR band)", title=title)
    ax = fig.axes[0]
    for k, v in timings.items():
        ax.fill_between(positions, [1e3 * t.q25 for t in v], [1e3 * t.q75 for t in v], alpha=0.2)
    last = protocol.ratio(timings["without cache"][-1], timings["with cache"][-1])
    sentences.append(f"At {positions[-1]} tokens of context: " + protocol.rank_sentence(
        "the cached step", timings["with cache"][-1], "the uncached forward", timings["without cache"][-1],
        what="next-token time") + ".")
    unranked = [p for p, a, b in zip(positions, timings["with cache"], timings["without cache"])
                if not protocol.separated(a, b)]
    slower = [p for p, a, b in zip(positions, timings["with cache"], timings["without cache"])
              if protocol.separated(a, b) and a.median > b.median]
    if unranked:
        sentences.append(f"At {', '.join(map(str, unranked))} tokens the two IQRs overlap: this run cannot rank them "
                         f"there (a forward of a few tokens costs about one step).")
    if slower:
        sentences.append(f"At {', '.join(map(str, slower))} tokens the cached step was measurably slower: at so short a "
                         f"context a forward of a few tokens costs about one step, and the cached step pays its "
                         f"cache bookkeeping on top.")
    sentences += [growth_sentence(positions, timings), cached_sentence(positions, timings["with cache"])]
    return {"rows": rows, "figure": fig, "sentences": sentences, "ratio": last}


def growth_sentence(positions: list[int], timings: dict[str, list[bench.Timing]]) -> str:
    """What the per-position sweep shows about the uncached forward's growth with context, from its own
    numbers: the cost of generating n tokens without a cache is O(n^2) only once a forward's time grows
    with its length; while a fixed per-call cost dominates, that growth cannot show. The uncached time is
    said to grow when its last position's q25 is above its first position's q75 and it at least doubled."""
    a, b = timings["without cache"][0], timings["without cache"][-1]
    span = positions[-1] / positions[0]
    grew = b.q25 > a.q75 and b.median >= 2 * a.median
    head = (f"From {positions[0]} to {positions[-1]} tokens of context ({span:.0f}x), the uncached forward went from "
            f"{a} to {b}")
    if grew:
        return head + (f" ({b.median / a.median:.1f}x): each uncached token costs more the longer the context, so "
                       f"generating n tokens without a cache costs O(n^2) token-forwards.")
    return head + (": its time did not grow beyond the noise, because at these lengths a fixed per-call cost (Python, "
                   "kernel launches, the weights read once) dominates the work that grows with context; the O(n^2) "
                   "cost of generating without a cache only shows at longer contexts or larger models.")


def cached_sentence(positions: list[int], cached: list[bench.Timing]) -> str:
    """The cached step's time from the first to the last of `positions`, in words: longer or shorter only where
    the two IQRs are separated, else within the noise."""
    a, b = cached[0], cached[-1]
    head = f"The cached step took {a} at {positions[0]} tokens of context and {b} at {positions[-1]}"
    if not protocol.separated(a, b):
        return head + ": the IQRs overlap, so this run cannot tell whether the step grew with the cached keys it reads."
    if b.median > a.median:
        return head + (f" ({b.median / a.median:.2f}x): it grows with the cached keys and values it reads, far slower "
                       "than the uncached forward.")
    return head + (f" ({a.median / b.median:.2f}x shorter at the longer context, though it reads more keys there; every "
                   "position was timed in the same interleaved rounds, and this run does not say why).")


def prefill_decode(model: GPT, prompt_len: int, reps: int, budget_s: float = SMOKE_BUDGET_S) -> list[dict]:
    """Prefill of `prompt_len` tokens vs one decode step at that context, batch 1: counted FLOPs, minimum
    bytes (weights read once + K/V written for prefill; weights + K/V read + written for decode), the
    intensity (FLOP/byte), seconds (both compared by the protocol, interleaved; `timed`'s keys) and the
    achieved TFLOP/s and GB/s."""
    dev, p = first_parameter(model).device.type, first_parameter(model)
    cfg, el = model.config, p.element_size()
    kv_tok = kv_bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, el)
    toks = random_tokens(1, prompt_len, p.device)
    cache = KVCache(cfg, 1, prompt_len + 1, dtype=p.dtype, device=p.device)
    pre = rewound_step(model, cache, toks)  # the prompt, always from an empty cache
    pre()
    dec = decode_step_fn(model, cache, 1)
    cases = {"prefill": (pre, decode_step_bytes(model) + prompt_len * kv_tok),
             "decode": (dec, decode_step_bytes(model) + (prompt_len + 1) * kv_tok)}
    flops = {name: counted_flops(fn) for name, (fn, _) in cases.items()}
    with torch.no_grad():
        c = compare({name: fn for name, (fn, _) in cases.items()}, dev, reps, budget_s)
    rows = []
    for name, (_, nbytes) in cases.items():
        t = c[name]
        rows.append(timed({"phase": name, "tokens": prompt_len if name == "prefill" else 1, "flops": flops[name],
                           "bytes": nbytes, "intensity": flops[name] / nbytes,
                           "tflops": flops[name] / t.median / 1e12, "gbps": nbytes / t.median / 1e9}, t))
    return rows


RIDGE_MARGIN = 2.0  # a point within this factor of the ridge is placed on neither side (see roofline_sentence)


def roofline_sentence(points: list[dict], peak_tflops: float, bw_gbps: float, far: float = 0.1) -> str:
    """Where each measured point sits under the roofline, in words generated from the numbers.

    points: [{"phase", "intensity" (FLOP/byte), "tflops" (achieved at the median time)}], with "flops", "q25" and
    "q75" (seconds) where the time has an IQR; the roof at intensity I is min(peak, bw * I / 1000) TFLOP/s and
    the ridge is at peak * 1000 / bw FLOP/byte. A point is on the memory or the compute side only when its
    intensity lies more than RIDGE_MARGIN times below or above the ridge: the two ceilings are single measured
    numbers with no spread of their own, so a point nearer the ridge than that is said to be near it, side
    untold. A point is "memory-bound" or "compute-bound" only when even its IQR-bounded slowest rate reaches
    `far` of its roof; when even its fastest stays below half of `far`, neither roof sets its speed (a per-step
    overhead does) and the sentence says so; in between (a band, so that load moving a point a little cannot
    turn "bound" into "unbound" from one run to the next) this run cannot tell. Raises ValueError for a non-positive peak or
    bandwidth."""
    if not (peak_tflops > 0 and bw_gbps > 0):
        raise ValueError(f"peak_tflops={peak_tflops!r} and bw_gbps={bw_gbps!r} must be positive")
    ridge = peak_tflops * 1e3 / bw_gbps
    parts, far_below = [], []
    for p in points:
        roof = min(peak_tflops, bw_gbps * p["intensity"] / 1e3)
        frac = p["tflops"] / roof
        lo, hi = ((p["flops"] / p["q75"] / 1e12 / roof, p["flops"] / p["q25"] / 1e12 / roof)
                  if all(k in p for k in ("flops", "q25", "q75")) else (frac, frac))
        side = ("memory" if p["intensity"] * RIDGE_MARGIN < ridge else
                "compute" if p["intensity"] > RIDGE_MARGIN * ridge else None)
        reached = f"reached {frac:.0%} of its roof" + (f" (IQR-bounded {lo:.0%}-{hi:.0%})" if hi > lo else "")
        if side is None:
            parts.append(f"{p['phase']} ({p['intensity']:.2f} FLOP/byte) lies within {RIDGE_MARGIN:g}x of the ridge, "
                         f"so this run cannot tell which roof bounds it (measured ceilings carry no spread); it "
                         f"{reached}")
        elif lo >= far:
            parts.append(f"{p['phase']} ({p['intensity']:.2f} FLOP/byte) {reached} and is {side}-bound")
        elif hi < far / 2:  # a band below `far`: a point just under it is not declared unbound
            far_below.append(p["phase"])
            parts.append(f"{p['phase']} ({p['intensity']:.2f} FLOP/byte, on the {side} side of the ridge) reached "
                         f"only {frac:.1%} of its roof, {-math.log10(frac):.1f} decades under it")
        else:
            parts.append(f"{p['phase']} ({p['intensity']:.2f} FLOP/byte, on the {side} side of the ridge) {reached}, "
                         f"between {far / 2:.0%} and {far:.0%} of it or across a mark: this run cannot tell whether it "
                         f"is {side}-bound or set by a per-step cost")
    text = f"The ridge is at {ridge:.1f} FLOP/byte: " + "; ".join(parts) + "."
    if far_below:
        text += (f" {' and '.join(far_below).capitalize()} {'is' if len(far_below) == 1 else 'are'} neither memory- "
                 f"nor compute-bound in this run: far under both roofs, a fixed per-step cost (Python, kernel "
                 f"launches, small matmuls that do not fill the cores) sets the speed, which is what batching and "
                 f"compiled decode attack.")
    return text


def batch_scaling(rows: list[dict], half: float = 0.5) -> dict:
    """How tokens/s grew over a batch sweep (`timed` rows with "batch", first the smallest batch): per row the
    share of linear scaling from the first batch, t(first) * b / (t(b) * first), as a `protocol.Ratio` with IQR
    bounds; "knee": the first batch whose whole range is below `half` of linear, "unclear": the batches before
    it whose range holds `half` (the run cannot tell), "gain": the last batch's tokens/s over the first's
    (value, lo, hi)."""
    first, out = rows[0], {"knee": None, "unclear": [], "shares": []}
    for r in rows:
        share = protocol.ratio(timing(first), timing(r))  # t(first) / t(b): the share of linear scaling at b
        out["shares"].append((r["batch"], share))
        if out["knee"] is None and share.hi < half:
            out["knee"] = r["batch"]
        elif out["knee"] is None and share.lo < half <= share.hi:
            out["unclear"].append(r["batch"])
    k = rows[-1]["batch"] / first["batch"]
    out["gain"] = (share.value * k, share.lo * k, share.hi * k)
    return out


# ---------------------------------------------------------------- the parameters


EXAMPLE_PROMPT = "    def __init__(self"  # the prompt of notebook 10's generation examples


COMPILE_LAYERS_DEFAULT = 8  # layers of the compiled decode step's model (`compiled_layers` caps them)


CHECK_EXTRA = 8  # the cache checks run PROMPT_LEN + 8 tokens: a prefill, then decode steps to compare


BUDGET_PRESET, BUDGET_RANK = "1.3b", 512  # the model and latent rank of the budget table, in bf16


def budget_need() -> tuple[int, int]:
    """(bytes of the BUDGET_PRESET GPT's bf16 weights as `footprint.decode_step_bytes` counts them, bytes of one token of its
    MHA cache in bf16): what the budget table subtracts, and what it divides the rest by. Shapes only: the
    model is built on the meta device, where nothing is allocated and no random numbers are drawn."""
    cfg = GPTConfig.preset(BUDGET_PRESET)
    with torch.device("meta"):
        model = GPT(cfg).to(torch.bfloat16)
    return decode_step_bytes(model), budget_rows(cfg, variant_configs(cfg, BUDGET_RANK), 0.0, 0.0, 2)[0][1]


def min_budget_gb() -> float:
    """The smallest BUDGET_GB the budget table can use: the weights and one token of MHA's cache (`budget_need`),
    so that every variant's longest context is at least one token (the table's ratios divide by MHA's)."""
    weights, token = budget_need()
    gb = (weights + token) / 1e9
    while gb * 1e9 < weights + token:  # the division may round down by an ulp
        gb = math.nextafter(gb, math.inf)
    return gb


def _budget(name: str, value) -> float:
    """BUDGET_GB: a finite number of GB from `min_budget_gb()` up, as a float."""
    value = positive(name, float(value) if type(value) is int else value, float)
    weights, token = budget_need()
    if not math.isfinite(value) or value * 1e9 - weights < token:
        raise ValueError(f"{name}={value!r} GB cannot hold the {BUDGET_PRESET} GPT's bf16 weights "
                         f"({weights / 1e9:.3f} GB) and one token of its MHA cache, so no attention variant would fit a "
                         f"token; choose a finite budget of at least {min_budget_gb():.10g} GB")
    return value


def compiled_layers(preset: str, layers: int) -> int:
    """The layers of the model whose decode step notebook 10 compiles: `layers`, at most `preset`'s own. The model
    keeps the preset's width, so each layer reads its weights with the same kernels as in the whole preset and
    the step's share of the copy bandwidth is about the whole preset's; the compile traces, lowers and
    schedules every layer, so its time grows with the layers."""
    return min(positive("layers", layers), GPTConfig.preset(preset).n_layer)


def copy_fraction(compiled: dict | None, row: dict, copy_gbps: float) -> tuple[float, float, float]:
    """The share (0-1) of the copy bandwidth `copy_gbps` a batch-1 decode step reached, with IQR bounds: the
    compiled step (`kv_decode_lab.compiled_decode`'s dict) where there is one, else the eager step of `row` (one
    row of the bandwidth sweep, not a maximum). Returns (share, low, high); the slowest time (q75) gives the low."""
    nbytes, times = ((compiled["bytes"], (compiled["compiled_s"], compiled["compiled_q25"], compiled["compiled_q75"]))
                     if compiled else (row["bytes"], (row["seconds"], row["q25"], row["q75"])))
    frac, hi, lo = (nbytes / t / 1e9 / copy_gbps for t in times)
    return frac, lo, hi


BANDWIDTH_CLAIM = dict(notebook="10", claim="a batch-1 decode of Llama-2-7B reaches 1397 GB/s of about 1700 achievable "
                       "on an A100 (gpt-fast): over 70%", source="the gpt-fast README (pytorch-labs, 2023)",
                       claimed=(70.0, None), unit="%")


def decode_bandwidth_claim(compiled: dict | None, compiled_name: str, compile_error: str | None, row: dict,
                           copy_gbps: float, device: str) -> dict:
    """`claims.verdict`'s keyword arguments for gpt-fast's "over 70% of the achievable bandwidth": judged on the
    compiled bf16 step's `copy_fraction` where one ran; else "not testable", saying why (the compile failed with
    `compile_error`, or this device has no CUDA graphs), with the eager step of `row` as what was measured."""
    if not compiled:
        return {**BANDWIDTH_CLAIM, "verdict": "not testable",
                "measured": f"eager batch-1 decode of {row['model']} at {row['gbps']:.3g} GB/s ({timing(row)} a step), "
                            f"{row['gbps'] / copy_gbps:.0%} of the copy bandwidth on this {device}",
                "reason": f"torch.compile failed: {compile_error}" if compile_error
                else "needs a GPU with CUDA graphs and bf16 weights"}
    frac, lo, hi = copy_fraction(compiled, row, copy_gbps)
    return {**BANDWIDTH_CLAIM, "value": 100 * frac, "spread": (100 * lo, 100 * hi),
            "measured": f"compiled bf16 batch-1 decode of {compiled_name} at {frac:.0%} (IQR-bounded "
                        f"{lo:.0%}-{hi:.0%}) of the copy bandwidth"}


def resolve_parameters(S: params.Setup, *, MODEL, TRAIN_STEPS, PROMPT_LEN, NEW_TOKENS, POSITIONS, SIZES, CONTEXT,
                       BATCHES, COMPILE_LAYERS, RANKS, BUDGET_GB, REPS) -> dict:
    """Notebook 10's parameters, validated at once and with the profile's defaults filled in: {name: value}.

    Raises ValueError naming the first bad parameter, and where a later cell could not use a value, with
    T = MODEL's seq_len: PROMPT_LEN below 2 (the cache check prefills half of it) or above T - 8 (the cache
    checks run PROMPT_LEN + 8 tokens), PROMPT_LEN + NEW_TOKENS or max(POSITIONS) not below T, NEW_TOKENS
    beyond T minus the examples' EXAMPLE_PROMPT, a rank of RANKS beyond what the k/v projections hold, a
    BUDGET_GB below `min_budget_gb()`.
    """
    R = S.resolve
    model = R("MODEL", MODEL, smoke="tiny", full="small10m", check=lambda n, v: params.choose(n, v, PRESETS))
    out = {"MODEL": model,
           "TRAIN_STEPS": None if TRAIN_STEPS is None else params.positive("TRAIN_STEPS", TRAIN_STEPS),  # the schedule's
           "PROMPT_LEN": R("PROMPT_LEN", PROMPT_LEN, smoke=32, full=128, check=params.positive),
           "NEW_TOKENS": R("NEW_TOKENS", NEW_TOKENS, smoke=32, full=96, check=params.positive),
           "POSITIONS": R("POSITIONS", POSITIONS, smoke=[8, 32, 96], full=[16, 64, 128, 192, 250], check=params.positives),
           "SIZES": R("SIZES", SIZES, smoke=["tiny", "small10m"], full=["small10m", "gpt2", "1.3b"],
                      check=lambda n, v: params.choices(n, v, PRESETS)),
           "CONTEXT": R("CONTEXT", CONTEXT, smoke=64, full=512, check=params.positive),
           "BATCHES": R("BATCHES", BATCHES, smoke=[1, 4, 16], full=[1, 4, 16, 64, 256], check=params.positives),
           "COMPILE_LAYERS": R("COMPILE_LAYERS", COMPILE_LAYERS, smoke=COMPILE_LAYERS_DEFAULT,
                               full=COMPILE_LAYERS_DEFAULT, check=params.positive),
           "RANKS": R("RANKS", RANKS, smoke=[2, 8, 32], full=[16, 64, 128, 256], check=params.positives),
           "BUDGET_GB": R("BUDGET_GB", BUDGET_GB, smoke=80.0, full=80.0, check=_budget),
           "REPS": R("REPS", REPS, smoke=15, full=20, check=params.positive)}
    cfg = GPTConfig.preset(model)
    prompt_len, new = out["PROMPT_LEN"], out["NEW_TOKENS"]
    for name, value in (("PROMPT_LEN + NEW_TOKENS", prompt_len + new), ("max(POSITIONS)", max(out["POSITIONS"]))):
        if value >= cfg.seq_len:
            raise ValueError(f"{name}={value} must stay below {model}'s seq_len={cfg.seq_len}")
    if prompt_len < 2 or prompt_len + CHECK_EXTRA > cfg.seq_len:
        raise ValueError(f"PROMPT_LEN={prompt_len}: the cache checks prefill half of the prompt and then run "
                         f"{CHECK_EXTRA} more tokens, so it must be from 2 to {cfg.seq_len - CHECK_EXTRA} for {model} "
                         f"(seq_len {cfg.seq_len})")
    example = len(EXAMPLE_PROMPT.encode())
    if example + new > cfg.seq_len:
        raise ValueError(f"NEW_TOKENS={new}: the generation examples continue a {example}-byte prompt, so at most "
                         f"{cfg.seq_len - example} new tokens fit {model}'s seq_len={cfg.seq_len}")
    most = min(cfg.d_model, 2 * cfg.n_kv_head * cfg.head_dim)
    if max(out["RANKS"]) > most:
        raise ValueError(f"RANKS={out['RANKS']}: a rank cannot pass {most} for {model}")
    return out
