"""Notebook 11's measurements: speculative decoding on the course GPTs, timed and compared with its formula.

* `resolve_parameters(S, ...)`: the notebook's parameters validated at once, the profile's defaults filled in.
* `prompts(tokens, count, length, seed)`: prompts cut from the held-out corpus.
* `model_pq(target, draft, prompt, k)`: a small "known" p and q taken from the two models themselves.
* `rule_check(p, q, draws, seed, threshold)`: the exact and the wrong rule sampled, each chi-square tested.
* `greedy_rows(target, drafts, prompt, n, gammas)`: greedy speculative output against the target's greedy.
* `decode_costs(target, draft, prompt, gammas, reps, device)`: one decode step of each model and the target's
  verification pass of γ + 1 tokens, timed by the protocol; c and the verification cost as `paired_ratio`s.
* `speed_grid(...)`: every (draft, γ, temperature) timed round-robin beside plain decoding, with α, tokens per
  pass, measured and predicted speedup; `position_rows` bins acceptance by window index and by position.
* A bandwidth-bound target: `weight_bytes`, `alpha_estimate` (α with its standard error), `formula_rows` (the
  formula's speedup per γ from measured α, c and v, with a range), `bound_sentence`, `prediction_sentence`.
* Sentences that rank only what the spread separates: `best_sentence`, `alpha_sentence`, `against_plain`.
* The ledger: `CLAIMS` (Leviathan et al., 2023; Chen et al., 2023), `judge_range`, `claim_rows`.
* Figures: `exactness_figure`, `speedup_figure`, `prediction_figure`, `panel_figure`.
"""
from __future__ import annotations

import math
import statistics
import time

import torch

from helpers.decode import speculative
from helpers.gpt.generation import KVCache, Sampler, generate, prefill, rewound_step
from helpers.gpt.model import GPT, PRESETS, GPTConfig
from helpers.measure import bench, claims, params, protocol
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


def resolve_parameters(S: params.Setup, *, TARGET, BW_TARGET, DRAFT_LAYERS, DRAFT_WIDTH, NGRAM, PROMPT_LEN,
                       NEW_TOKENS, GAMMAS, TEMPERATURES, ROUNDS, DRAWS, THRESHOLD, REPS) -> dict:
    """Notebook 11's parameters, validated at once and with the profile's defaults filled in: {name: value}
    (BW_TARGET: the preset, untrained, whose decode step and verification pass are timed for the formula's
    prediction on a bandwidth-bound target)
    (TEMPERATURES sorted and distinct). Raises ValueError naming the first bad parameter: an odd DRAFT_WIDTH
    (the draft has 2 heads), or PROMPT_LEN + NEW_TOKENS + max(GAMMAS) + 1 beyond TARGET's seq_len (the last
    verification pass scores max(GAMMAS) + 1 tokens after everything generated)."""
    R = S.resolve
    out = {"TARGET": R("TARGET", TARGET, smoke="tiny", full="small10m", check=lambda n, v: params.choose(n, v, PRESETS)),
           "BW_TARGET": R("BW_TARGET", BW_TARGET, smoke="small10m", full="small10m",
                          check=lambda n, v: params.choose(n, v, PRESETS)),
           "DRAFT_LAYERS": R("DRAFT_LAYERS", DRAFT_LAYERS, smoke=1, full=1, check=params.positive),
           "DRAFT_WIDTH": R("DRAFT_WIDTH", DRAFT_WIDTH, smoke=64, full=128, check=params.positive),
           "NGRAM": R("NGRAM", NGRAM, smoke=3, full=3, check=params.positive),
           "PROMPT_LEN": R("PROMPT_LEN", PROMPT_LEN, smoke=32, full=64, check=params.positive),
           "NEW_TOKENS": R("NEW_TOKENS", NEW_TOKENS, smoke=32, full=96, check=params.positive),
           "GAMMAS": R("GAMMAS", GAMMAS, smoke=[1, 2, 4], full=[1, 2, 4, 8], check=check_gammas),
           "TEMPERATURES": R("TEMPERATURES", TEMPERATURES, smoke=[0.0, 0.5, 1.0], full=[0.0, 1.0],
                             check=check_temperatures),
           "ROUNDS": R("ROUNDS", ROUNDS, smoke=15, full=5, check=params.positive),
           "DRAWS": R("DRAWS", DRAWS, smoke=100_000, full=1_000_000, check=params.positive),
           "THRESHOLD": R("THRESHOLD", THRESHOLD, smoke=0.001, full=0.001, check=check_fraction),
           "REPS": R("REPS", REPS, smoke=30, full=40, check=params.positive)}
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


