"""The claims ledger: each claim the course tests, this run's measurement, and the one rule that judges it.

A notebook that tests a claim (from the source texts or a paper) records one verdict::

    claims.verdict("attention-mlp-gap", notebook="02",
                   claim="attention runs at ~45% efficiency and the MLP at ~75-80%: a universal ~1.7x gap",
                   source="a Japanese blog post on LLM scaling laws",
                   measured=f"MLP/attention efficiency ratio {lo:.2f}-{hi:.2f}", value=median, unit="x",
                   spread=(lo, hi), claimed=(1.7 / 1.25, 1.7 * 1.25))

The notebook gives the number, its spread and the claimed range; `judge_interval`, the course's one verdict
rule, decides: a spread so wide that it reaches both sides of a claimed bound is "not testable" (never support),
a measurement close to the claim is never against it, and otherwise the median, the headline the notebook prints,
decides: above a claimed gain it is "exceeded" (an H200's 4.60x bf16 step is not "supported" by a claim of
1.5-2x), below it "contradicted". Only "not testable" is passed in, with the reason
(e.g. "needs FP8 tensor cores"). A verdict computed from formulas, not timed or counted (QLoRA's "65B on one
48 GB GPU"), passes basis="formula" and the ledger shows it as, say, "supported (by formula)".
It is written as an ordinary record named `claim-<id>` with its value, spread and claimed range, so it travels
with the run's results and the reference GPUs' (`results/<gpu>/`); the report lists every such record in its
ledger, beside the same claim on each reference GPU judged again by today's rule (`rejudge`).
"""
from __future__ import annotations

import re
from typing import Any

from helpers.measure.results import record

VERDICTS = ("supported", "exceeded", "contradicted", "not testable")
BASES = ("measured", "formula")
PREFIX = "claim-"


CLOSE = 0.10  # a measurement within 10% of a claimed bound is close to the claim: that gap never decides a verdict
MAX_SPREAD = 0.5  # a measured range wider than half its value is too wide to judge a claim whose bound it reaches across


