"""The course-wide report of a run: summary, recorded results beside reference GPUs, and the plots."""
from __future__ import annotations

import datetime as _dt
import subprocess
from pathlib import Path
from typing import Any, Iterable

from helpers.course import executed_notebook
from helpers.course import report_picture, smoke_record
from helpers.course.report_render import Block, to_html, to_markdown
from helpers.course.worker import SUMMARY_HEADER, status_word, summary_rows
from helpers.measure import claims, clock
from helpers.measure.hardware import library_versions
from helpers.measure.results import REPO_ROOT, SUMMARY_PREFIX, device_name, read_records, records_by_name, write_atomic



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


def reference_sets(references: Path, problems: list | None = None) -> dict[str, dict[str, dict]]:
    """{gpu folder name: {record name: record}} for every sub-folder of `references` with records.

    Unreadable files are appended to `problems` as (path, reason); two files with the same record
    name both stay, the second keyed 'name [file.json]'.
    """
    if not references.is_dir():
        return {}
    sets = {}
    for folder in sorted(d for d in references.iterdir() if d.is_dir()):
        good, bad = read_records(folder, skip=("capture.json", "goals.json", smoke_record.SMOKE_FILE))  # not records
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


def record_origin(rec: dict) -> str:
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
    header = ["metric", record_origin(rec)]
    header += [f"{gpu} ({record_origin(r)})" for gpu, r in ref_cols]
    mine_flat = flatten(rec["metrics"])
    ref_flats = [flatten(r["metrics"]) for _, r in ref_cols]
    keys = list(dict.fromkeys(list(mine_flat) + [k for f in ref_flats for k in f]))
    rows = [[k, mine_flat.get(k, "")] + [f.get(k, "") for f in ref_flats] for k in keys]
    title = name + (f" (dtype {rec['dtype']})" if rec.get("dtype") else "")
    return [("h3", title), ("p", origin), ("table", header, rows)]


def _verdict_text(row: dict) -> str:
    return claims.shown(row) + (f" ({row['reason']})" if row.get("reason") else "")


def notebook_changed(number: str, notebooks: Path = REPO_ROOT / "notebooks") -> str | None:
    """The ISO date of the last commit that changed notebook `number` (git log), or None where git cannot say
    (no git, not a clone, an uncommitted notebook)."""
    if number not in _CHANGED:
        paths = sorted(notebooks.glob(f"{number}_*.ipynb"))
        try:
            out = subprocess.run(["git", "log", "-1", "--format=%cI", "--", *map(str, paths)], cwd=notebooks,
                                 capture_output=True, text=True, timeout=20).stdout.strip() if paths else ""
        except (OSError, subprocess.SubprocessError):
            out = ""
        _CHANGED[number] = out or None
    return _CHANGED[number]


_CHANGED: dict[str, str | None] = {}


def _reference_text(ref: dict, here: dict | None) -> str:
    """A reference GPU's ledger cell: its verdict judged again by today's rule from its recorded numbers (saying so
    when that changes it), its measurement, and a flag when it was recorded before its notebook last changed."""
    judged = claims.rejudge(ref, here if here and here.get("verdict") is not None else None)
    text = f"{_verdict_text(judged)}; measured {ref.get('measured', '?')}"
    if judged.get("rejudged"):
        text += f"; re-judged by today's rule (recorded as {judged['rejudged']})"
    changed, recorded = notebook_changed(str(ref.get("notebook"))), ref.get("date")
    if changed and isinstance(recorded, str) and _when(recorded) < _when(changed):
        text += (f"; recorded {recorded[:10]}, before notebook {ref.get('notebook')} last changed ({changed[:10]}): "
                 "today's notebook may measure it differently, until a run on that GPU replaces it")
    return text


def _when(iso: str) -> _dt.datetime:
    try:
        stamp = _dt.datetime.fromisoformat(iso)
    except ValueError:
        return _dt.datetime.max.replace(tzinfo=_dt.timezone.utc)
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=_dt.timezone.utc)


