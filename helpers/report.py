"""The course-wide report of a run: summary, recorded results beside reference GPUs, and the plots."""
from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any, Iterable

from .results import read_records, records_by_name, write_atomic

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


def extract_figures(notebook: Path, figures_dir: Path, problems: list | None = None) -> list[Path]:
    """Save every PNG output of an executed notebook atomically; return the files in order.

    A notebook that cannot be read, an image that is not valid base64 PNG, or a figure that cannot
    be written is appended to `problems` as (path, reason) when a list is given, else raised.
    """
    import nbformat

    def problem(path, reason, err):
        if problems is None:
            raise err
        problems.append((path, reason))

    try:
        nb = nbformat.read(notebook, as_version=4)
        cells = list(nb.cells)
    except Exception as err:  # torn JSON, not a notebook, unreadable: the report goes on without it
        problem(notebook, f"unreadable executed notebook ({type(err).__name__}: {str(err)[:200]})", err)
        return []
    saved = []
    for i, cell in enumerate(cells):
        for k, out in enumerate(cell.get("outputs", []) if isinstance(cell, dict) else []):
            data = out.get("data", {}).get("image/png") if isinstance(out, dict) else None
            if not data:
                continue
            path = figures_dir / f"{notebook.stem}-cell{i:02d}-{k}.png"
            try:
                png = base64.b64decode(data if isinstance(data, str) else "".join(data), validate=False)
                if not png.startswith(b"\x89PNG"):
                    raise ValueError("not a PNG image")
                figures_dir.mkdir(parents=True, exist_ok=True)
                saved.append(write_atomic(path, png, fsync=False))
            except (ValueError, TypeError, OSError) as err:
                why = f"{err.strerror}" if isinstance(err, OSError) and err.strerror else str(err)
                problem(path if isinstance(err, OSError) else notebook,
                        f"figure of cell {i}, output {k} not saved: {why}", err)
    return saved


def reference_sets(references: Path, problems: list | None = None) -> dict[str, dict[str, dict]]:
    """{gpu folder name: {record name: record}} for every sub-folder of `references` with records.

    Unreadable files are appended to `problems` as (path, reason); two files with the same record
    name both stay, the second keyed 'name [file.json]'.
    """
    if not references.is_dir():
        return {}
    sets = {}
    for folder in sorted(d for d in references.iterdir() if d.is_dir()):
        good, bad = read_records(folder)
        if problems is not None:
            problems += bad
        if good:
            sets[folder.name] = _by_name(good)
    return sets


def _by_name(good: list[tuple[Path, dict]]) -> dict[str, dict]:
    """{name: record} (see results.records_by_name); each record also knows its file, as '_file'."""
    return records_by_name([(path, {**data, "_file": path}) for path, data in good])


def _text(value: Any, width: int | None = None) -> str:
    text = "?" if value is None or value == "" else str(value)
    return text[:width] if width else text


def _origin(rec: dict) -> str:
    """'device, profile P, torch V, date' for one record."""
    versions = rec.get("versions") if isinstance(rec.get("versions"), dict) else {}
    return (f"{_text(rec.get('device'))}, profile {_text(rec.get('profile'))}, torch {_text(versions.get('torch'))}, "
            f"{_text(rec.get('date'), 10)}")


def _record_blocks(name: str, rec: dict, refs: dict, run_device: str, run_profile: str) -> list[Block]:
    """The heading, origin line and table of one record, beside the same record on each reference GPU."""
    ref_cols = [(gpu, recs[name]) for gpu, recs in refs.items() if name in recs]
    versions = rec.get("versions") if isinstance(rec.get("versions"), dict) else {}
    origin = (f"Recorded on {_text(rec.get('device'))}, profile {_text(rec.get('profile'))}, "
              f"{_text(rec.get('date'))}; versions: " + (", ".join(f"{k} {v}" for k, v in versions.items()) or "?")
              + f" (file results/{rec['_file'].name}).")
    if rec.get("device") != run_device or rec.get("profile") != run_profile:
        origin += f" Not this run's device and profile ({run_device}, {run_profile})."
    header = ["metric", _origin(rec)]
    header += [f"{gpu} ({_origin(r)})" for gpu, r in ref_cols]
    mine_flat = flatten(rec["metrics"])
    ref_flats = [flatten(r["metrics"]) for _, r in ref_cols]
    keys = list(dict.fromkeys(list(mine_flat) + [k for f in ref_flats for k in f]))
    rows = [[k, mine_flat.get(k, "")] + [f.get(k, "") for f in ref_flats] for k in keys]
    title = name + (f" (dtype {rec['dtype']})" if rec.get("dtype") else "")
    return [("h3", title), ("p", origin), ("table", header, rows)]


