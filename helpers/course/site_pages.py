"""The site's pages as Sphinx sources (`helpers.course.site` builds them): a page per notebook (the run's executed
copy, or the committed source with a line saying it was not executed), the claims ledger and "your device against
the reference" (both cut from the report's own blocks, `helpers.course.report.build_blocks`), and the index.

Every page of the site is written by `write_sources`, which returns one `Page` per page in the order of the index.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from helpers.course import executed_notebook, report, report_render
from helpers.course.worker import Outcome, failure_text, status_word
from helpers.measure.results import SUMMARY_PREFIX, read_records

COURSE_TITLE = "LLM efficiency, measured"
LEDGER, DEVICE = "Claims ledger", "Your device vs reference"   # the report's own section headings
NOT_EXECUTED = "Not executed in this run"


@dataclass
class Page:
    """One page of the site: its source path (relative to the source folder, no suffix), its title, and a line
    for the index and the progress output."""

    doc: str
    title: str
    line: str
    executed: bool = True


def outcomes_of(run_dir: Path) -> list[Outcome]:
    """The run's outcomes from its summary.json ([] when it has none or it cannot be read)."""
    try:
        rows = json.loads((run_dir / "summary.json").read_text())
        return [Outcome(**{k: v for k, v in r.items() if k in Outcome.__dataclass_fields__}) for r in rows]
    except (OSError, ValueError, TypeError):
        return []


def origin(run_dir: Path) -> dict:
    """Where the run came from, read from its records: device, profile and date (the most common device and
    profile among them, the earliest date; '?' where the run recorded nothing)."""
    good, _ = read_records(run_dir / "results")
    recs = [r for _, r in good]
    common = lambda key: Counter(str(r.get(key)) for r in recs if r.get(key)).most_common(1)  # noqa: E731
    dates = sorted(str(r["date"]) for r in recs if r.get("date"))
    return {"device": (common("device") or [("?",)])[0][0], "profile": (common("profile") or [("?",)])[0][0],
            "date": dates[0][:16].replace("T", " ") if dates else "?", "records": len(recs)}


def sections(blocks: list) -> dict[str, list]:
    """The report's blocks cut at each level-2 heading: {heading: the blocks under it, heading left out}."""
    out, current = {}, None
    for b in blocks:
        if b[0] in ("h1", "h2"):
            current = b[1] if b[0] == "h2" else None
            if current is not None:
                out[current] = []
        elif current is not None:
            out[current].append(b)
    return out


def raw_html(blocks: list, run_dir: Path) -> str:
    """MyST source that shows report blocks exactly as report.html does (verdict cells coloured), as raw HTML."""
    page = report_render.to_html(blocks, run_dir)
    body = page.split("<body>", 1)[1].rsplit("</body>", 1)[0]
    return "```{raw} html\n" + body.strip() + "\n```\n"


def table_css() -> str:
    """The report's own style rules for tables and verdict cells (report_render.CSS), for the site's pages."""
    rules = [r + "}" for r in report_render.CSS.split("}") if r.strip()]
    return "\n".join(r for r in rules if r.lstrip().startswith((".scroll", "table", "td", "th")))


def _reference_rows(number: str, versus: list, refs: dict) -> tuple[list, list] | None:
    """(header, rows) of the reference GPUs' headline numbers for notebook `number`: the report's own "your device
    vs reference" rows when this run recorded the notebook's summary, else each reference's headline alone."""
    for b in versus:
        if b[0] == "table" and any(r[0] == number for r in b[2]) and len(b[1]) > 3:
            return b[1][1:], [r[1:] for r in b[2] if r[0] == number]
    sums = {gpu: recs[SUMMARY_PREFIX + number]["metrics"].get("headline") for gpu, recs in refs.items()
            if SUMMARY_PREFIX + number in recs}
    sums = {gpu: h for gpu, h in sums.items() if isinstance(h, dict) and h}
    if not sums:
        return None
    labels = list(dict.fromkeys(label for h in sums.values() for label in h))
    rows = [[label] + [report.headline_value(h[label]) if isinstance(h.get(label), dict) else "-" for h in sums.values()]
            for label in labels]
    return ["headline number", *sums], rows


def reference_cell(number: str, versus: list, refs: dict, executed: bool) -> str:
    """The markdown at the top of a notebook's page: its headline numbers beside each reference GPU's."""
    found = _reference_rows(number, versus, refs)
    if found is None:
        return ("**Beside the reference GPU.** No reference GPU in results/ has recorded this notebook's headline "
                "numbers yet.")
    header, rows = found
    where = ", ".join(f"{gpu} ({report.record_origin(recs[SUMMARY_PREFIX + number])})" for gpu, recs in refs.items()
                      if SUMMARY_PREFIX + number in recs)
    lead = ("this run's headline numbers beside the same record on" if executed else
            "this run did not execute the notebook; the headline numbers recorded on")
    return (f"**Beside the reference GPU.** From the records: {lead} {where}.\n\n"
            + report_render.to_markdown([("table", header, rows)]))


