"""The course-wide report of a run: summary, recorded results beside reference GPUs, and the plots."""
from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any, Iterable

from .results import load_results

Block = tuple  # ("h1"|"h2"|"h3"|"p", text) | ("table", header, rows) | ("img", relative path)


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        if len(value) <= 8 and all(not isinstance(v, (list, dict)) for v in value):
            return "[" + ", ".join(_fmt(v) for v in value) + "]"
        return f"[{len(value)} values]"
    return str(value)


def flatten(metrics: dict, prefix: str = "") -> dict[str, str]:
    """Nested metrics -> {'a.b': formatted value}."""
    out: dict[str, str] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = _fmt(value)
    return out


def extract_figures(notebook: Path, figures_dir: Path) -> list[Path]:
    """Save every PNG output of an executed notebook; return the files in order."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    saved = []
    for i, cell in enumerate(nb.cells):
        for k, out in enumerate(cell.get("outputs", [])):
            data = out.get("data", {}).get("image/png")
            if data:
                figures_dir.mkdir(parents=True, exist_ok=True)
                path = figures_dir / f"{notebook.stem}-cell{i:02d}-{k}.png"
                path.write_bytes(base64.b64decode(data))
                saved.append(path)
    return saved


def reference_sets(references: Path) -> dict[str, dict[str, dict]]:
    """{gpu folder name: {record name: record}} for every sub-folder of `references` with records."""
    if not references.is_dir():
        return {}
    sets = {d.name: load_results(d) for d in sorted(references.iterdir()) if d.is_dir()}
    return {k: v for k, v in sets.items() if v}


def build_blocks(run_dir: Path, outcomes: Iterable, references: Path, profile: str) -> list[Block]:
    """Everything the report says, as blocks that both renderers understand."""
    from .hardware import library_versions
    from .results import device_name
    from .run import failure_text

    outcomes = list(outcomes)
    mine = load_results(run_dir / "results")
    refs = reference_sets(references)
    blocks: list[Block] = [
        ("h1", f"Course run report: {run_dir.name}"),
        ("p", f"Device: {device_name()}. Profile asked for: {profile}. "
              + "Versions: " + ", ".join(f"{k} {v}" for k, v in library_versions().items()) + "."),
        ("h2", "Notebooks"),
        ("table", ["notebook", "status", "seconds", "failure"],
         [[o.notebook, "ok" if o.ok else "FAILED", f"{o.seconds:.1f}", failure_text(o)] for o in outcomes]),
        ("h2", "Recorded results"),
    ]
    if not mine:
        blocks.append(("p", "No notebook recorded a result in this run."))
    if refs:
        blocks.append(("p", "Reference columns come from results/<gpu>/ in the repository: "
                            + ", ".join(refs) + "."))
    for name, rec in mine.items():
        ref_cols = [(gpu, recs[name]) for gpu, recs in refs.items() if name in recs]
        header = ["metric", f"this run ({rec.get('profile')}, {rec.get('device')})"]
        header += [f"{gpu} ({r.get('date', '?')[:10]}, {r.get('profile')})" for gpu, r in ref_cols]
        mine_flat = flatten(rec.get("metrics", {}))
        ref_flats = [flatten(r.get("metrics", {})) for _, r in ref_cols]
        keys = list(mine_flat) + [k for f in ref_flats for k in f if k not in mine_flat]
        keys = list(dict.fromkeys(keys))
        rows = [[k, mine_flat.get(k, "")] + [f.get(k, "") for f in ref_flats] for k in keys]
        blocks += [("h3", name + (f" (dtype {rec['dtype']})" if rec.get("dtype") else "")), ("table", header, rows)]
    blocks.append(("h2", "Figures"))
    for nb in sorted((run_dir / "notebooks").glob("*.ipynb")):
        figs = extract_figures(nb, run_dir / "figures")
        if figs:
            blocks.append(("h3", nb.stem))
            blocks += [("img", str(f.relative_to(run_dir))) for f in figs]
    return blocks


def to_markdown(blocks: list[Block]) -> str:
    """Render blocks as GitHub-flavoured Markdown."""
    lines: list[str] = []
    for b in blocks:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            lines += ["#" * int(kind[1]) + " " + b[1], ""]
        elif kind == "p":
            lines += [b[1], ""]
        elif kind == "table":
            header, rows = b[1], b[2]
            cell = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
            lines.append("| " + " | ".join(map(cell, header)) + " |")
            lines.append("|" + "---|" * len(header))
            lines += ["| " + " | ".join(map(cell, r)) + " |" for r in rows]
            lines.append("")
        elif kind == "img":
            lines += [f"![{Path(b[1]).stem}]({b[1]})", ""]
    return "\n".join(lines)


def to_html(blocks: list[Block], run_dir: Path) -> str:
    """Render blocks as one self-contained HTML page (figures inlined)."""
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>Course run report</title><style>"
             "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;"
             "text-align:left;font-size:13px}th{background:#f3f3f3}img{max-width:100%;margin:0.5em 0}"
             "</style></head><body>"]
    esc = html.escape
    for b in blocks:
        kind = b[0]
        if kind in ("h1", "h2", "h3", "p"):
            parts.append(f"<{kind}>{esc(b[1])}</{kind}>")
        elif kind == "table":
            head = "".join(f"<th>{esc(str(h))}</th>" for h in b[1])
            body = "".join("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in r) + "</tr>" for r in b[2])
            parts.append(f"<table><tr>{head}</tr>{body}</table>")
        elif kind == "img":
            data = base64.b64encode((run_dir / b[1]).read_bytes()).decode()
            parts.append(f"<img alt='{esc(b[1])}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(run_dir: Path, outcomes: Iterable, references: Path, profile: str = "auto") -> tuple[Path, Path]:
    """Write report.md and report.html into `run_dir`; return their paths."""
    blocks = build_blocks(Path(run_dir), outcomes, Path(references), profile)
    md, page = Path(run_dir) / "report.md", Path(run_dir) / "report.html"
    md.write_text(to_markdown(blocks))
    page.write_text(to_html(blocks, Path(run_dir)))
    return md, page