def decode_costs(target: GPT, draft: GPT, prompt: torch.Tensor, gammas: list[int], *, reps: int = 30,
                 min_reps: int = 5, device: str = "cpu", budget_s: float = 6.0) -> dict:
    """One decode step of the target and of the draft (one token against a cache holding `prompt`) and, for each
    γ, the target's verification pass of γ + 1 tokens, timed by the course protocol (helpers.measure.protocol:
    warmed up until steady, interleaved rounds: at least `min_reps` (paired ratios need rounds, not only separated
    medians), at most `reps` rounds or `budget_s` seconds).

    Returns target_ms, draft_ms (medians), c_ratio (draft / target, `paired_ratio`: median and IQR of the
    per-round ratios) and c (its median), verify_ratio {γ: verification / target step, paired} and verify
    {γ: its median}, timings {name: Timing} and the protocol's comparison."""
    fns = {"target": _step_fn(target, prompt, 1), "draft": _step_fn(draft, prompt, 1)}
    fns.update({f"verify{g}": _step_fn(target, prompt, g + 1) for g in gammas})
    cmp = protocol.compare(fns, device=device, min_reps=min(min_reps, reps), max_reps=reps, budget_s=budget_s)
    t = cmp.timings
    c = protocol.paired_ratio(t["draft"], t["target"])
    verify = {g: protocol.paired_ratio(t[f"verify{g}"], t["target"]) for g in gammas}
    return {"target_ms": t["target"].ms, "draft_ms": t["draft"].ms, "c": c.value, "c_ratio": c,
            "verify": {g: v.value for g, v in verify.items()}, "verify_ratio": verify, "timings": t, "comparison": cmp}


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
    lookup its lookup time per drafted token over a target step) with c_q25, c_q75 (its IQR; c itself for prompt
    lookup), predicted (the formula), predicted_verify (the
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
    c_q = {name: bench.quartiles([a / p for T in temperatures for a, p in zip(alone_s[(name, T)], plain_s[T])])
           for name in models}
    c_of = {name: q[0] for name, q in c_q.items()}
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
                     "c": c, "c_q25": c_q[name][1] if name in c_q else c, "c_q75": c_q[name][2] if name in c_q else c,
                     "predicted": speculative.predicted_speedup(a, g, c),
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
    """The takeaway on prompt lookup: its highest-median configuration among those whose speedup is not flagged as noise
    (measured above what its passes allow), or a sentence that none is; plus how many rows were flagged."""
    ng = [r for r in rows if r["draft"] == "prompt-lookup"]
    ok = [r for r in ng if not r["noise"]]
    flagged = len(ng) - len(ok)
    note = (f"; {flagged} of its {len(ng)} rows measured faster than their passes allow (timing noise, not results)"
            if flagged else "")
    if not ok:
        return f"- Prompt lookup needs no second model; it pays only where the text repeats{note}."
    b = max(ok, key=lambda r: r["speedup"])
    return (f"- Prompt lookup needs no second model; it pays only where the text repeats: its highest-median row (γ={b['gamma']}, "
            f"T={b['temperature']:g}) proposed {b['proposal_rate']:.0%} of its slots, for {b['tokens_per_pass']:.2f} tokens "
            f"per pass (so at most {b['ceiling']:.2f}x) and {b['speedup']:.2f}x measured (IQR {b['speedup_q25']:.2f}-"
            f"{b['speedup_q75']:.2f})" + (", at its ceiling, so part of it is likely timing noise"
                                          if b["speedup"] >= 0.95 * b["ceiling"] else "") + f"{note}.")


# ---------------------------------------------------------------- a bandwidth-bound target, and the ledger


def alpha_estimate(runs: list) -> tuple[float, float, int]:
    """(mean, standard error, count) of Σ min(p, q) over every verified position of the SpecResults `runs`
    (nan, nan, 0 when none was verified; standard error 0 for a single position)."""
    betas = [b for x in runs for b in x.betas]
    if not betas:
        return float("nan"), float("nan"), 0
    se = statistics.stdev(betas) / math.sqrt(len(betas)) if len(betas) > 1 else 0.0
    return min(statistics.fmean(betas), 1.0), se, len(betas)


def alpha_sentence(estimates: dict, low: float, high: float) -> str:
    """How α moved between two temperatures, from `alpha_estimate`s {temperature: (mean, se, count)}: 'rises' or
    'falls' only when the difference exceeds twice its standard error (sqrt(se_low² + se_high²)), else that the
    two are within sampling noise of each other."""
    (a0, s0, n0), (a1, s1, n1) = estimates[low], estimates[high]
    both = f"α is {a0:.2f} ± {s0:.2f} at T={low:g} ({n0} positions) and {a1:.2f} ± {s1:.2f} at T={high:g} ({n1})"
    if abs(a1 - a0) > 2 * math.hypot(s0, s1):
        return both + (": it rises with temperature" if a1 > a0 else ": it falls with temperature") + \
            " (the difference is more than twice its standard error)"
    return both + ": within twice the standard error of each other, so this run cannot say which way temperature moves it"


def bound_sentence(gbps: float, ceiling: float, preset: str, share: float = 0.3) -> str:
    """Whether a decode step that reads its weights at `gbps` is bound by reading them: at least `share` of the copy
    ceiling (GB/s) says so; below it, per-call overhead sets the step, and the c measured on it is not a large
    target's."""
    if gbps >= share * ceiling:
        return (f"the {preset} step streams its weights at {gbps / ceiling:.0%} of the copy ceiling: reading weights, "
                "not per-call overhead, sets its cost")
    return (f"the {preset} step streams its weights at only {gbps / ceiling:.0%} of the copy ceiling: here per-call "
            "overhead, not reading weights, sets its cost, so this c is not what a large target would see")


def weight_bytes(model: GPT) -> int:
    """Bytes of the model's parameters: what one decode step reads from memory at least once."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def formula_rows(alpha: float, alpha_se: float, gammas: list[int], c: protocol.Ratio,
                 verify: dict[int, protocol.Ratio]) -> list[dict]:
    """The formula's speedup per γ from a measured α (with its standard error) and the measured cost ratios.

    c: one draft step over one target step; verify[γ]: the target's pass over γ + 1 tokens over one step (both
    `protocol.Ratio`, with IQR bounds). One dict per γ: gamma, alpha, c, v (medians), tokens = (1 − α^{γ+1}) /
    (1 − α), predicted = tokens / (γc + 1) (Leviathan et al., 2023, Theorem 3.8, which takes v = 1),
    predicted_verify = tokens / (γc + v), and its range lo = tokens(α − se) / (γ c.hi + v.hi),
    hi = tokens(α + se) / (γ c.lo + v.lo). Raises ValueError for α outside [0, 1] or a negative se."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha={alpha!r} must be in [0, 1]")
    if not alpha_se >= 0:
        raise ValueError(f"alpha_se={alpha_se!r} must be >= 0")
    a_lo, a_hi = max(alpha - alpha_se, 0.0), min(alpha + alpha_se, 1.0)
    rows = []
    for g in gammas:
        v = verify[g]
        tokens = speculative.expected_tokens(alpha, g)
        rows.append({"gamma": g, "alpha": alpha, "c": c.value, "v": v.value, "tokens": tokens,
                     "predicted": speculative.predicted_speedup(alpha, g, c.value),
                     "predicted_verify": tokens / (g * c.value + v.value),
                     "lo": speculative.expected_tokens(a_lo, g) / (g * c.hi + v.hi),
                     "hi": speculative.expected_tokens(a_hi, g) / (g * c.lo + v.lo)})
    return rows