def _ledger_blocks(mine: dict, refs: dict, problems: list) -> tuple[list[Block], set[str]]:
    """The claims ledger (helpers.measure.claims): every claim recorded in this run or on a reference GPU, its
    source, this run's measurement, verdict and device, and each reference GPU's measurement and verdict.

    Returns the blocks and the record names shown there; a claim record without the ledger's fields
    goes to `problems`.
    """
    rows = {r["id"]: r for r in claims.from_records(mine)}
    shown = {claims.PREFIX + str(i) for i in rows}
    for name, rec in mine.items():
        if name.startswith(claims.PREFIX) and name not in shown:
            problems.append((rec["_file"], "a claim record without id, notebook, claim and verdict"))
    ref_rows = {gpu: {r["id"]: r for r in claims.from_records(recs)} for gpu, recs in refs.items()}
    ref_rows = {gpu: r for gpu, r in ref_rows.items() if r}
    for gpu_rows in ref_rows.values():  # a claim only a reference tested still gets its row
        for cid, r in gpu_rows.items():
            rows.setdefault(cid, {**r, "verdict": None, "measured": None, "device": None})
    blocks: list[Block] = [("h2", "Claims ledger")]
    if not rows:
        return blocks + [("p", "No notebook recorded a verdict on a claim in this run (helpers.measure.claims.verdict), "
                               "and no reference GPU holds one.")], shown
    header = ["notebook", "claim", "source", "measured here", "verdict here", "device here"]
    header += [f"verdict on {gpu}; measured there" for gpu in ref_rows]
    table = []
    for r in sorted(rows.values(), key=lambda r: (str(r["notebook"]), str(r["id"]))):
        here = ([r["measured"], _verdict_text(r), _text(r.get("device"))] if r["verdict"] is not None
                else ["not run here", "", ""])
        table.append([r["notebook"], r["claim"], r.get("source", "") or "?"] + here
                     + [_reference_text(g[r["id"]], r) if r["id"] in g else "not recorded there"
                        for g in ref_rows.values()])
    refs_note = (" Beside it, the same claim's measurement and verdict on each reference GPU in results/<gpu>/, judged "
                 "again by today's rule from the numbers it recorded, and flagged when it was recorded before its "
                 "notebook last changed."
                 if ref_rows else " No reference GPU in results/<gpu>/ has recorded a verdict yet.")
    return blocks + [("p", "Every claim a notebook tested (from the source texts and papers), with this run's "
                           "measurement and verdict: exceeded (beyond the claim's range), supported, contradicted, or "
                           "not testable on this device with the reason; '(by formula)' marks a verdict computed "
                           "from formulas with this run's measured inputs." + refs_note), ("table", header, table)], shown


def _stem_of(number: str, stems: Iterable[str]) -> str | None:
    return next((s for s in sorted(stems) if s.startswith(number)), None)


def _summaries(mine: dict, problems: list) -> dict[str, dict]:
    """{notebook number: summary metrics} of this run's summary-NN records (results.summary)."""
    out = {}
    for name, rec in mine.items():
        if not name.startswith(SUMMARY_PREFIX):
            continue
        m = rec["metrics"]
        if isinstance(m.get("notebook"), str) and isinstance(m.get("headline"), dict) and all(
                isinstance(v, dict) and "value" in v for v in m["headline"].values()):
            if m["notebook"] in out:  # a second file for the same notebook: named, not silently dropped
                problems.append((rec["_file"], f"a second summary of notebook {m['notebook']}; the report shows "
                                               f"{out[m['notebook']]['_record']}"))
                continue
            out[m["notebook"]] = {**m, "_record": name}
        else:
            problems.append((rec["_file"], "a summary record without notebook, sentence and headline {label: value, unit}"))
    return out


def headline_value(v: dict) -> str:
    """A headline value with its unit and, where recorded, its spread: "4.10 GB/s (IQR 3.9-4.3)"."""
    text = f"{_fmt(v.get('value'))} {v.get('unit') or ''}".strip()
    spread = v.get("spread")
    if isinstance(spread, list) and len(spread) == 2:
        text += f" (IQR {_fmt(spread[0])}-{_fmt(spread[1])})"
    return text


def _ratio(mine: dict, ref: dict) -> str:
    a, b = mine.get("value"), ref.get("value")
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
    if not numeric or (mine.get("unit") or "") != (ref.get("unit") or ""):
        return "-"
    return f"{a / b:.3g}x" if b else "-"


