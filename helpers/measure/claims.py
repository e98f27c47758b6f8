"""The claims ledger: each claim the course tests, this run's measurement and its verdict.

A notebook that tests a claim (from the source texts or a paper) records one verdict::

    claims.verdict("attention-mlp-gap", notebook="02",
                   claim="attention runs at ~45% efficiency and the MLP at ~75-80%: a universal ~1.7x gap",
                   source="a Japanese blog post on LLM scaling laws",
                   measured=f"MLP/attention efficiency ratio {lo:.2f}-{hi:.2f}", value=median, unit="x",
                   verdict="contradicted" if ... else "supported", reason="...")

The verdict is one of `VERDICTS`; "not testable" needs a reason (e.g. "needs FP8 tensor cores").
It is written as an ordinary record named `claim-<id>`, so it travels with the run's results and the
reference GPUs' (`results/<gpu>/`), and the report lists every such record in its ledger, beside the
same claim's verdict on each reference GPU. New notebooks add rows by calling `verdict`; the report
needs no change.
"""
from __future__ import annotations

import re
from typing import Any

from helpers.measure.results import record

VERDICTS = ("supported", "contradicted", "not testable")
PREFIX = "claim-"


def verdict(claim_id: str, *, notebook: str, claim: str, source: str, measured: str, verdict: str,
            reason: str = "", value: float | None = None, unit: str = "", quiet: bool = False) -> dict[str, Any]:
    """Record this run's verdict on one claim and return what was recorded.

    claim_id: short kebab-case key ("flash-speedup"), the same on every device so that runs match.
    notebook: "02"; measured: this run's number(s) in words; value/unit: the headline number, if any.
    Raises ValueError for a malformed id or notebook, an unknown verdict, an empty claim, source or
    measured text, or "not testable" without a reason.
    """
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
               "reason": reason.strip()}
    record(PREFIX + claim_id, metrics, quiet=True)
    if not quiet:
        print(f"claim {claim_id!r} ({source}): {verdict}; measured {measured}" + (f" ({reason})" if reason else ""))
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