def against_plain(lo: float, hi: float) -> str:
    """How a speedup's range [lo, hi] sits against plain decoding (1x): 'faster than', 'slower than' or
    'within the noise of' (a range that holds 1 cannot rank the two)."""
    return "faster than" if lo > 1 else "slower than" if hi < 1 else "within the noise of"


def prediction_sentence(rows: list[dict], target: str, step_ms: str) -> str:
    """The formula's verdict on a bandwidth-bound target from `formula_rows`: the γ with the largest prediction,
    its range, how it sits against plain decoding, and whether it is separated from the next-best γ (ranges
    disjoint); step_ms: the target step's timing as text."""
    order = sorted(rows, key=lambda r: r["predicted_verify"], reverse=True)
    b = order[0]
    head = (f"on a {target} target (one step {step_ms}), the formula with this run's α = {b['alpha']:.2f}, c = "
            f"{b['c']:.3f} and a {b['gamma'] + 1}-token verification costing {b['v']:.2f} steps predicts "
            f"{b['predicted_verify']:.2f}x at γ={b['gamma']} (range {b['lo']:.2f}-{b['hi']:.2f}x): "
            f"{against_plain(b['lo'], b['hi'])} plain decoding")
    if len(order) == 1:
        return head
    r = order[1]
    if b["lo"] > r["hi"]:
        return head + f"; above γ={r['gamma']}'s range ({r['lo']:.2f}-{r['hi']:.2f}x), the next best"
    return (head + f"; γ={r['gamma']} ({r['predicted_verify']:.2f}x, range {r['lo']:.2f}-{r['hi']:.2f}x) overlaps it, "
            "so this run cannot rank those γs")


