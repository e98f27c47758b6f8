"""Notebook 11's measurements: speculative decoding on the course GPTs, timed and compared with its formula.

* `resolve_parameters(S, ...)`: the notebook's parameters validated at once, the profile's defaults filled in.
* `prompts(tokens, count, length, seed)`: prompts cut from the held-out corpus.
* `model_pq(target, draft, prompt, k)`: a small "known" p and q taken from the two models themselves.
* `rule_check(p, q, draws, seed, threshold)`: the exact and the wrong rule sampled, each chi-square tested.
* `greedy_rows(target, drafts, prompt, n, gammas)`: greedy speculative output against the target's greedy.
* `decode_costs(target, draft, prompt, gammas, reps, device)`: ms per token of each model, the cost ratio c,
  and the target's verification pass of γ + 1 tokens relative to one decode step.
* `speed_grid(...)`: every (draft, γ, temperature) timed round-robin beside plain decoding, with α, tokens per
  pass, measured and predicted speedup; `position_rows` bins acceptance by window index and by position.
* Figures: `exactness_figure`, `speedup_figure`, `panel_figure`.
"""
from __future__ import annotations

import math
import statistics
import time

import torch

from helpers.decode import speculative
from helpers.gpt.generation import KVCache, Sampler, generate, prefill, rewound_step
from helpers.gpt.model import GPT, PRESETS, GPTConfig
from helpers.measure import bench, params
from helpers.show import plots


def _not_a_string(name: str, values) -> None:
    """Raise a ValueError saying that a list parameter arrived as a string (papermill's -p passes text)."""
    if isinstance(values, (str, bytes)):
        raise ValueError(f"{name}={values!r} arrived as a string, not a list: pass lists to papermill with -y "
                         f"(e.g. -y \"{name}: [1, 2]\"), not -p")


def check_gammas(name: str, values) -> list[int]:
    """Validate γ values: a non-empty list of positive ints (params.positives), with a clear message when the list
    arrived as a string (papermill -p). Raises ValueError naming the parameter."""
    _not_a_string(name, values)
    return params.positives(name, values)


def check_temperatures(name: str, values) -> list[float]:
    """Validate a parameter holding temperatures: a non-empty list of finite numbers >= 0 (0 = greedy); returns
    them as sorted distinct floats. Raises ValueError naming the parameter (saying so when a string arrived)."""
    _not_a_string(name, values)
    if not isinstance(values, (list, tuple)) or not values or any(
            isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0 for t in values):
        raise ValueError(f"{name}={values!r} must be a non-empty list of finite numbers >= 0 (0 = greedy)")
    return sorted({float(t) for t in values})


