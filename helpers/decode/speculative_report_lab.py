"""Notebook 11's measurements read: sentences, the formula's prediction on a bandwidth-bound target, the ledger's
verdicts and the figures, from what `helpers.decode.speculative_lab` measured.

* Reading the speed grid: `gap_sentence` (measured tokens per pass against the formula), `outside`,
  `slow_lines` (where speculation was slower than plain decoding, and why), `lookup_sentence`.
* A bandwidth-bound target (α from `speculative_lab.alpha_estimate`): `formula_rows` (the formula's
  speedup per γ from measured α, c and v, with a range), `bound_state`, `bound_sentence`, `verification_clause`,
  `cost_sentence`, `prediction_sentence`.
* Sentences that rank only what the spread separates: `best_sentence`, `against_plain`.
* The ledger: `CLAIMS` (Leviathan et al., 2023; Chen et al., 2023), `claim_rows`, and `formula_claim`
  (`FORMULA_CLAIM`): claims.verdict's keyword arguments, judged by `helpers.measure.claims.judge_interval`.
* Figures: `exactness_figure`, `speedup_figure`, `prediction_figure`, `panel_figure`.
"""
from __future__ import annotations

import torch

from helpers.decode import speculative, speculative_lab
from helpers.measure import protocol
from helpers.show import plots


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
    by_i, _ = speculative_lab.position_rows(row[(G, T)]["runs"], G, 10 ** 9, bins=1)
    kept = ", ".join(f"{r[3]:.2f}" for r in by_i)
    a = row[(G, T)]["alpha"]
    first = ("; the first index, which every round reaches, was kept less often than α, and the higher shares "
             "further on count only in rounds that got past it" if by_i and by_i[0][3] < a else "")
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


def slow_lines(rows: list[dict], verify: dict) -> list[str]:
    """The draft GPT's grid rows read against plain decoding: a line counting the rows slower (IQR below 1x), faster
    (IQR above 1x) and within the noise, then a line per slower row naming the causes that reach their marks: γc of a
    step spent drafting against the extra tokens per pass, α below 0.5, a verification above 1.2 decode steps
    (`verify`: {γ: decode steps}), more than a quarter of a plain token's time outside the models' passes."""
    slow = [r for r in rows if r["speedup_q75"] < 1]
    fast = [r for r in rows if r["speedup_q25"] > 1]
    out = [f"of {len(rows)} draft-GPT configurations, {len(slow)} were slower than plain decoding (IQR below 1x), "
           f"{len(fast)} faster (IQR above 1x) and {len(rows) - len(slow) - len(fast)} within the noise of it (IQR holds 1x)."]
    for r in slow:
        why = []
        if r["gamma"] * r["c"] >= r["tokens_per_pass"] - 1:
            why.append(f"γc = {r['gamma'] * r['c']:.2f} of a target step spent drafting, against {r['tokens_per_pass'] - 1:.2f} extra tokens per pass")
        if r["alpha"] < 0.5:
            why.append(f"low acceptance (α = {r['alpha']:.2f})")
        if verify[r["gamma"]] > 1.2:
            why.append(f"verification costs {verify[r['gamma']]:.2f} decode steps")
        if r["other_ms_per_token"] > 0.25 * r["plain_ms_per_token"]:
            why.append(f"{max(0.0, r['other_ms_per_token']):.2f} ms per token outside the models' passes (sampling, the rule, rollbacks), "
                       f"against {r['plain_ms_per_token']:.2f} ms for a whole plain token")
        if not why:  # the marks: γc ≥ the extra tokens per pass, α < 0.5, v > 1.2 steps, outside > 1/4 of a plain token
            why.append(f"none of the four causes reaches its mark alone; together: γc = {r['gamma'] * r['c']:.2f}, α = "
                       f"{r['alpha']:.2f}, verification {verify[r['gamma']]:.2f} steps, {outside(r)} per token outside the passes")
        out.append(f"  γ={r['gamma']}, T={r['temperature']:g}: {r['speedup']:.2f}x (IQR {r['speedup_q25']:.2f}-{r['speedup_q75']:.2f}); "
                   + "; ".join(why))
    return out


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


def bound_state(lo: float, hi: float, ceiling: float, share: float = 0.3) -> str:
    """Whether a decode step that streams its weights at lo-hi GB/s (the IQR-bounded range) is bound by reading
    them: "bound" when even `lo` reaches `share` of the copy `ceiling`, "overhead" when even `hi` stays below it
    (other work, per-call overhead or arithmetic, adds to it), "unclear" when the range holds the mark."""
    return "bound" if lo >= share * ceiling else "overhead" if hi < share * ceiling else "unclear"


def bound_sentence(gbps: float, ceiling: float, preset: str, share: float = 0.3,
                   spread: tuple[float, float] | None = None) -> str:
    """Whether a decode step that reads its weights at `gbps` (IQR-bounded `spread`, GB/s; none: a point) is bound
    by reading them (`bound_state`): at least `share` of the copy ceiling (GB/s) says so; below it, other work
    adds to the step, and the c measured on it is not a large target's; a range across the mark cannot tell."""
    lo, hi = spread or (gbps, gbps)
    state = bound_state(lo, hi, ceiling, share)
    if state == "bound":
        return (f"the {preset} step streams its weights at {gbps / ceiling:.0%} of the copy ceiling: reading weights, "
                "not per-call overhead, sets its cost")
    if state == "overhead":
        return (f"the {preset} step streams its weights at only {gbps / ceiling:.0%} of the copy ceiling: here "
                "reading weights does not set its cost alone (per-call overhead and arithmetic add to it), so this c "
                "is not what a large target would see")
    return (f"the {preset} step streams its weights at {gbps / ceiling:.0%} of the copy ceiling ({lo / ceiling:.0%}-"
            f"{hi / ceiling:.0%}, across the {share:.0%} mark): this run cannot tell whether reading weights alone or "
            "other work (per-call overhead, arithmetic) sets its cost")


