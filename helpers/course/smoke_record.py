"""A reference GPU's smoke-pass record, `gpu-smoke.json` in `results/<gpu>/`, as the report reads it.

The maintainers' smoke pass (`python -m tools.capture.gpu_smoke`, not part of the installed package) runs
every notebook at smoke sizes on a lent GPU and imports its record here; the report says per notebook
whether, and when, it has run on that GPU. `SMOKE_FILE` is the record's name, `load` reads it and
`line_for` is the report's sentence for one notebook.
"""
from __future__ import annotations

import json
from pathlib import Path

SMOKE_FILE = "gpu-smoke.json"


def load(reference_dir: Path) -> dict | None:
    """A reference folder's gpu-smoke.json, or None when absent or unreadable."""
    try:
        doc = json.loads((Path(reference_dir) / SMOKE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("notebooks"), dict) else None


def line_for(notebook: str, doc: dict | None, gpu: str) -> str | None:
    """One sentence for the report: whether `notebook` ran on `gpu` in its smoke pass, when, and how."""
    if doc is None:
        return None
    o = doc["notebooks"].get(notebook)
    when = str(doc.get("started", "?"))[:10]
    if o is None:
        return f"Not in the smoke pass on {gpu} ({when})."
    if o.get("status") == "ok":
        return f"Ran on {gpu} in the smoke profile on {when}: every cell ran ({o.get('seconds', 0):.0f} s)."
    where = f" at cell {o['cell']}" if o.get("cell") else ""
    first = str(o.get("error") or "").splitlines()[:1]
    return f"Smoke pass on {gpu} ({when}): {o.get('status')}{where}" + (f": {first[0]}" if first else "") + "."