def best_sentence(rows: list[dict], temperature: float) -> tuple[dict, str]:
    """(row, sentence) for the grid rows of one draft at one temperature: the row with the highest median speedup
    among those not flagged as noise, how its IQR sits against plain decoding (1x), and whether its IQR lies
    above the runner-up's; overlapping IQRs are said not to rank."""
    order = sorted(rows, key=lambda r: (not r["noise"], r["speedup"]), reverse=True)
    b = order[0]
    text = (f"at T={temperature:g} the highest median speedup was γ={b['gamma']}'s, {b['speedup']:.2f}x (IQR "
            f"{b['speedup_q25']:.2f}-{b['speedup_q75']:.2f}; formula {b['predicted']:.2f}x"
            + (", above what its passes allow: timing noise, not a result" if b["noise"] else "")
            + f"), {against_plain(b['speedup_q25'], b['speedup_q75'])} plain decoding")
    if len(order) > 1:
        r = order[1]
        text += (f"; above γ={r['gamma']}'s IQR ({r['speedup_q25']:.2f}-{r['speedup_q75']:.2f})"
                 if b["speedup_q25"] > r["speedup_q75"] else
                 f"; its IQR overlaps γ={r['gamma']}'s ({r['speedup_q25']:.2f}-{r['speedup_q75']:.2f}), so this run "
                 "cannot rank those γs")
    return b, text


# (id, claimed range, which decoding, claim, source)
CLAIMS = (
    ("speculative-decoding-t5-xxl", 2.0, 3.0, "greedy",
     "speculative decoding runs 2-3x faster than standard decoding, with identical outputs (T5-XXL)",
     "Leviathan et al., 2023, Fast Inference from Transformers via Speculative Decoding, abstract (T5-XXL, TPU-v4)"),
    ("speculative-sampling-chinchilla", 2.0, 2.5, "sampled",
     "speculative sampling decodes 2-2.5x faster than sampling from the target alone (Chinchilla 70B, distributed)",
     "Chen et al., 2023, Accelerating Large Language Model Decoding with Speculative Sampling, abstract "
     "(Chinchilla 70B, TPU-v4)"),
)


def judge_range(value: float, lo: float, hi: float, claim_lo: float, claim_hi: float | None) -> tuple[str, str]:
    """(verdict, reason) on a claim of claim_lo-claim_hi for a value known only to lie in [lo, hi] (its IQR or
    range): claims.judge's verdict when lo and hi get the same one (the whole range is below, within or above the
    claim), else "not testable", with the reason that the range spans a bound of the claim (this run's noise
    cannot decide it). Raises ValueError when value lies outside [lo, hi]."""
    if not lo <= value <= hi:
        raise ValueError(f"value={value!r} lies outside its range {lo!r}-{hi!r}")
    low, high = claims.judge(lo, claim_lo, claim_hi), claims.judge(hi, claim_lo, claim_hi)
    if low == high:
        return low, ""
    bound = claim_lo if low == "contradicted" else claim_hi
    return "not testable", (f"the range {lo:.2f}-{hi:.2f}x around {value:.2f}x spans the claim's bound of {bound:g}x, "
                            "so this run's noise cannot decide it")


