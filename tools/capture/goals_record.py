"""A GPU's performance goals as kept beside its references: `results/<gpu>/goals.json` and its table in README.md.

`tools.capture.goals` measures the goals on a lent GPU and writes one `goals.json` a run. A window rarely holds
every goal: a run ends on its budget, a fix is re-run on a few goals in the next call. `import_goals` therefore
merges a run over the record already there for that GPU (`merge_goals`): each goal keeps its latest outcome,
stamped with the start of the run it comes from, except that a goal the later run did not start (skipped on the
budget, or not run) keeps the earlier outcome; a replaced outcome is kept under the goal's "earlier". It then
writes the goals' table into the folder's README.md (`goals_section`), after the smoke pass's.
"""
from __future__ import annotations

import json
from pathlib import Path

from helpers.measure.results import REPO_ROOT, write_atomic
from helpers.show.tables import table
from tools.capture.capture import GOALS_MARK, earlier_record, set_section, slug_of_gpu

NOT_STARTED = ("skipped", "not run")  # outcomes that say nothing about the goal: an earlier one is kept over them


def _stamped(doc: dict) -> dict[str, dict]:
    """A goals.json's goals by key, each with the start of its run ("run_started", unless it has one)."""
    return {g["goal"]: {**g, "run_started": g.get("run_started") or doc.get("started")}
            for g in doc["goals"] if isinstance(g, dict) and isinstance(g.get("goal"), str)}


def merge_goals(earlier: dict | None, later: dict) -> dict:
    """`later` (a goals.json) over `earlier` (the record already imported for the same GPU, or None): per goal the
    later outcome, unless the later run did not start it; a replaced outcome under "earlier" (status, ratio, met,
    reason, run_started). Goals in the order the later run planned them, then the others; the doc's own facts are
    the later run's, with "runs": the start of every run merged in."""
    merged = _stamped(earlier) if earlier else {}
    for key, g in _stamped(later).items():
        before = merged.get(key)
        if before is not None and g.get("status") in NOT_STARTED:
            continue
        if before is not None:
            g = {**g, "earlier": {k: before.get(k) for k in ("status", "ratio", "met", "reason", "run_started")}}
        merged[key] = g
    order = [k for k in later.get("planned", []) if k in merged] + sorted(k for k in merged
                                                                          if k not in later.get("planned", []))
    earlier_runs = (earlier.get("runs") or [earlier.get("started")]) if earlier else []
    runs = sorted({*earlier_runs, later.get("started")} - {None})
    return {**later, "runs": runs, "goals": [merged[k] for k in order]}


def _measured(g: dict) -> str:
    if g.get("status") == "measured" and g.get("ratio") is not None:
        return f"{g['ratio']:.3g} ({g.get('headline', '')})"
    reason = (str(g.get("reason") or "").splitlines() or ["-"])[0][:70]
    return f"{g.get('status', '?')}: {reason}"


def goals_section(doc: dict) -> str:
    """The goals as a README section: per goal its notebook, what it measured (the ratio and what it is of), the
    target, whether it was met, and the start of the run it comes from."""
    rows = [[g.get("notebook", "?"), g["goal"], _measured(g), g.get("target") or "-",
             {True: "yes", False: "no"}.get(g.get("met"), "-"), str(g.get("run_started") or "?")[:16]]
            for g in sorted(doc["goals"], key=lambda g: (g.get("notebook", ""), g["goal"]))]
    met = sum(g.get("met") is True for g in doc["goals"])
    measured = sum(g.get("status") == "measured" for g in doc["goals"])
    return (f"{GOALS_MARK}\n## The performance goals on this GPU\n\n"
            f"Each technique notebook's goal for what it should buy on this GPU, measured by `python -m "
            f"tools.capture.goals` in {len(doc.get('runs', [])) or 1} run(s): {measured} of {len(rows)} measured, "
            f"{met} met (goals.json beside this file; a goal a later run did not start keeps its earlier outcome).\n\n"
            "```\n" + table(["notebook", "goal", "measured", "target", "met", "run started"], rows) + "\n```\n")


def import_goals(path: Path, into: Path = REPO_ROOT / "results", device: str | None = None) -> Path:
    """Merge a `goals.json` (tools.capture.goals) into `into/<device>/goals.json` (`merge_goals`) and write its table
    into that folder's README.md; returns the json's path. The device is `device`, else the GPU its run names.
    Raises ValueError when the file is not a goals.json."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not readable as JSON ({err})") from err
    if not isinstance(doc, dict) or not isinstance(doc.get("goals"), list):
        raise ValueError(f"{path}: not a goals.json (no list of goals)")
    device = device or doc.get("machine", {}).get("gpu") or "none (CPU)"
    target = Path(into) / slug_of_gpu("CPU" if device.startswith("none") else device)
    target.mkdir(parents=True, exist_ok=True)
    doc = merge_goals(earlier_record(target / "goals.json", "goals", list), doc)
    out = write_atomic(target / "goals.json", json.dumps(doc, indent=1) + "\n")
    set_section(target / "README.md", GOALS_MARK, goals_section(doc), f"# Reference: {device}")
    return out
