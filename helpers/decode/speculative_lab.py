"""Notebook 11's parameters and measurements: speculative decoding on the course GPTs, checked and timed.

* `resolve_parameters(S, ...)`: the notebook's parameters validated at once, the profile's defaults filled in
  (`check_temperatures`, `check_fraction` validate two of them).
* `model_pq(target, draft, prompt, k)`: a small "known" p and q taken from the two models themselves.
* `rule_check(p, q, draws, seed, threshold)`: the exact and the wrong rule sampled, each chi-square tested;
  `round_check(p, q, draws, accept)`: a round's acceptance step (the notebook's `accept_prefix`) run draw by draw.
* `greedy_rows(target, drafts, prompt, n, gammas)`: greedy speculative output against the target's greedy.
* `decode_costs(target, draft, prompt, gammas, reps, device)`: one decode step of each model and the target's
  verification pass of γ + 1 tokens, timed by the protocol; c and the verification cost as `paired_ratio`s.
* `speed_grid(...)`: every (draft, γ, temperature) timed round-robin beside plain decoding, with α, tokens per
  pass, measured speedup and the formula's; `position_rows` (α by window index and by position), `cost_warnings`;
  `trend`, `kept_share` and `kept_sentence` read α along the window and against the share of tokens kept;
  `alpha_estimate` (α with its standard error) and `alpha_sentence` (α against temperature).

`greedy_rows` and `speed_grid` run `generate_fn` (default `speculative.speculative_generate`), so the notebook
checks and times the definition its own cells hold.

The prompts are `helpers.decode.speculative.prompts`; the sentences, the formula's prediction on a
bandwidth-bound target, the ledger and the figures made from these measurements are
`helpers.decode.speculative_report_lab`.
"""
from __future__ import annotations

import math
import statistics

import torch

from helpers.decode import speculative
from helpers.gpt.generation import KVCache, Sampler, generate, prefill, rewound_step
from helpers.gpt.model import GPT, PRESETS, GPTConfig
from helpers.measure import bench, clock as clocks, params, protocol
from helpers.measure.bench import sync


def check_temperatures(name: str, values) -> list[float]:
    """Validate a parameter holding temperatures: a non-empty list of finite numbers >= 0 (0 = greedy); returns
    them as sorted distinct floats. A string is read as a list literal first (`params.listed`). Raises ValueError
    naming the parameter."""
    values = params.listed(name, values)
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
           "GAMMAS": R("GAMMAS", GAMMAS, smoke=[1, 2, 4], full=[1, 2, 4, 8], check=params.positives),
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


def round_check(p: torch.Tensor, q: torch.Tensor, draws: int, accept=speculative.accept_prefix, seed: int = 0,
                threshold: float = 0.001) -> speculative.ChiSquare:
    """One verification step run `draws` times, one call at a time: x ~ q, then `accept(ps, [q], [x], g)` (the
    signature of speculative.accept_prefix, with ps = [p, p]); its first emitted token is counted and the counts
    chi-square tested against p (V,)."""
    g = torch.Generator().manual_seed(seed)
    ps, counts = torch.stack([p, p]), torch.zeros(len(p))
    for x in torch.multinomial(q, draws, replacement=True, generator=g).tolist():
        counts[accept(ps, [q], [x], g)[0]] += 1
    return speculative.chi_square(counts, p, threshold)


def greedy_rows(target: GPT, drafts: dict, prompt: torch.Tensor, n: int, gammas: list[int],
                generate_fn=speculative.speculative_generate) -> list[list]:
    """Rows [draft, γ, identical tokens, n, target passes, tie gap] of greedy speculative decoding (`generate_fn`)
    against the target's own greedy tokens (helpers.gpt.generation.generate) for every draft and γ. `tie gap` is
    None when all n tokens agree; else the target's top-1 minus top-2 logit at the first differing position (a gap
    at fp32 rounding's size means the two paths met a tie, which a (γ+1)-token pass and a 1-token pass may break
    apart)."""
    dev = next(target.parameters()).device
    want = generate(target, prompt.to(dev), n)[0].cpu()
    rows = []
    for name, draft in drafts.items():
        for gamma in gammas:
            got = generate_fn(target, draft, prompt, n, gamma=gamma, temperature=0)
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


def position_rows(runs: list, gamma: int, n: int, bins: int = 4) -> tuple[list[list], list[list]]:
    """From SpecResults at one γ: rows [window index i, positions verified, mean Σ min(p, q), acceptance rate
    given i was reached, the standard errors of those two] and rows [generated positions lo-hi, verified, mean
    Σ min(p, q)] in `bins` equal bins."""
    by_i, by_pos = [], []
    for i in range(gamma):
        sel = [(b, ok) for x in runs for b, w, ok in zip(x.betas, x.window, x.accepted_at) if w == i]
        if sel:
            m, k = len(sel), sum(ok for _, ok in sel) / len(sel)
            se = statistics.stdev(b for b, _ in sel) / math.sqrt(m) if m > 1 else 0.0
            by_i.append([i, m, sum(b for b, _ in sel) / m, k, se, math.sqrt(k * (1 - k) / m)])
    edges = [round(k * n / bins) for k in range(bins + 1)]
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = [b for x in runs for b, p in zip(x.betas, x.positions) if lo <= p < hi]
        if sel:
            by_pos.append([f"{lo}-{hi - 1}", len(sel), sum(sel) / len(sel)])
    return by_i, by_pos