def claim_rows(evidence: dict, *, basis: str, identical: str) -> list[dict]:
    """The keyword arguments of `claims.verdict` (notebook "11") for the two speedup claims in CLAIMS.

    evidence: {"greedy": e, "sampled": e}, e None (not testable: no such temperature in this run) or a dict
    with value (the speedup), lo, hi (its range), gamma, temperature, and, for basis "formula", alpha, c, v,
    target. basis: "measured" (e from the timed grid) or "formula" (e from `formula_rows`). identical: the greedy
    identity check's result in words. The verdict is `judge_range` of e's range against the claimed one."""
    out = []
    for cid, lo, hi, kind, claim, source in CLAIMS:
        e = evidence.get(kind)
        row = {"notebook": "11", "claim": claim, "source": source, "unit": "x", "basis": basis}
        if e is None:
            out.append({**row, "claim_id": cid, "measured": f"no {kind} run in this configuration",
                        "verdict": "not testable", "reason": f"TEMPERATURES holds no {kind} temperature "
                        + ("(T > 0)" if kind == "sampled" else "(T = 0)"), "value": None})
            continue
        if basis == "formula":
            text = (f"formula (1 − α^(γ+1))/((1 − α)(γc + v)) at γ={e['gamma']}: {e['value']:.2f}x (range "
                    f"{e['lo']:.2f}-{e['hi']:.2f}x), α = {e['alpha']:.2f} measured on the trained pair at "
                    f"T={e['temperature']:g}, c = {e['c']:.3f} and v = {e['v']:.2f} timed on a {e['target']} target")
            reason = ("a formula's prediction: no trained bandwidth-bound target fits this run, so no speedup was "
                      "timed on one")
        else:
            text = (f"best measured speedup {e['value']:.2f}x (IQR {e['lo']:.2f}-{e['hi']:.2f}) at γ={e['gamma']}, "
                    f"T={e['temperature']:g}")
            reason = ""
        if kind == "greedy":
            text += f"; greedy output {identical}"
        verdict, why = judge_range(e["value"], e["lo"], e["hi"], lo, hi)
        out.append({**row, "claim_id": cid, "measured": text, "verdict": verdict,
                    "reason": "; ".join(x for x in (why, reason) if x), "value": e["value"]})
    return out


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


def prediction_figure(rows_by_t: dict, target: str, claimed: tuple[float, float] = (2.0, 3.0)):
    """The formula's speedup against γ on a `target`-sized target, one colour per temperature: with the measured
    verification cost (dots, bars: the range from `formula_rows`) and with v = 1 (dashed); the claimed range
    (Leviathan et al., 2023) shaded, plain decoding at 1x. rows_by_t: {temperature: formula_rows(...)}."""
    fig, ax = plots.figure(figsize=(7, 3.6))
    ax.axhspan(*claimed, color="grey", alpha=0.15, label=f"claimed {claimed[0]:g}-{claimed[1]:g}x (Leviathan et al., 2023)")
    for j, (T, rows) in enumerate(sorted(rows_by_t.items())):
        gs = [r["gamma"] for r in rows]
        ax.errorbar(gs, [r["predicted_verify"] for r in rows],
                    yerr=[[r["predicted_verify"] - r["lo"] for r in rows], [r["hi"] - r["predicted_verify"] for r in rows]],
                    fmt="o-", color=f"C{j}", capsize=3, label=f"formula, measured v, T={T:g}")
        ax.plot(gs, [r["predicted"] for r in rows], "--", color=f"C{j}", label=f"formula, v = 1, T={T:g}")
        ax.set_xticks(gs)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("γ (draft tokens per round)")
    ax.set_ylabel("predicted speedup")
    ax.set_title(f"formula on a {target}-sized target (this run's α, c, v)")
    ax.legend(fontsize=6, ncol=2, loc="lower right")
    return fig


def panel_figure(rows: list[dict], draft: str, gamma: int, temperature: float):
    """The panel's figure: `speedup_figure` for one draft with the chosen (γ, temperature) circled."""
    return speedup_figure(rows, draft, title=f"draft={draft}, γ={gamma}, T={temperature:g}",
                          highlight=(gamma, temperature))
