"""The claims ledger: each claim the course tests, this run's measurement and its verdict.

A notebook that tests a claim (from the source texts or a paper) records one verdict::

    claims.verdict("attention-mlp-gap", notebook="02",
                   claim="attention runs at ~45% efficiency and the MLP at ~75-80%: a universal ~1.7x gap",
                   source="a Japanese blog post on LLM scaling laws",
                   measured=f"MLP/attention efficiency ratio {lo:.2f}-{hi:.2f}", value=median, unit="x",
                   verdict="contradicted" if ... else "supported", reason="...")

The verdict is one of `VERDICTS`; "not testable" needs a reason (e.g. "needs FP8 tensor cores").
A claim that states a range is judged by `judge`: "exceeded" above it (an H200's 4.60x bf16 step is
not "supported" by a claim of 1.5-2x), "supported" within it, "contradicted" below it. A verdict
computed from formulas, not timed or counted (QLoRA's "65B on one 48 GB GPU"), passes basis="formula"
and the ledger shows it as, say, "supported (by formula)".
It is written as an ordinary record named `claim-<id>`, so it travels with the run's results and the
reference GPUs' (`results/<gpu>/`), and the report lists every such record in its ledger, beside the
same claim's verdict on each reference GPU. New notebooks add rows by calling `verdict`; the report
needs no change.
"""
from __future__ import annotations

import re
from typing import Any

from helpers.measure.results import record

VERDICTS = ("supported", "exceeded", "contradicted", "not testable")
BASES = ("measured", "formula")
PREFIX = "claim-"


def judge(value: float, lo: float, hi: float | None = None) -> str:
    """The verdict on a claim of "lo to hi" (hi None: "at least lo") for a measured value: "exceeded" above
    hi, "supported" from lo to hi, "contradicted" below lo. Raises ValueError for a non-finite value or
    bounds, or hi < lo."""
    for name, x in (("value", value), ("lo", lo)) + ((("hi", hi),) if hi is not None else ()):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x or x in (float("inf"), float("-inf")):
            raise ValueError(f"{name}={x!r} must be a finite number")
    if hi is not None and hi < lo:
        raise ValueError(f"hi={hi!r} is below lo={lo!r}")
    if hi is not None and value > hi:
        return "exceeded"
    return "supported" if value >= lo else "contradicted"


def shown(row: dict[str, Any]) -> str:
    """A ledger row's verdict as the report shows it: "supported (by formula)" for a formula-only one."""
    v = str(row.get("verdict", "?"))
    return v + " (by formula)" if row.get("basis") == "formula" and v != "not testable" else v


def judge_range(value: float, lo: float, hi: float, claim_lo: float, claim_hi: float | None) -> tuple[str, str]:
    """(verdict, reason) on a claim of claim_lo-claim_hi for a value known only to lie in [lo, hi] (its IQR or
    range): `judge`'s verdict when lo and hi get the same one (the whole range is below, within or above the
    claim), else "not testable", with the reason that the range spans a bound of the claim (this run's noise
    cannot decide it). Raises ValueError when value lies outside [lo, hi]."""
    if not lo <= value <= hi:
        raise ValueError(f"value={value!r} lies outside its range {lo!r}-{hi!r}")
    low, high = judge(lo, claim_lo, claim_hi), judge(hi, claim_lo, claim_hi)
    if low == high:
        return low, ""
    bound = claim_lo if low == "contradicted" else claim_hi
    return "not testable", (f"the range {lo:.2f}-{hi:.2f}x around {value:.2f}x spans the claim's bound of {bound:g}x, "
                            "so this run's noise cannot decide it")

def verdict(claim_id: str, *, notebook: str, claim: str, source: str, measured: str, verdict: str,
            reason: str = "", value: float | None = None, unit: str = "", basis: str = "measured",
            quiet: bool = False) -> dict[str, Any]:
    """Record this run's verdict on one claim and return what was recorded.

    claim_id: short kebab-case key ("flash-speedup"), the same on every device so that runs match.
    notebook: "02"; measured: this run's number(s) in words; value/unit: the headline number, if any;
    basis: "measured" (timed or counted in this run) or "formula" (computed from formulas, with this
    run's measured inputs).
    Raises ValueError for a malformed id or notebook, an unknown verdict or basis, an empty claim, source
    or measured text, or "not testable" without a reason.
    """
    if basis not in BASES:
        raise ValueError(f"basis={basis!r}; choose one of {', '.join(map(repr, BASES))}")
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", claim_id or ""):
        raise ValueError(f"claim id {claim_id!r} must be kebab-case letters and digits, e.g. 'flash-speedup'")
    if not re.fullmatch(r"\d\d", str(notebook)):
        raise ValueError(f"notebook={notebook!r} must be a two-digit notebook number like '02'")
    if verdict not in VERDICTS:
        raise ValueError(f"verdict={verdict!r}; choose one of {', '.join(map(repr, VERDICTS))}")
    for name, text in (("claim", claim), ("source", source), ("measured", measured)):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{name} must be a non-empty sentence")
    if verdict == "not testable" and not reason.strip():
        raise ValueError("a 'not testable' verdict needs the reason (what this device lacks)")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"value={value!r} must be a number or None")
    metrics = {"id": claim_id, "notebook": str(notebook), "claim": claim.strip(), "source": source.strip(),
               "measured": measured.strip(), "value": value, "unit": unit, "verdict": verdict,
               "reason": reason.strip(), "basis": basis}
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
            rows.append({**metrics, "device": rec.get("device"), "profile": rec.get("profile")})
    return sorted(rows, key=lambda r: (str(r["notebook"]), str(r["id"])))