def _versus_blocks(summaries: dict, refs: dict) -> list[Block]:
    """Your device vs reference: each headline number beside the same record's on each reference GPU."""
    blocks: list[Block] = [("h2", "Your device vs reference")]
    how = ("To make one, run scripts/gpu_capture.sh on the GPU and import what comes back with "
           "`python -m tools.capture.capture import` (results/README.md says how), or run "
           "`python -m helpers.course.run --profile full --save-reference` on a GPU box.")
    if not summaries:
        return blocks + [("p", "No notebook recorded its headline numbers in this run (helpers.measure.results.summary), "
                               "so there is nothing to compare.")]
    ref_sums = {gpu: {n: r["metrics"] for n, r in recs.items() if n.startswith(SUMMARY_PREFIX)
                      and isinstance(r["metrics"].get("headline"), dict)} for gpu, recs in refs.items()}
    ref_sums = {gpu: s for gpu, s in ref_sums.items() if s}
    if not ref_sums:
        blocks.append(("p", "There is no reference GPU run in results/<gpu>/ yet, so this run's numbers stand "
                            "alone. " + how))
    header = ["notebook", "headline number", "this run"]
    for gpu in ref_sums:
        header += [gpu, "this run / " + gpu]
    rows, missing = [], []
    for nb, s in sorted(summaries.items()):
        for gpu, sums in ref_sums.items():
            if s["_record"] not in sums:
                missing.append(f"{s['_record']} on {gpu}")
        for label, v in s["headline"].items():
            row = [nb, label, headline_value(v)]
            for gpu, sums in ref_sums.items():
                ref = sums.get(s["_record"], {}).get("headline", {}).get(label)
                if isinstance(ref, dict):
                    row += [headline_value(ref), _ratio(v, ref)]
                else:
                    row += ["no reference" if s["_record"] not in sums else "not in the reference", "-"]
            rows.append(row)
    stale = [f"{nb} on {gpu} (recorded {str(date)[:10]}, notebook changed {changed[:10]})"
             for gpu, recs in refs.items() for nb in sorted(summaries)
             if isinstance(date := recs.get(SUMMARY_PREFIX + nb, {}).get("date"), str)
             and (changed := notebook_changed(nb)) and _when(date) < _when(changed)]
    if stale:
        blocks.append(("p", "Recorded on a reference GPU before the notebook last changed, so its numbers may come "
                            "from code that is gone: " + "; ".join(stale) + "."))
    if ref_sums:
        blocks.append(("p", "Each headline number of this run beside the record of the same name on each reference "
                            "GPU (results/<gpu>/), and their ratio; a ratio below 1 means this run measured less."
                       + (f" Missing on the reference: {', '.join(missing)}. " + how if missing else "")))
    return blocks + [("table", header, rows)]


def _clock_share(summary: dict) -> float | None:
    """The share of wall time a notebook's summary says its timed thread ran; None if it timed nothing on that clock."""
    tally = summary.get("clock") if isinstance(summary, dict) else None
    share = tally.get("share") if isinstance(tally, dict) else None
    return float(share) if isinstance(share, (int, float)) and not isinstance(share, bool) else None


def _notebook_blocks(stem: str, executed: Path | None, outcome, summary: dict | None, run_dir: Path,
                     problems: list, on_gpus: Iterable[str] = ()) -> list[Block]:
    """One notebook's section: its status, what it measured, whether it has run on each reference GPU
    (`on_gpus`: one sentence per GPU smoke pass), its headline numbers and key figures."""

    nb = executed_notebook.read_executed(executed, problems) if executed is not None else None
    blocks: list[Block] = [("h2", executed_notebook.title(nb, stem) if nb is not None else stem)]
    status = (f"Status: {status_word(outcome)} in {outcome.seconds:.1f} s." if outcome is not None else "")
    if summary:
        blocks.append(("p", f"{summary.get('sentence') or '?'} {status}".strip()))
        blocks.append(("table", ["headline number", "this run"],
                       [[label, headline_value(v)] for label, v in summary["headline"].items()]))
        if summary.get("noise"):
            blocks.append(("p", f"Noise: {summary['noise']}."))
        if _clock_share(summary) is not None:
            blocks.append(("p", f"Clock: {clock.describe_share(_clock_share(summary))}."))
    else:
        blocks.append(("p", f"{status} This notebook recorded no summary in this run (a results.summary call in its "
                            "takeaways cell records one), so it has no headline numbers here.".strip()))
    on_gpus = list(on_gpus)
    if on_gpus:
        blocks.append(("p", "On the reference GPUs: " + " ".join(on_gpus)))
    if nb is not None:
        captions = executed_notebook.captions(nb)
        for cell, f in executed_notebook.save_figures(nb, executed, run_dir / "figures", problems):
            caption = captions.get(cell, "")
            if not any(caption.startswith(s) for s in executed_notebook.SKIP_SECTIONS):
                blocks.append(("fig", str(f.relative_to(run_dir)), f"{stem}: {caption}"))
    return blocks


