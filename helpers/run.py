"""Headless runner: `python -m helpers.run [NOTEBOOK ...]` executes notebooks with papermill.

Each run goes to runs/<timestamp>-<device>/ with the executed notebooks, the recorded results
(JSON) and a report (report.md, report.html). Exit status is non-zero if any notebook failed.
"""
from __future__ import annotations

import argparse
import ast
import datetime as _dt
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from .params import PROFILES
from .results import REPO_ROOT, device_slug

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"


@dataclass
class Outcome:
    """How one notebook's execution went."""

    notebook: str
    ok: bool
    seconds: float
    cell: int | None = None
    error: str = ""
    output: str = ""


def find_notebooks(selection: list[str], folder: Path) -> list[Path]:
    """Notebooks in `folder` matching the selection (number prefix, stem, file name); all if empty."""
    available = sorted(p for p in folder.glob("*.ipynb") if not p.name.startswith("."))
    if not selection:
        return available
    chosen: list[Path] = []
    for item in selection:
        as_path = Path(item)
        if as_path.suffix == ".ipynb" and as_path.exists():
            chosen.append(as_path)
            continue
        hits = [p for p in available if p.stem == item or p.name == item or p.stem.split("_")[0] == item
                or p.stem.startswith(item)]
        if not hits:
            names = ", ".join(p.stem for p in available) or "none"
            raise SystemExit(f"no notebook matches {item!r} in {folder} (available: {names})")
        chosen += [h for h in hits if h not in chosen]
    return chosen


def parse_parameter(text: str) -> tuple[str, object]:
    """'NAME=VALUE' -> (NAME, python literal of VALUE, or the string itself)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"parameter {text!r} must look like NAME=VALUE")
    name, raw = text.split("=", 1)
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    return name.strip(), value


def _original_cell_index(nb_path: Path, executed_index: int) -> int:
    """papermill inserts an 'injected-parameters' cell; map its executed index back to the source's."""
    import nbformat

    nb = nbformat.read(nb_path, as_version=4)
    shift = sum("injected-parameters" in cell.get("metadata", {}).get("tags", []) for cell in nb.cells[:executed_index])
    return executed_index - shift


def execute_one(notebook: str, output: str, parameters: dict, cwd: str, timeout: int | None,
                threads: int | None) -> Outcome:
    """Execute one notebook with papermill (runs in a worker process) and say how it went."""
    import papermill as pm

    os.environ["COURSE_HEADLESS"] = "1"
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"  # figures land in the notebook
    if threads:
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    name = Path(notebook).stem
    start = time.perf_counter()
    try:
        pm.execute_notebook(notebook, output, parameters=parameters, cwd=cwd, kernel_name="python3",
                            progress_bar=False, log_output=False, execution_timeout=timeout)
        return Outcome(name, True, time.perf_counter() - start)
    except pm.PapermillExecutionError as err:
        cell = _original_cell_index(Path(output), err.cell_index)
        return Outcome(name, False, time.perf_counter() - start, cell, f"{err.ename}: {err.evalue}")
    except Exception as err:  # kernel death, timeout, unreadable notebook: report, never crash the run
        return Outcome(name, False, time.perf_counter() - start, None, f"{type(err).__name__}: {err}")


def summary_table(outcomes: list[Outcome]) -> str:
    """A plain-text table: notebook, status, seconds, failing cell and error."""
    from .tables import table

    return table(["notebook", "status", "seconds", "failure"],
                 [[o.notebook, "ok" if o.ok else "FAILED", f"{o.seconds:.1f}", failure_text(o)] for o in outcomes])


def failure_text(o: Outcome, width: int = 160) -> str:
    """'cell N: Error: message' (first line) for a failed notebook, '' for a passing one."""
    if o.ok:
        return ""
    first = (o.error.splitlines() or [""])[0][:width]
    return (f"cell {o.cell}: " if o.cell is not None else "") + first