def notebook_page(source: Path, executed: Path | None, out: Path, top: str) -> str:
    """Write the page of one notebook to `out`: the executed copy with `top` after its opening cell, or the committed
    source with NOT_EXECUTED said in one line right under its title, then `top`; return its title."""
    import nbformat  # heavy: only a build reads notebooks

    nb = executed_notebook.read_executed(executed if executed is not None else source, None)
    cells = list(nb.cells)
    title = executed_notebook.title(nb, source.stem)
    first = 1 if cells and cells[0].cell_type == "markdown" else 0
    added = [nbformat.v4.new_markdown_cell(top)]
    if executed is None:
        line = (f"**{NOT_EXECUTED}:** this page shows the notebook as committed, without outputs; `make site` runs "
                "the whole course and shows its numbers and figures.")
        head, _, rest = cells[0].source.partition("\n") if first else ("", "", "")
        if head.startswith("# "):  # the line goes right under the title
            cells[:1] = [nbformat.v4.new_markdown_cell(head), nbformat.v4.new_markdown_cell(line),
                         nbformat.v4.new_markdown_cell(rest)]
            first = 3
        else:
            added.insert(0, nbformat.v4.new_markdown_cell(line))
    nb.cells = cells[:first] + added + cells[first:]
    nb.metadata.pop("widgets", None)   # widget state needs scripts from a CDN to show anything
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out)
    return title


def write_sources(run_dir: Path, src: Path, references: Path, notebooks_dir: Path, say=print) -> list[Page]:
    """Write every page's source into `src` (index.md, notebooks/*.ipynb, ledger.md, device.md); say one line
    per page; return the pages in the order of the index."""
    outcomes = {o.notebook: o for o in outcomes_of(run_dir)}
    where = origin(run_dir)
    blocks = report.build_blocks(run_dir, outcomes.values(), references, where["profile"])
    parts, refs = sections(blocks), report.reference_sets(references)
    versus = parts.get(DEVICE, [])
    executed = {p.stem: p for p in sorted((run_dir / "notebooks").glob("*.ipynb"))}
    pages: list[Page] = []
    for source in sorted(notebooks_dir.glob("[0-9][0-9]_*.ipynb")):
        stem, ran = source.stem, executed.get(source.stem)
        o = outcomes.get(stem)
        top = reference_cell(stem[:2], versus, refs, ran is not None)
        if ran is not None and o is not None and not o.ok:
            top = f"**{status_word(o)} in this run** ({failure_text(o)}): the outputs stop there.\n\n" + top
        title = notebook_page(source, ran, src / "notebooks" / source.name, top)
        line = (f"executed: {status_word(o)} in {o.seconds:.0f} s" if ran is not None and o is not None else
                "executed" if ran is not None else NOT_EXECUTED.lower())
        pages.append(Page(f"notebooks/{stem}", title, line, ran is not None))
        say(f"  page {pages[-1].doc}: {line}")
    ledger = parts.get(LEDGER, [])
    claims = sum(len(b[2]) for b in ledger if b[0] == "table")
    (src / "ledger.md").write_text(f"# {LEDGER}\n\n" + raw_html(ledger, run_dir))
    pages.append(Page("ledger", LEDGER, f"{claims} claims, each with its verdict"))
    say(f"  page ledger: {pages[-1].line}")
    (src / "device.md").write_text(f"# Your device against the reference\n\nThis run: {where['device']}, profile "
                                   f"{where['profile']}.\n\n" + raw_html(versus, run_dir))
    pages.append(Page("device", "Your device against the reference", "each headline number beside the reference GPUs'"))
    (src / "index.md").write_text(index_source(run_dir, where, pages))
    say(f"  page device, page index: {len(pages)} pages listed")
    return pages


def _link_text(text: str) -> str:
    return re.sub(r"([\[\]*_`])", r"\\\1", text)


def index_source(run_dir: Path, where: dict, pages: list[Page]) -> str:
    """The index: the course's title, where the run came from, one line per page, and the (hidden) table of contents."""
    ran = sum(p.executed for p in pages if p.doc.startswith("notebooks/"))
    total = sum(p.doc.startswith("notebooks/") for p in pages)
    lines = [f"# {COURSE_TITLE}", "",
             "A course in Jupyter notebooks: each one builds an efficiency technique for training or serving "
             "transformer language models, checks it against the library that does it for real, and measures it.", "",
             f"**Where these pages come from.** The run `{run_dir.name}`: device {where['device']}, profile "
             f"{where['profile']}, started {where['date']}; {ran} of {total} notebooks executed, "
             f"{where['records']} records.", "", "## The notebooks", ""]
    lines += [f"- [{_link_text(p.title)}]({p.doc}.ipynb): {p.line}" for p in pages if p.doc.startswith("notebooks/")]
    lines += ["", "## The run against the claims and the reference", ""]
    lines += [f"- [{p.title}]({p.doc}.md): {p.line}" for p in pages if not p.doc.startswith("notebooks/")]
    lines += ["", "```{toctree}", ":hidden:", "", *[p.doc for p in pages], "```", ""]
    return "\n".join(lines)