def trend(values: list[float], ses: list[float]) -> str:
    """How a sequence moved from its first value to its last, said only where the difference exceeds twice its
    standard error (sqrt(se_first² + se_last²)): 'rose from a to b', 'fell from a to b', else that it cannot tell."""
    a, b = values[0], values[-1]
    if abs(b - a) > 2 * math.hypot(ses[0], ses[-1]):
        return f"{'rose' if b > a else 'fell'} from {a:.2f} to {b:.2f}"
    return f"went from {a:.2f} to {b:.2f}, within twice the standard error of the difference: cannot tell which way"


def kept_share(alpha: float, gamma: int) -> float:
    """The share of γ proposals a round keeps when each index is kept with probability α, independently, and the
    first rejection ends the round: (α + α² + … + α^γ) / γ = α(1 − α^γ) / (γ(1 − α)); 1 at α = 1."""
    return 1.0 if alpha >= 1 else alpha * (1 - alpha ** gamma) / (gamma * (1 - alpha))


def kept_sentence(rows: list[dict]) -> str:
    """Why α (mean Σ min(p, q)) and the share of draft tokens kept differ, from one draft's grid rows: the first
    rejection ends a round, so the kept share is the expected accepted prefix over γ; quoted at the smallest and
    the largest γ, at the highest temperature."""
    T = max(r["temperature"] for r in rows)
    lo, hi = (min((r for r in rows if r["temperature"] == T), key=lambda r: r["gamma"] * s) for s in (1, -1))
    at = [f"at γ={r['gamma']}, T={T:g}: α = {r['alpha']:.2f}, so {kept_share(r['alpha'], r['gamma']):.2f} kept by that "
          f"formula, {r['acceptance']:.2f} measured" for r in (lo, hi)]
    return ("α is the chance that the rule keeps a draft token once it judges it; the share of draft tokens kept is lower "
            "because the first rejection ends the round and the proposals after it are never judged. With every index "
            "kept at rate α, a round keeps α + α² + … + α^γ of its γ proposals on average: a share of "
            f"α(1 − α^γ)/(γ(1 − α)), equal to α only at γ = 1 ({at[0]}; {at[1]}).")


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


def _ngram_cost(prompt: torch.Tensor, n: int, gamma: int, target_ms: float, reps: int = 20) -> float:
    """c of the n-gram draft: ms of one lookup over a sequence of the generation's length, per drafted token,
    relative to the target's decode step."""
    seq = prompt.tolist() * (1 + n // max(len(prompt), 1))
    d = speculative.NGramDraft()
    with clocks.Stopwatch() as sw:  # Python on this thread: its CPU seconds, what target_ms is read on as well
        for _ in range(reps):
            d.propose(seq, gamma)
    return sw.cpu / reps / gamma * 1e3 / target_ms


def speed_grid(target: GPT, drafts: dict, prompt_list: list[torch.Tensor], n: int, gammas: list[int],
               temperatures: list[float], costs: dict, *, device: str = "cpu", seed: int = 0,
               progress=None, generate_fn=speculative.speculative_generate) -> list[dict]:
    """Every (draft, γ, temperature) generating n tokens with `generate_fn`, timed beside plain decoding of the
    target and of each GPT draft alone (helpers.gpt.generation.generate with the same sampler), round-robin: round
    r uses prompt r. Each generation is timed on the thread's CPU clock on a CPU with torch on one thread
    (`bench.resolve_clock`), so other work on the machine is left out; else on the wall clock, CUDA synchronised.

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

    thread = bench.resolve_clock(device) == clocks.THREAD  # a CPU with torch on one thread: the thread's own clock

    def timed(fn):
        sync(device)
        with clocks.Stopwatch() as sw:
            out = fn()
            sync(device)
        return (sw.cpu if thread else sw.wall), out

    rounds = range(len(prompt_list)) if progress is None else progress(range(len(prompt_list)))
    for r in rounds:
        prompt = prompt_list[r].to(device)
        for T in temperatures:
            before = timed(lambda: generate(target, prompt, n, Sampler(temperature=T, seed=seed + r)))[0]
            for name in models:
                alone_s[(name, T)].append(timed(lambda: generate(drafts[name], prompt, n, Sampler(T, seed=seed + r)))[0])
            for c in (c for c in configs if c[2] == T):
                s, res = timed(lambda: generate_fn(target, drafts[c[0]], prompt.cpu(), n, gamma=c[1], temperature=T,
                                                   seed=seed + r))
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