def check_fraction(name: str, value) -> float:
    """Validate a number strictly between 0 and 1 (e.g. a p-value threshold); raises ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"{name}={value!r} must be a number strictly between 0 and 1")
    return float(value)


def resolve_parameters(S: params.Setup, *, TARGET, DRAFT_LAYERS, DRAFT_WIDTH, NGRAM, PROMPT_LEN, NEW_TOKENS, GAMMAS,
                       TEMPERATURES, ROUNDS, DRAWS, THRESHOLD, REPS) -> dict:
    """Notebook 11's parameters, validated at once and with the profile's defaults filled in: {name: value}
    (TEMPERATURES sorted and distinct). Raises ValueError naming the first bad parameter: an odd DRAFT_WIDTH
    (the draft has 2 heads), or PROMPT_LEN + NEW_TOKENS + max(GAMMAS) + 1 beyond TARGET's seq_len (the last
    verification pass scores max(GAMMAS) + 1 tokens after everything generated)."""
    R = S.resolve
    out = {"TARGET": R("TARGET", TARGET, smoke="tiny", full="small10m", check=lambda n, v: params.choose(n, v, PRESETS)),
           "DRAFT_LAYERS": R("DRAFT_LAYERS", DRAFT_LAYERS, smoke=1, full=1, check=params.positive),
           "DRAFT_WIDTH": R("DRAFT_WIDTH", DRAFT_WIDTH, smoke=64, full=128, check=params.positive),
           "NGRAM": R("NGRAM", NGRAM, smoke=3, full=3, check=params.positive),
           "PROMPT_LEN": R("PROMPT_LEN", PROMPT_LEN, smoke=32, full=64, check=params.positive),
           "NEW_TOKENS": R("NEW_TOKENS", NEW_TOKENS, smoke=32, full=128, check=params.positive),
           "GAMMAS": R("GAMMAS", GAMMAS, smoke=[1, 2, 4], full=[1, 2, 3, 4, 6, 8], check=check_gammas),
           "TEMPERATURES": R("TEMPERATURES", TEMPERATURES, smoke=[0.0, 0.5, 1.0], full=[0.0, 0.5, 1.0],
                             check=check_temperatures),
           "ROUNDS": R("ROUNDS", ROUNDS, smoke=3, full=5, check=params.positive),
           "DRAWS": R("DRAWS", DRAWS, smoke=100_000, full=1_000_000, check=params.positive),
           "THRESHOLD": R("THRESHOLD", THRESHOLD, smoke=0.001, full=0.001, check=check_fraction),
           "REPS": R("REPS", REPS, smoke=10, full=30, check=params.positive)}
    if out["DRAFT_WIDTH"] % 2:
        raise ValueError(f"DRAFT_WIDTH={out['DRAFT_WIDTH']} must be even (the draft has 2 heads)")
    longest = out["PROMPT_LEN"] + out["NEW_TOKENS"] + max(out["GAMMAS"]) + 1
    seq_len = GPTConfig.preset(out["TARGET"]).seq_len
    if longest > seq_len:
        raise ValueError(f"PROMPT_LEN + NEW_TOKENS + max(GAMMAS) + 1 = {longest} exceeds {out['TARGET']}'s "
                         f"seq_len={seq_len}")
    return out


def prompts(tokens: torch.Tensor, count: int, length: int, seed: int = 0) -> list[torch.Tensor]:
    """`count` prompts (length,) int64 from random offsets of a 1-D token tensor (the held-out corpus), each
    starting after a newline when one is near, so that prompts open on a line. Raises ValueError if too short."""
    if len(tokens) < length + 200:
        raise ValueError(f"{len(tokens)} tokens are too few for prompts of {length}")
    g = torch.Generator().manual_seed(seed)
    out = []
    for start in torch.randint(0, len(tokens) - length - 200, (count,), generator=g).tolist():
        window = tokens[start:start + 200].tolist()
        nl = window.index(10) + 1 if 10 in window[:199] else 0
        out.append(tokens[start + nl:start + nl + length].long())
    return out


@torch.no_grad()
def model_pq(target: GPT, draft: GPT, prompt: torch.Tensor, k: int = 8) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """p and q (k,) float64: the target's and the draft's next-token distributions after `prompt` (temperature 1),
    restricted to the target's k most likely tokens and renormalised; and those token ids."""
    dev = next(target.parameters()).device
    p = torch.softmax(target(prompt[None].to(dev))[0][0, -1].double().cpu(), -1)
    q = torch.softmax(draft(prompt[None].to(dev))[0][0, -1].double().cpu(), -1)
    ids = p.topk(k).indices
    return p[ids] / p[ids].sum(), q[ids] / q[ids].sum(), ids.tolist()