def verification_clause(v: protocol.Ratio, gamma: int, preset: str, state: str) -> str:
    """What the measured cost v of verifying γ + 1 tokens says beside `bound_state`'s `state` for the same step: where
    its IQR-bounded range lies above one step, the extra tokens' work adds to what reading the weights costs (the
    formula's v = 1 does not hold here, and the formula takes the measured v); else about one step, as it should."""
    head = f"verifying {gamma + 1} tokens cost {v.value:.2f} {preset} steps (IQR-bounded {v.lo:.2f}-{v.hi:.2f})"
    if v.lo > 1:
        return (("yet " if state == "bound" else "") + head + f": the {gamma} extra tokens added {v.value - 1:.2f} of a "
                "step, where a step set by reading its weights alone would add about none (the formula's v = 1), so the "
                "formula here takes this v")
    return head + ": about one step, as for a step bound by reading its weights"


def cost_sentence(gbps: float, ceiling: float, preset: str, spread: tuple[float, float], v: protocol.Ratio,
                  gamma: int) -> str:
    """`bound_sentence` and `verification_clause` for one timed target, as one sentence."""
    state = bound_state(spread[0], spread[1], ceiling)
    return bound_sentence(gbps, ceiling, preset, spread=spread) + "; " + verification_clause(v, gamma, preset, state)


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


def claim_rows(evidence: dict, *, basis: str, identical: str, untestable: str | None = None) -> list[dict]:
    """The keyword arguments of `claims.verdict` (notebook "11") for the two speedup claims in CLAIMS.

    evidence: {"greedy": e, "sampled": e}, e None (not testable: no such temperature in this run) or a dict
    with value (the speedup), lo, hi (its range), gamma, temperature, and, for basis "formula", alpha, c, v,
    target. basis: "measured" (e from the timed grid: lo, hi its IQR) or "formula" (e from `formula_rows`: lo, hi
    the range its measured inputs give, α ± its standard error and the IQR bounds of c and v). identical: the
    greedy identity check's result in words. Each row carries value, spread (lo, hi) and the claimed range, and
    `claims.judge_interval` decides: a formula fed with noisy inputs has a wide range, which is "not testable"
    every time, never a verdict. untestable: a reason this run's inputs cannot speak for the claim at all (a
    target whose step per-call overhead, not its weights, sets: its c and v are not a large model's), then every
    row is "not testable" with it, its numbers still recorded."""
    out = []
    for cid, lo, hi, kind, claim, source in CLAIMS:
        e = evidence.get(kind)
        row = {"notebook": "11", "claim": claim, "source": source, "unit": "x", "basis": basis, "claimed": (lo, hi)}
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
        judged = {"verdict": "not testable", "reason": untestable} if untestable else {"reason": reason}
        out.append({**row, "claim_id": cid, "measured": text, "value": e["value"],
                    "spread": (min(e["lo"], e["value"]), max(e["hi"], e["value"])), **judged})
    return out


FORMULA_CLAIM = dict(notebook="11", claim="measured speedup within 15% of (1 − α^(γ+1))/((1 − α)(γc + 1)) for γ = 1..8 "
                     "at temperature 0", source="Leviathan et al., 2023, Theorem 3.8 (the formula); the course's GPU target",
                     unit="x", claimed=(0.85, 1.15), above="contradicted")


def formula_claim(rows: list[dict], best: dict, on_gpu: bool) -> dict:
    """The keyword arguments of `claims.verdict` for FORMULA_CLAIM from the grid rows of the draft GPT at one
    temperature: the row furthest from the formula (the claim holds for every γ), its measured / formula speedup
    as the value and its IQR over the formula as the spread, judged by `claims.judge_interval` (above the
    widened range is against "within 15%" too). `best`: the highest-median row (`best_sentence`), quoted with c.
    On a CPU the claim is the GPU target's: "not testable", its numbers still recorded."""
    worst = max(rows, key=lambda r: abs(r["speedup"] / r["predicted"] - 1))
    p = worst["predicted"]
    measured = (f"at T={worst['temperature']:g}, γ={rows[0]['gamma']}..{rows[-1]['gamma']}: measured/formula speedup "
                f"furthest at γ={worst['gamma']}, {worst['speedup'] / p:.2f} (IQR {worst['speedup_q25'] / p:.2f}-"
                f"{worst['speedup_q75'] / p:.2f}); highest median {best['speedup']:.2f}x (IQR {best['speedup_q25']:.2f}-"
                f"{best['speedup_q75']:.2f}) at γ={best['gamma']}; c = {best['c']:.2f} ({1 / best['c']:.1f}x cheaper draft)")
    kw = dict(FORMULA_CLAIM, measured=measured, value=worst["speedup"] / p,
              spread=(min(worst["speedup_q25"], worst["speedup"]) / p, max(worst["speedup_q75"], worst["speedup"]) / p))
    if not on_gpu:
        kw |= {"verdict": "not testable", "reason": "the claim is the course's target for a GPU, and this run has none"}
    return kw


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