def _finite(name: str, x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x or x in (float("inf"), float("-inf")):
        raise ValueError(f"{name}={x!r} must be a finite number")
    return float(x)


def judge_interval(value: float, lo: float, hi: float, claim_lo: float | None, claim_hi: float | None = None, *,
                   above: str = "exceeded", unit: str = "") -> tuple[str, str]:
    """The course's one verdict rule: (verdict, reason) on a claim of claim_lo to claim_hi for a measurement whose
    median is `value` and whose spread (an IQR, a ratio's IQR bounds, or value, value for a count) is lo to hi.

    1. The claimed range is widened by CLOSE at each bound (a measurement that close to a claim is not against it).
    2. A spread wider than MAX_SPREAD of the value that reaches across a widened bound is "not testable": noise
       that wide could carry the median to either side, so it can neither support nor contradict the claim,
       whatever the median says. A spread wholly on one side of each bound decides, however wide: every value
       in it gives the same verdict.
    3. Otherwise the median decides, so that the verdict agrees with the headline the notebook prints: inside
       the widened range "supported", above it `above` ("exceeded" for a claimed gain; pass "contradicted" for a
       claimed ceiling such as "fits in 48 GB"), below it "contradicted". A spread whose edge alone reaches the
       widened range does not decide: its quartiles move from run to run far more than its median does.
    claim_lo None: "at most claim_hi"; claim_hi None: "at least claim_lo" (never exceeded). Raises ValueError
    for non-finite numbers, value outside lo..hi, no bound at all, claim_hi < claim_lo or an unknown `above`.
    """
    value, lo, hi = _finite("value", value), _finite("lo", lo), _finite("hi", hi)
    if not lo <= value <= hi:
        raise ValueError(f"value={value!r} lies outside its spread {lo!r}-{hi!r}")
    if claim_lo is None and claim_hi is None:
        raise ValueError("a claim needs a bound: claim_lo, claim_hi or both")
    c_lo = None if claim_lo is None else _finite("claim_lo", claim_lo)
    c_hi = None if claim_hi is None else _finite("claim_hi", claim_hi)
    if c_lo is not None and c_hi is not None and c_hi < c_lo:
        raise ValueError(f"claim_hi={claim_hi!r} is below claim_lo={claim_lo!r}")
    if above not in ("exceeded", "contradicted"):
        raise ValueError(f"above={above!r}; choose 'exceeded' or 'contradicted'")
    scale = abs(value) or max(abs(c) for c in (c_lo, c_hi) if c is not None) or 1.0
    spread = (hi - lo) / scale
    claimed = (f"{c_lo:g}-{c_hi:g}{unit}" if c_lo is not None and c_hi is not None
               else f"at least {c_lo:g}{unit}" if c_lo is not None else f"at most {c_hi:g}{unit}")
    measured = f"{value:.3g}{unit} ({lo:.3g}-{hi:.3g})" if hi > lo else f"{value:.3g}{unit}"
    wide_lo = None if c_lo is None else c_lo - CLOSE * abs(c_lo)
    wide_hi = None if c_hi is None else c_hi + CLOSE * abs(c_hi)
    crosses = any(b is not None and lo < b < hi for b in (wide_lo, wide_hi))
    if spread > MAX_SPREAD and crosses:
        return "not testable", (f"this run's spread {lo:.3g}-{hi:.3g}{unit} is {100 * spread:.0f}% of its value and "
                                f"reaches both sides of the claimed {claimed}: too wide to judge it")
    whole = "the whole measured range" if not crosses else "the median of"
    if wide_hi is not None and value > wide_hi:
        return above, f"{whole} {measured} lies above the claimed {claimed}"
    if wide_lo is not None and value < wide_lo:
        return "contradicted", f"{whole} {measured} lies below the claimed {claimed}"
    return "supported", ""


def shown(row: dict[str, Any]) -> str:
    """A ledger row's verdict as the report shows it: "supported (by formula)" for a formula-only one."""
    v = str(row.get("verdict", "?"))
    return v + " (by formula)" if row.get("basis") == "formula" and v != "not testable" else v


def rejudge(row: dict[str, Any], claimed: dict[str, Any] | None = None) -> dict[str, Any]:
    """A recorded claim row judged again by today's rule (`judge_interval`), from its recorded value and spread
    (a point when it recorded none) and the claimed range it recorded, else `claimed` (this run's row of the same
    claim). Returns the row with the new verdict and reason, and "rejudged": the verdict it was recorded with when
    today's rule says otherwise; the row unchanged when it holds too little to judge (no number, no range, or a
    "not testable" verdict, whose reason is about the device)."""
    source = row.get("claimed") or (claimed or {}).get("claimed")
    value = row.get("value")
    if row.get("verdict") == "not testable" or not isinstance(source, dict) or isinstance(value, bool) \
            or not isinstance(value, (int, float)):
        return row
    lo, hi = row.get("spread") or (value, value)
    try:
        v, why = judge_interval(value, min(lo, value), max(hi, value), source.get("lo"), source.get("hi"),
                                above=source.get("above", "exceeded"),
                                unit=row.get("unit") if row.get("unit") in ("x", "%") else "")
    except (TypeError, ValueError):
        return row
    if v == row.get("verdict"):
        return row
    return {**row, "verdict": v, "reason": why, "rejudged": row.get("verdict")}


def verdict(claim_id: str, *, notebook: str, claim: str, source: str, measured: str,
            claimed: tuple[float | None, float | None] | None = None, value: float | None = None,
            spread: tuple[float, float] | None = None, above: str = "exceeded", verdict: str | None = None,
            reason: str = "", unit: str = "", basis: str = "measured", quiet: bool = False) -> dict[str, Any]:
    """Record this run's verdict on one claim and return what was recorded.

    claim_id: short kebab-case key ("flash-speedup"), the same on every device so that runs match.
    notebook: "02"; measured: this run's number(s) in words; value/unit: the headline number; spread: its
    (lo, hi) (an IQR, or a ratio's bounds; None for a count, which has none); claimed: the claim's (lo, hi),
    either None for an open side. The verdict is `judge_interval(value, *spread, *claimed, above=above)`:
    no notebook writes "supported" itself. Pass verdict="not testable" with the reason (what this device
    lacks) instead when the claim cannot be measured here; the claimed range is still recorded, so the report
    can judge a reference GPU's number by the same rule.
    basis: "measured" (timed or counted in this run) or "formula" (computed from formulas, with this
    run's measured inputs).
    Raises ValueError for a malformed id or notebook, an unknown verdict or basis, an empty claim, source
    or measured text, a verdict other than "not testable" passed in, a judged claim without a value or a
    claimed range, or "not testable" without a reason.
    """
    if basis not in BASES:
        raise ValueError(f"basis={basis!r}; choose one of {', '.join(map(repr, BASES))}")
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", claim_id or ""):
        raise ValueError(f"claim id {claim_id!r} must be kebab-case letters and digits, e.g. 'flash-speedup'")
    if not re.fullmatch(r"\d\d", str(notebook)):
        raise ValueError(f"notebook={notebook!r} must be a two-digit notebook number like '02'")
    if verdict is not None and verdict != "not testable":
        raise ValueError(f"verdict={verdict!r}: a notebook does not write its own verdict; pass value, spread and "
                         "claimed, and claims.judge_interval decides (only 'not testable' is passed, with its reason)")
    for name, text in (("claim", claim), ("source", source), ("measured", measured)):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{name} must be a non-empty sentence")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"value={value!r} must be a number or None")
    if claimed is not None and (not isinstance(claimed, (tuple, list)) or len(claimed) != 2):
        raise ValueError(f"claimed={claimed!r} must be (lo, hi), either None for an open side")
    if verdict is None:
        if value is None or claimed is None:
            raise ValueError("a judged claim needs value (the measured number) and claimed=(lo, hi)")
        lo, hi = spread if spread is not None else (value, value)
        verdict, why = judge_interval(value, lo, hi, claimed[0], claimed[1], above=above, unit=unit if unit in ("x", "%") else "")
        reason = "; ".join(r for r in (why, reason.strip()) if r)
    if verdict == "not testable" and not reason.strip():
        raise ValueError("a 'not testable' verdict needs the reason (what this device lacks)")
    metrics = {"id": claim_id, "notebook": str(notebook), "claim": claim.strip(), "source": source.strip(),
               "measured": measured.strip(), "value": value, "unit": unit, "verdict": verdict,
               "reason": reason.strip(), "basis": basis,
               "spread": None if spread is None else [float(spread[0]), float(spread[1])],
               "claimed": None if claimed is None else {"lo": claimed[0], "hi": claimed[1], "above": above}}
    record(PREFIX + claim_id, metrics, quiet=True)
    if not quiet:
        print(f"claim {claim_id!r} ({source}): {shown(metrics)}; measured {measured}" + (f" ({reason})" if reason else ""))
    return metrics


def from_records(records: dict[str, dict]) -> list[dict[str, Any]]:
    """The claim rows among loaded records ({name: record}), in notebook then id order.

    Records that look like claims but lack the fields are skipped; the report lists them as unreadable.
    """
    rows = []
    for name, rec in records.items():
        metrics = rec.get("metrics") if isinstance(rec, dict) else None
        if not name.startswith(PREFIX) or not isinstance(metrics, dict):
            continue
        if all(k in metrics for k in ("id", "notebook", "claim", "verdict")):
            rows.append({**metrics, "device": rec.get("device"), "profile": rec.get("profile"), "date": rec.get("date")})
    return sorted(rows, key=lambda r: (str(r["notebook"]), str(r["id"])))