def _ledger_blocks(mine: dict, refs: dict, problems: list) -> tuple[list[Block], set[str]]:
    """The claims ledger (helpers.claims): each claim's verdict in this run beside each reference GPU's.

    Returns the blocks and the record names shown there; a claim record without the ledger's fields
    goes to `problems`.
    """
    from . import claims

    rows = claims.from_records(mine)
    shown = {claims.PREFIX + str(r["id"]) for r in rows}
    for name, rec in mine.items():
        if name.startswith(claims.PREFIX) and name not in shown:
            problems.append((rec["_file"], "a claim record without id, notebook, claim and verdict"))
    if not rows:
        return [], shown
    ref_rows = {gpu: {r["id"]: r for r in claims.from_records(recs)} for gpu, recs in refs.items()}
    ref_rows = {gpu: r for gpu, r in ref_rows.items() if r}
    verdict = lambda r: r["verdict"] + (f" ({r['reason']})" if r.get("reason") else "")  # noqa: E731
    header = ["notebook", "claim", "source", "measured here", "verdict here"] + [f"verdict on {g}" for g in ref_rows]
    table = [[r["notebook"], r["claim"], r.get("source", ""), r.get("measured", ""), verdict(r)]
             + [verdict(g[r["id"]]) + f"; measured {g[r['id']].get('measured', '?')}" if r["id"] in g else ""
                for g in ref_rows.values()] for r in rows]
    return [("h2", "Claims ledger"), ("p", "Each claim a notebook tested, with this run's measurement and verdict."),
            ("table", header, table)], shown


def build_blocks(run_dir: Path, outcomes: Iterable, references: Path, profile: str,
                 conditions: str | None = None, asked: str | None = None) -> list[Block]:
    """Everything the report says, as blocks that both renderers understand.

    Builds from whatever is readable: every file that is not (a torn record, a reference file that
    is not a record, a malformed executed notebook or figure) is listed by path with the reason.
    """
    from .hardware import library_versions
    from .results import device_name
    from .run import failure_text, status_word

    outcomes, problems = list(outcomes), []
    good, bad = read_records(run_dir / "results")
    problems += bad
    mine = _by_name(good)
    refs = reference_sets(references, problems)
    device = device_name()
    blocks: list[Block] = [
        ("h1", f"Course run report: {run_dir.name}"),
        ("p", f"Device: {device}. Profile: {profile}" + (f" (asked for: {asked})" if asked and asked != profile else "")
              + ". Versions: " + ", ".join(f"{k} {v}" for k, v in library_versions().items()) + "."),
    ]
    if conditions:
        blocks.append(("p", f"Run conditions: {conditions}."))
    blocks += [
        ("h2", "Notebooks"),
        ("p", "Cell numbers count the notebook's code cells from 1, as JupyterLab numbers them after "
              "'Restart Kernel and Run All Cells'."),
        ("table", ["notebook", "status", "seconds", "failure"],
         [[o.notebook, status_word(o), f"{o.seconds:.1f}", failure_text(o)] for o in outcomes]),
        ("h2", "Recorded results"),
    ]
    if not mine:
        blocks.append(("p", "No notebook recorded a result in this run."))
    if refs:
        blocks.append(("p", "Reference columns come from results/<gpu>/ in the repository: " + ", ".join(refs) + "."))
    ledger, in_ledger = _ledger_blocks(mine, refs, problems)
    for name, rec in mine.items():
        if name not in in_ledger:
            blocks += _record_blocks(name, rec, refs, device, profile)
    blocks += ledger
    figures = [("h2", "Figures")]
    for nb in sorted((run_dir / "notebooks").glob("*.ipynb")):
        figs = extract_figures(nb, run_dir / "figures", problems)
        if figs:
            figures.append(("h3", nb.stem))
            figures += [("img", str(f.relative_to(run_dir))) for f in figs]
    blocks += figures
    if problems:
        blocks += [("h2", "Files the report could not read"),
                   ("table", ["file", "reason"], [[str(p), r] for p, r in problems])]
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
            try:
                data = base64.b64encode((run_dir / b[1]).read_bytes()).decode()
                parts.append(f"<img alt='{esc(b[1])}' src='data:image/png;base64,{data}'>")
            except OSError as err:
                parts.append(f"<p>figure {esc(b[1])} could not be read: {esc(str(err.strerror or err))}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(run_dir: Path, outcomes: Iterable, references: Path, profile: str = "auto",
                 conditions: str | None = None, asked: str | None = None) -> tuple[Path, Path]:
    """Write report.md and report.html into `run_dir` (each atomically); return their paths.

    Raises OSError (with the file name) when one cannot be written; a file written before stays intact.
    """
    run_dir = Path(run_dir)
    blocks = build_blocks(run_dir, outcomes, Path(references), profile, conditions, asked)
    md = write_atomic(run_dir / "report.md", to_markdown(blocks), fsync=False)
    page = write_atomic(run_dir / "report.html", to_html(blocks, run_dir), fsync=False)
    return md, page