def build_parser() -> argparse.ArgumentParser:
    """The command line of the runner."""
    p = argparse.ArgumentParser(
        prog="python -m helpers.run",
        description="Execute course notebooks headlessly with papermill and write a report of their results.",
        epilog="Example: python -m helpers.run 00 01 --profile smoke -p SEED=1")
    p.add_argument("notebooks", nargs="*",
                   help="notebooks to run: number prefix (00), stem (00_hardware) or path; default: all")
    p.add_argument("--profile", default="auto", choices=PROFILES,
                   help="auto picks 'full' on CUDA and 'smoke' on CPU (default: auto)")
    p.add_argument("-p", "--parameter", action="append", default=[], type=parse_parameter, metavar="NAME=VALUE",
                   help="extra notebook parameter (python literal), repeatable; e.g. -p SEED=1")
    p.add_argument("--jobs", type=int, default=None,
                   help="notebooks executed at once (default: 2 on CPU, 1 on CUDA so timings do not collide)")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "runs",
                   help="parent folder of the run folder (default: runs/)")
    p.add_argument("--notebooks-dir", type=Path, default=NOTEBOOKS_DIR,
                   help="where to look for notebooks (default: notebooks/)")
    p.add_argument("--references", type=Path, default=REPO_ROOT / "results",
                   help="folder of reference results, one sub-folder per GPU (default: results/)")
    p.add_argument("--timeout", type=int, default=None, help="seconds allowed per cell (default: none)")
    p.add_argument("--no-report", action="store_true", help="skip writing report.md and report.html")
    p.add_argument("--save-reference", action="store_true",
                   help="also copy this run's records into <references>/<device>/ (for reference GPU runs)")
    p.add_argument("--list", action="store_true", help="list the notebooks that would run, then exit")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the selected notebooks, print the summary, write the report; 1 if any failed."""
    args = build_parser().parse_args(argv)
    notebooks = find_notebooks(args.notebooks, args.notebooks_dir)
    if args.list:
        print("\n".join(str(p) for p in notebooks))
        return 0
    if not notebooks:
        print(f"no notebooks found in {args.notebooks_dir}")
        return 1
    import torch

    cuda = torch.cuda.is_available()
    jobs = args.jobs or (1 if cuda else min(2, len(notebooks), os.cpu_count() or 1))
    if jobs < 1:
        raise SystemExit("--jobs must be at least 1")
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = args.out / f"{stamp}-{device_slug()}"
    (run_dir / "notebooks").mkdir(parents=True, exist_ok=True)
    results_dir = run_dir / "results"
    results_dir.mkdir(exist_ok=True)
    params = {"PROFILE": args.profile, "INTERACTIVE": False, "RESULTS_DIR": str(results_dir.resolve())}
    params.update(dict(args.parameter))
    threads = None if cuda else max(1, (os.cpu_count() or 1) // jobs)
    print(f"running {len(notebooks)} notebook(s), {jobs} at a time, profile {args.profile} -> {run_dir}")
    # notebook 00 measures the ceilings the others compare against: it runs alone, first
    first = [nb for nb in notebooks if nb.stem.startswith("00")]
    groups = [g for g in (first, [nb for nb in notebooks if nb not in first]) if g]
    outcomes = []
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for group in groups:
            futures = [pool.submit(execute_one, str(nb.resolve()), str((run_dir / "notebooks" / nb.name).resolve()),
                                   params, str(nb.parent.resolve()), args.timeout, threads) for nb in group]
            for fut in futures:
                o = fut.result()
                print(f"  {o.notebook}: {'ok' if o.ok else 'FAILED'} in {o.seconds:.1f} s", flush=True)
                outcomes.append(o)
    table = summary_table(outcomes)
    print("\n" + table)
    (run_dir / "summary.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=2))
    if not args.no_report:
        from .report import write_report

        md, html = write_report(run_dir, outcomes, args.references, profile=args.profile)
        print(f"\nreport: {md}\n        {html}")
    if args.save_reference:
        saved = save_reference(results_dir, args.references / device_slug())
        print(f"copied {len(saved)} record(s) to {args.references / device_slug()}")
    failed = [o for o in outcomes if not o.ok]
    return 1 if failed else 0


def save_reference(results_dir: Path, target: Path) -> list[Path]:
    """Copy every record of a run into a reference folder (results/<device>/), replacing older ones."""
    import shutil

    target.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy2(p, target / p.name)) for p in sorted(Path(results_dir).glob("*.json"))]


if __name__ == "__main__":
    sys.exit(main())
