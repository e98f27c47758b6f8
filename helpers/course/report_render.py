"""The report's blocks written out: `to_markdown` (report.md) and `to_html` (report.html, one file with its
figures inlined as PNG data and verdict cells coloured by `VERDICT_CLASS`).

A block is a tuple: ("h1"|"h2"|"h3"|"p", text) | ("table", header, rows) | ("img", relative path)
| ("fig", relative path, caption) | ("details", summary line) ... ("/details",); `helpers.course.report`
builds them.
"""
from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

Block = tuple  # one block of the report, as the module's docstring lists them


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
        elif kind == "fig":
            lines += [f"![{b[2]}]({b[1]})", "", f"*Figure: {b[2]}*", ""]
        elif kind == "details":  # GitHub renders the Markdown inside when blank lines surround it
            lines += [f"<details><summary>{html.escape(b[1])}</summary>", ""]
        elif kind == "/details":
            lines += ["</details>", ""]
    return "\n".join(lines)


VERDICT_CLASS = {"supported": "ok", "exceeded": "ok", "contradicted": "bad", "not testable": "na"}
CSS = ("body{font-family:system-ui,sans-serif;max-width:1150px;margin:2em auto;padding:0 1em;color:#222;"
       "line-height:1.45}h1{font-size:1.6em}h2{margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}"
       ".scroll{overflow-x:auto}table{border-collapse:collapse;margin:.5em 0 1.5em}"
       "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top;font-size:13px}"
       "th{background:#f3f3f3}td.ok{background:#e3f4e3}td.bad{background:#fbe3e3}td.na{background:#f1f1f1}"
       "figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:13px;color:#555}"
       "img{max-width:100%}details{margin:1.5em 0}summary{cursor:pointer;font-weight:600;font-size:1.1em}")


def _td(cell: Any) -> str:
    text = str(cell)
    kind = next((c for v, c in VERDICT_CLASS.items() if text.startswith(v)), None)
    return (f"<td class='{kind}'>" if kind else "<td>") + html.escape(text) + "</td>"


def _png(run_dir: Path, rel: str) -> str | None:
    try:
        return base64.b64encode((run_dir / rel).read_bytes()).decode()
    except OSError:
        return None


def to_html(blocks: list[Block], run_dir: Path) -> str:
    """Render blocks as one self-contained HTML page (figures inlined, no external resource)."""
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Course run report</title>"
             f"<style>{CSS}</style></head><body>"]
    esc = html.escape
    for b in blocks:
        kind = b[0]
        if kind in ("h1", "h2", "h3", "p"):
            parts.append(f"<{kind}>{esc(b[1])}</{kind}>")
        elif kind == "table":
            head = "".join(f"<th>{esc(str(h))}</th>" for h in b[1])
            body = "".join("<tr>" + "".join(_td(c) for c in r) + "</tr>" for r in b[2])
            parts.append(f"<div class='scroll'><table><tr>{head}</tr>{body}</table></div>")
        elif kind in ("img", "fig"):
            data = _png(run_dir, b[1])
            caption = b[2] if kind == "fig" else Path(b[1]).stem
            if data is None:
                parts.append(f"<p>figure {esc(b[1])} could not be read</p>")
            else:
                parts.append(f"<figure><img alt='{esc(caption)}' src='data:image/png;base64,{data}'>"
                             + (f"<figcaption>Figure: {esc(caption)}</figcaption>" if kind == "fig" else "")
                             + "</figure>")
        elif kind == "details":
            parts.append(f"<details><summary>{esc(b[1])}</summary>")
        elif kind == "/details":
            parts.append("</details>")
    parts.append("</body></html>")
    return "\n".join(parts)