def rule_check(p: torch.Tensor, q: torch.Tensor, draws: int, seed: int = 0, threshold: float = 0.001) -> dict:
    """Sample `draws` emitted tokens with each rule in `speculative.RULES`;
    {rule: {"counts": (V,), "test": ChiSquare}}."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for rule in speculative.RULES:
        counts = torch.bincount(speculative.sample_rule(p, q, draws, rule=rule, generator=g), minlength=len(p))
        out[rule] = {"counts": counts, "test": speculative.chi_square(counts, p, threshold)}
    return out


def greedy_rows(target: GPT, drafts: dict, prompt: torch.Tensor, n: int, gammas: list[int]) -> list[list]:
    """Rows [draft, γ, identical tokens, n, target passes, tie gap] of greedy speculative decoding against the
    target's own greedy tokens (helpers.gpt.generation.generate) for every draft and γ. `tie gap` is None when all n
    tokens agree; else the target's top-1 minus top-2 logit at the first differing position (a gap at fp32
    rounding's size means the two paths met a tie, which a (γ+1)-token pass and a 1-token pass may break apart)."""
    dev = next(target.parameters()).device
    want = generate(target, prompt.to(dev), n)[0].cpu()
    rows = []
    for name, draft in drafts.items():
        for gamma in gammas:
            got = speculative.speculative_generate(target, draft, prompt, n, gamma=gamma, temperature=0)
            same = got.tokens == want
            gap = None
            if not bool(same.all()):
                i = int((~same).nonzero()[0])
                with torch.no_grad():
                    logits = target(torch.cat([prompt, want[:i]])[None].to(dev))[0][0, -1].float()
                top = logits.topk(2).values
                gap = float(top[0] - top[1])
            rows.append([name, gamma, int(same.sum()), n, got.target_passes, gap])
    return rows


def _step_fn(model: GPT, prompt: torch.Tensor, T: int):
    """A callable running T new tokens against a cache holding `prompt` (rewound before each call)."""
    dev = next(model.parameters()).device
    cache = KVCache(model.config, 1, len(prompt) + T, device=dev)
    prefill(model, prompt[None].to(dev), cache)
    x = prompt[-T:][None].to(dev) if T <= len(prompt) else prompt[None, :1].repeat(1, T).to(dev)
    return rewound_step(model, cache, x)


def decode_costs(target: GPT, draft: GPT, prompt: torch.Tensor, gammas: list[int], *, reps: int = 10,
                 device: str = "cpu") -> dict:
    """Median ms of one decode step of the target and the draft, c = draft / target, and for each γ the target's
    verification pass of γ + 1 tokens in units of one decode step (`verify[γ]`), timed round-robin
    (helpers.measure.bench.benchmark_interleaved). Also the IQRs ({name: Timing} in "timings")."""
    fns = {"target": _step_fn(target, prompt, 1), "draft": _step_fn(draft, prompt, 1)}
    fns.update({f"verify{g}": _step_fn(target, prompt, g + 1) for g in gammas})
    t = bench.benchmark_interleaved(fns, reps=reps, warmup=2, device=device)
    return {"target_ms": t["target"].ms, "draft_ms": t["draft"].ms, "c": t["draft"].median / t["target"].median,
            "verify": {g: t[f"verify{g}"].median / t["target"].median for g in gammas}, "timings": t}


