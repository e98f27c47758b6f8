"""A reference GPU's smoke-pass record, `gpu-smoke.json` in `results/<gpu>/`, as the report reads it.

The maintainers' smoke pass (`python -m tools.capture.gpu_smoke`, not part of the installed package) runs
every notebook at smoke sizes on a lent GPU and imports its record here; the report says per notebook
whether, and when, it has run on that GPU. `SMOKE_FILE` is the record's name, `load` reads it and
`line_for` is the report's sentence for one notebook.
"""
from __future__ import annotations

import json
from pathlib import Path

from helpers.measure.params import is_finite_number

SMOKE_FILE = "gpu-smoke.json"


def load(reference_dir: Path, problems: list | None = None) -> dict | None:
    """A reference folder's gpu-smoke.json, cleaned for the report, or None when absent or unusable; a file that
    is there but cannot be used is appended to `problems` as (path, reason), as the report lists unreadable records.

    Cleaned: only notebooks whose entry is an object are kept (a bare `"01": "ok"` is named in `problems`), a
    status is text, seconds a finite number or None, started text."""
    path = Path(reference_dir) / SMOKE_FILE
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        if problems is not None:
            problems.append((path, f"not readable as JSON ({type(err).__name__})"))
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("notebooks"), dict):
        if problems is not None:
            problems.append((path, "not a smoke-pass record (no notebooks)"))
        return None
    notebooks = {}
    for nb, o in doc["notebooks"].items():
        if not isinstance(o, dict):
            if problems is not None:
                problems.append((path, f"notebook {nb!r}: {o!r} is not a smoke-pass entry"))
            continue
        seconds = o.get("seconds")
        notebooks[str(nb)] = {**o, "status": str(o.get("status") or "?"),
                              "seconds": seconds if is_finite_number(seconds) else None}
    return {**doc, "started": str(doc.get("started") or "?"), "notebooks": notebooks}


def line_for(notebook: str, doc: dict | None, gpu: str) -> str | None:
    """One sentence for the report: whether `notebook` ran on `gpu` in its smoke pass, when, and how."""
    if doc is None:
        return None
    o = doc["notebooks"].get(notebook)
    when = str((o or {}).get("started") or doc.get("started", "?"))[:10]  # merged passes: the notebook's own
    if o is None:
        return f"Not in the smoke pass on {gpu} ({when})."
    took = f" ({o['seconds']:.0f} s)" if o.get("seconds") is not None else ""
    if o.get("status") == "ok":
        return f"Ran on {gpu} in the smoke profile on {when}: every cell ran{took}."
    where = f" at cell {o['cell']}" if o.get("cell") else ""
    first = str(o.get("error") or "").splitlines()[:1]
    return f"Smoke pass on {gpu} ({when}): {o.get('status')}{where}" + (f": {first[0]}" if first else "") + "."