def build_blocks(run_dir: Path, outcomes: Iterable, references: Path, profile: str,
                 conditions: str | None = None, asked: str | None = None) -> list[Block]:
    """Everything the report says, as blocks that both renderers understand.

    In order: the run's device, the course in one picture (notebook 14's ladders, report_picture), the
    run's conditions with a noise note, the claims ledger, this run beside
    the reference GPUs, the notebooks' statuses, one section per notebook in course order (summary,
    headline numbers, figures), the raw records in a collapsed appendix, and every file that could
    not be read (a torn record, a reference file that is not a record, a malformed executed notebook
    or figure), by path with the reason.
    """
    outcomes, problems = list(outcomes), []
    good, bad = read_records(run_dir / "results")
    problems += bad
    mine = _by_name(good)
    refs = reference_sets(references, problems)
    device = device_name()
    summaries = _summaries(mine, problems)
    blocks: list[Block] = [
        ("h1", f"Course run report: {run_dir.name}"),
        ("p", f"Device: {device}. Profile: {profile}" + (f" (asked for: {asked})" if asked and asked != profile else "")
              + ". Versions: " + ", ".join(f"{k} {v}" for k, v in library_versions().items()) + "."),
        *report_picture.blocks(mine, refs, run_dir, problems),
        ("h2", "Measurement conditions"),
        ("p", f"Run conditions: {conditions}." if conditions else
              "Run conditions: not given (the notebooks were not run through helpers.course.run)."),
    ]
    noise = [f"{nb}: {s['noise']}" for nb, s in sorted(summaries.items()) if s.get("noise")]
    blocks.append(("p", "Noise (the timing spread each notebook printed): " + "; ".join(noise) + "." if noise else
                        "Noise: no notebook recorded its timing spread in this run, so differences of a few "
                        "percent between runs are not evidence of anything."))
    shares = [f"{nb} {100 * share:.0f}%" for nb, s in sorted(summaries.items())
              if (share := _clock_share(s)) is not None]
    if shares:
        blocks.append(("p", "Share of the wall time each notebook's timed thread ran (CPU timings are read from the "
                            "thread's own clock; below 90%, other work shared the core): " + ", ".join(shares) + "."))
    ledger, in_ledger = _ledger_blocks(mine, refs, problems)
    blocks += ledger + _versus_blocks(summaries, refs)
    blocks += [
        ("h2", "Notebooks"),
        ("p", "Cell numbers count the notebook's code cells from 1, as JupyterLab numbers them after "
              "'Restart Kernel and Run All Cells'."),
        ("table", SUMMARY_HEADER, summary_rows(outcomes)),
    ]
    executed = {p.stem: p for p in sorted((run_dir / "notebooks").glob("*.ipynb"))}
    by_outcome = {o.notebook: o for o in outcomes}
    stems = set(executed) | set(by_outcome)
    stems |= {nb for nb in summaries if _stem_of(nb, stems) is None}
    smoke = {d.name: smoke_record.load(d, problems) for d in sorted(references.iterdir()) if d.is_dir()} \
        if references.is_dir() else {}
    for stem in sorted(stems):
        number = stem[:2]
        on_gpus = [line for gpu, doc in smoke.items() if (line := smoke_record.line_for(number, doc, gpu))]
        blocks += _notebook_blocks(stem, executed.get(stem), by_outcome.get(stem),
                                   summaries.get(number) if number.isdigit() else None, run_dir, problems, on_gpus)
    raw = [(n, r) for n, r in mine.items() if n not in in_ledger and not n.startswith(SUMMARY_PREFIX)]
    blocks += [("details", f"Appendix: raw metrics of every record ({len(raw)} record{'' if len(raw) == 1 else 's'})")]
    if not raw:
        blocks.append(("p", "No notebook recorded a result in this run."))
    if refs:
        blocks.append(("p", "Reference columns come from results/<gpu>/ in the repository: " + ", ".join(refs) + "."))
    for name, rec in raw:
        blocks += _record_blocks(name, rec, refs, device, profile)
    blocks.append(("/details",))
    if problems:
        blocks += [("h2", "Files the report could not read"),
                   ("table", ["file", "reason"], [[str(p), r] for p, r in problems])]
    return blocks


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