def _ngram_cost(prompt: torch.Tensor, n: int, gamma: int, target_ms: float, reps: int = 20) -> float:
    """c of the n-gram draft: ms of one lookup over a sequence of the generation's length, per drafted token,
    relative to the target's decode step."""
    seq = prompt.tolist() * (1 + n // max(len(prompt), 1))
    d = speculative.NGramDraft()
    t0 = time.perf_counter()
    for _ in range(reps):
        d.propose(seq, gamma)
    return (time.perf_counter() - t0) / reps / gamma * 1e3 / target_ms


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def speed_grid(target: GPT, drafts: dict, prompt_list: list[torch.Tensor], n: int, gammas: list[int],
               temperatures: list[float], costs: dict, *, device: str = "cpu", seed: int = 0,
               progress=None) -> list[dict]:
    """Every (draft, γ, temperature) generating n tokens, timed beside plain decoding of the target and of each GPT
    draft alone (helpers.gpt.generation.generate with the same sampler), round-robin: round r uses prompt r.

    One dict per configuration: draft, gamma, temperature, alpha (mean Σ min(p, q)), acceptance, proposal_rate
    (draft tokens proposed / γ per target pass: 1 for a model, less for prompt lookup), tokens_per_pass, expected
    (the formula's tokens per pass), speedup (median over rounds of plain time / speculative time) with its IQR,
    c (a GPT draft's plain decoding time over the target's, median over every round and temperature; for prompt
    lookup its lookup time per drafted token over a target step), predicted (the formula), predicted_verify (the
    formula with the verification cost `costs["verify"]` from decode_costs instead of one step), plain and
    speculative ms per token, model_ms_per_token (the passes it ran, priced at plain decoding's ms per token of
    each model) and other_ms_per_token (the rest: the rule, rollbacks, extra Python); plus the SpecResults ("runs").

    Plain decoding is timed twice per round and temperature, before and after that temperature's configurations,
    and each round's baseline is their mean (baseline_drift: the median |before - after| / mean). ceiling: the
    largest speedup the passes allow, tokens_per_pass (a round costs at least one target pass, and a pass over
    γ + 1 tokens cannot cost less than plain decoding's one-token step; the measured verification cost is itself
    noisy, so the bound does not use it); noise: True when the measured median exceeds it,
    i.e. timing noise, not a result. truncated_per_pass: tokens per pass dropped because the last round overran n.
    """
    configs = [(name, g, T) for T in temperatures for name in drafts for g in gammas]
    models = [name for name in drafts if isinstance(drafts[name], GPT)]
    plain_s = {T: [] for T in temperatures}
    drift_s = {T: [] for T in temperatures}
    alone_s = {(name, T): [] for name in models for T in temperatures}
    spec_s = {c: [] for c in configs}
    runs = {c: [] for c in configs}

    def timed(fn):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        return time.perf_counter() - t0, out

    rounds = range(len(prompt_list)) if progress is None else progress(range(len(prompt_list)))
    for r in rounds:
        prompt = prompt_list[r].to(device)
        for T in temperatures:
            before = timed(lambda: generate(target, prompt, n, Sampler(temperature=T, seed=seed + r)))[0]
            for name in models:
                alone_s[(name, T)].append(timed(lambda: generate(drafts[name], prompt, n, Sampler(T, seed=seed + r)))[0])
            for c in (c for c in configs if c[2] == T):
                s, res = timed(lambda: speculative.speculative_generate(target, drafts[c[0]], prompt.cpu(), n,
                                                                        gamma=c[1], temperature=T, seed=seed + r))
                spec_s[c].append(s)
                runs[c].append(res)
            after = timed(lambda: generate(target, prompt, n, Sampler(temperature=T, seed=seed + r)))[0]
            plain_s[T].append((before + after) / 2)  # one slow baseline moves this round's ratios half as much
            drift_s[T].append(abs(before - after) / (before + after) * 2)
    plain_ms = 1e3 * statistics.median(x for T in temperatures for x in plain_s[T]) / n
    c_of = {name: statistics.median(a / p for T in temperatures for a, p in zip(alone_s[(name, T)], plain_s[T]))
            for name in models}
    rows = []
    for (name, g, T) in configs:
        res = runs[(name, g, T)]
        betas = [b for x in res for b in x.betas]
        a = min(sum(betas) / len(betas), 1.0) if betas else 0.0
        med, q25, q75 = bench.quartiles([p / s for p, s in zip(plain_s[T], spec_s[(name, g, T)])])
        c = c_of[name] if name in c_of else _ngram_cost(prompt_list[0], n, g, plain_ms)
        v = costs["verify"].get(g, 1.0)
        proposed, passes = sum(x.proposed for x in res), sum(x.target_passes for x in res)
        tokens = sum(len(x.tokens) for x in res)
        spec_ms = 1e3 * statistics.median(spec_s[(name, g, T)]) / n
        model_ms = (sum(x.draft_passes for x in res) * c * plain_ms * (name in c_of) + passes * plain_ms * v) / tokens
        rows.append({"draft": name, "gamma": g, "temperature": T, "alpha": a,
                     "acceptance": sum(x.accepted for x in res) / proposed if proposed else 0.0,
                     "proposal_rate": proposed / (g * passes), "tokens_per_pass": tokens / passes,
                     "expected": speculative.expected_tokens(a, g), "speedup": med, "speedup_q25": q25,
                     "speedup_q75": q75,
                     "c": c, "predicted": speculative.predicted_speedup(a, g, c),
                     "predicted_verify": speculative.expected_tokens(a, g) / (g * c + v),
                     "plain_ms_per_token": 1e3 * statistics.median(plain_s[T]) / n, "spec_ms_per_token": spec_ms,
                     "model_ms_per_token": model_ms, "other_ms_per_token": spec_ms - model_ms,
                     "baseline_drift": statistics.median(drift_s[T]), "ceiling": tokens / passes,
                     "noise": med > tokens / passes,
                     "truncated_per_pass": (sum(x.accepted for x in res) + passes - tokens) / passes, "runs": res})
    return rows


def position_rows(runs: list, gamma: int, n: int, bins: int = 4) -> tuple[list[list], list[list]]:
    """From SpecResults at one γ: rows [window index i, positions verified, mean Σ min(p, q), acceptance rate
    given i was reached] and rows [generated positions lo-hi, verified, mean Σ min(p, q)] in `bins` equal bins."""
    by_i, by_pos = [], []
    for i in range(gamma):
        sel = [(b, ok) for x in runs for b, w, ok in zip(x.betas, x.window, x.accepted_at) if w == i]
        if sel:
            by_i.append([i, len(sel), sum(b for b, _ in sel) / len(sel), sum(ok for _, ok in sel) / len(sel)])
    edges = [round(k * n / bins) for k in range(bins + 1)]
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = [b for x in runs for b, p in zip(x.betas, x.positions) if lo <= p < hi]
        if sel:
            by_pos.append([f"{lo}-{hi - 1}", len(sel), sum(sel) / len(sel)])
    return by_i, by_pos


def cost_warnings(timings: dict, verify: dict, max_spread: float = 0.15) -> list[str]:
    """Sentences flagging timing noise in decode_costs' output: an IQR above `max_spread` (a fraction of the
    median, e.g. 0.15) and a verification pass of γ + 1 tokens measured cheaper than one decode step (scoring γ + 1
    tokens cannot cost less than scoring one). timings: {name: bench Timing}; verify: {γ: cost in decode steps}."""
    out = []
    noisy = [f"{k} ±{50 * t.spread:.0f}%" for k, t in timings.items() if t.spread / 2 > max_spread]
    if noisy:
        out.append(f"noisy timings (IQR above ±{100 * max_spread:.0f}% of the median): {', '.join(noisy)}")
    cheap = [f"γ={g}: {v:.2f}" for g, v in verify.items() if v < 1]
    if cheap:
        out.append(f"verification measured cheaper than one decode step ({', '.join(cheap)}): that is timing noise, "
                   "since scoring γ + 1 tokens cannot cost less than scoring one; read those costs as about 1")
    return out


def trend(values: list[float], flat: float = 0.1) -> str:
    """'rises', 'falls' or 'roughly flat' for a sequence: flat when max - min < `flat`, else by the sign of
    last - first ('varies' when the ends are equal but the middle is not)."""
    if max(values) - min(values) < flat:
        return "roughly flat"
    return "rises" if values[-1] > values[0] else "falls" if values[-1] < values[0] else "varies"


def gap_sentence(rows: list[dict], draft: str, gammas: list[int], temperatures: list[float]) -> str:
    """Why measured tokens per pass differ from the formula, from the grid's numbers: at the largest γ, whether
    every temperature falls more than 5% below the formula (systematic) and by how much, with the part the last
    round's overrun explains (truncated_per_pass) and, at the highest temperature, the share kept given reached by
    window index beside α, which the formula takes as the same at every index, independently; whether every
    temperature lies more than 5% above it; else the largest gap over every γ and which sign, if any, every
    temperature shares at the largest γ (each sentence states the sign the numbers have)."""
    G, T = max(gammas), max(temperatures)
    row = {(r["gamma"], r["temperature"]): r for r in rows if r["draft"] == draft}
    gaps = [row[(G, t)]["tokens_per_pass"] / row[(G, t)]["expected"] - 1 for t in temperatures]
    if not all(x < -0.05 for x in gaps):
        worst = max(abs(r["tokens_per_pass"] / r["expected"] - 1) for r in row.values())
        tokens = sum(len(x.tokens) for x in row[(G, T)]["runs"])
        if all(x > 0.05 for x in gaps):
            return (f"at γ={G} measured tokens per pass exceed the formula at every temperature (by "
                    f"{min(gaps):.0%}-{max(gaps):.0%}), a shared sign, so likely not luck: the formula keeps every "
                    "window index with the same α, independently, which the window-index table below puts to the "
                    "test (the share kept given reached, index by index)")
        head = f"measured tokens per pass are within {worst:.0%} of the formula over every γ; at γ={G} they are "
        size = sorted(abs(x) for x in gaps)
        below, above = all(x <= 0 for x in gaps), all(x >= 0 for x in gaps)
        if below and above:
            return head + "equal to it at every temperature"
        if below or above:
            side = ("below" if below else "above") if all(x != 0 for x in gaps) else \
                ("at or below" if below else "at or above")
            return (head + f"{side} it at every temperature, by {size[0]:.0%}-{size[-1]:.0%}, not all by more than 5%: "
                    f"too small or too uneven to call systematic at {tokens} tokens per configuration")
        return (head + f"on both sides of it (no sign shared by every temperature): at {tokens} tokens per "
                "configuration, sampling luck of that size is expected")
    cut = [row[(G, t)]["truncated_per_pass"] for t in temperatures]
    by_i, _ = position_rows(row[(G, T)]["runs"], G, 10 ** 9, bins=1)
    kept = ", ".join(f"{r[3]:.2f}" for r in by_i)
    a = row[(G, T)]["alpha"]
    first = (f"; the first index, which every round reaches, was kept less often than α, and the higher shares "
             f"further on count only in rounds that got past it" if by_i and by_i[0][3] < a else "")
    return (f"at γ={G} measured tokens per pass fall below the formula at every temperature (by "
            f"{-max(gaps):.0%}-{-min(gaps):.0%}), so it is systematic, not luck. Part is the end of the text: the last "
            f"round's tokens past NEW_TOKENS are dropped ({min(cut):.2f}-{max(cut):.2f} tokens per pass). The rest: the "
            f"formula keeps every window index with the same α, independently, while here (T={T:g}) the share kept given "
            f"reached went {kept} along the window against α = {a:.2f} (the window-index table below){first}.")


def outside(row: dict) -> str:
    """A grid row's ms per token outside the models' passes, as text; a negative estimate (the passes priced
    above what the whole run took) is shown as 0 "(within noise)"."""
    x = row["other_ms_per_token"]
    return f"{x:.2f} ms" if x >= 0 else "0 ms (within noise)"


def lookup_sentence(rows: list[dict]) -> str:
    """The takeaway on prompt lookup: its fastest configuration among those whose speedup is not flagged as noise
    (measured above what its passes allow), or a sentence that none is; plus how many rows were flagged."""
    ng = [r for r in rows if r["draft"] == "prompt-lookup"]
    ok = [r for r in ng if not r["noise"]]
    flagged = len(ng) - len(ok)
    note = (f"; {flagged} of its {len(ng)} rows measured faster than their passes allow (timing noise, not results)"
            if flagged else "")
    if not ok:
        return f"- Prompt lookup needs no second model; it pays only where the text repeats{note}."
    b = max(ok, key=lambda r: r["speedup"])
    return (f"- Prompt lookup needs no second model; it pays only where the text repeats: its fastest row (γ={b['gamma']}, "
            f"T={b['temperature']:g}) proposed {b['proposal_rate']:.0%} of its slots, for {b['tokens_per_pass']:.2f} tokens "
            f"per pass (so at most {b['ceiling']:.2f}x) and {b['speedup']:.2f}x measured (IQR {b['speedup_q25']:.2f}-"
            f"{b['speedup_q75']:.2f})" + (", at its ceiling, so part of it is likely timing noise"
                                          if b["speedup"] >= 0.95 * b["ceiling"] else "") + f"{note}.")


# ---------------------------------------------------------------- figures


def exactness_figure(p: torch.Tensor, checks: dict, labels: list[str]):
    """Bars of p beside the emitted frequencies of each rule (its chi-square p-value in the legend)."""
    fig, ax = plots.figure(figsize=(8, 3.2))
    x = torch.arange(len(p)).float()
    w = 0.8 / (1 + len(checks))
    ax.bar(x - w, p.tolist(), w, label="target p")
    for j, (rule, c) in enumerate(checks.items()):
        freq = (c["counts"] / c["counts"].sum()).tolist()
        ax.bar(x + j * w, freq, w, label=f"emitted, rule '{rule}' (chi-square p-value {c['test'].p_value:.2g})")
    ax.set_xticks(x.tolist(), labels)
    ax.set_ylabel("probability")
    ax.set_title("what one verification step emits, against the target's p")
    ax.legend(fontsize=8)
    return fig


def speedup_figure(rows: list[dict], draft: str, title: str | None = None, highlight: tuple | None = None):
    """Measured speedup (median, IQR bars) and the formula's prediction against γ, one colour per temperature,
    for one draft (no formula for a draft that did not propose γ tokens every round, e.g. prompt lookup);
    `highlight` = (γ, temperature) circles one point."""
    fig, ax = plots.figure(figsize=(7, 3.6))
    temps = sorted({r["temperature"] for r in rows})
    for j, T in enumerate(temps):
        sel = sorted((r for r in rows if r["draft"] == draft and r["temperature"] == T), key=lambda r: r["gamma"])
        gs = [r["gamma"] for r in sel]
        colour = f"C{j}"
        ax.errorbar(gs, [r["speedup"] for r in sel], yerr=[[r["speedup"] - r["speedup_q25"] for r in sel],
                                                          [r["speedup_q75"] - r["speedup"] for r in sel]],
                    fmt="o-", color=colour, label=f"measured, T={T:g}", capsize=3)
        if all(r["proposal_rate"] > 0.999 for r in sel):  # the formula assumes γ proposals every round
            ax.plot(gs, [r["predicted"] for r in sel], "--", color=colour, label=f"formula, T={T:g}")
        ax.set_xticks(gs)
        if highlight and highlight[1] == T:
            hit = [r for r in sel if r["gamma"] == highlight[0]]
            if hit:
                ax.plot([highlight[0]], [hit[0]["speedup"]], "o", ms=14, mfc="none", mec="k")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("γ (draft tokens per round)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title(title or f"speedup against γ, draft: {draft}")
    ax.legend(fontsize=7, ncol=2)
    return fig


def panel_figure(rows: list[dict], draft: str, gamma: int, temperature: float):
    """The panel's figure: `speedup_figure` for one draft with the chosen (γ, temperature) circled."""
    return speedup_figure(rows, draft, title=f"draft={draft}, γ={gamma}, T={temperature:g}",
                          highlight=(gamma, temperature))
