"""Step 0 of every GPU capture: every notebook in the smoke profile on the GPU, several at once.

A lent GPU is rare and brief, and a learner on an H100 must not be the first to run a notebook's CUDA-only
paths (fp8 `torch._scaled_mm`, CUDA graphs, compiled Triton kernels, bitsandbytes' CUDA kernels, pinned
copies, NCCL). So before the performance goals and the full-profile references, one pass runs every
notebook at smoke sizes on the GPU, `jobs` at a time through the course runner (`helpers.course.run
--jobs`), within `budget_s`, started in `longest_first` order (what the last pass on that GPU did not finish,
then its longest). Speed does not matter here, only that every cell runs.

`smoke_pass` writes `gpu-smoke.json` (per notebook: ok, failed with its cell and the error's first
lines, interrupted, or not run) and packs it, with the executed copy and log of every notebook that did
not finish ok, into `smoke.tgz` in the output folder (one file for the device tool to return). On the
budget, the runner is stopped as a capture stops one notebook (SIGTERM to its process group, which stops
its workers and kernels; then every process seen below it is killed): what finished is reported,
the notebooks still running are "interrupted", those not started "not run". `import_smoke` copies
`gpu-smoke.json` into `results/<gpu>/` (a later pass of some notebooks merged over the earlier one) and writes
its table into that folder's README.md, and the report says per notebook whether, and when, it has run on that
GPU.
"""
from __future__ import annotations

import datetime as _dt
import functools
import io
import json
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

from helpers.course import smoke_record
from helpers.course.smoke_record import SMOKE_FILE
from helpers.course.processes import OneLineParser, Stop, folder_problem, positive_argument, write_problem
from helpers.measure.params import is_finite_number
from helpers.measure.results import REPO_ROOT, write_atomic
from helpers.show.tables import table
from tools.capture.capture import (SMOKE_MARK, BadPack, available_notebooks, earlier_record, gpu_facts, read_pack,
                                   run_notebook, set_section, slug_of_gpu)

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
PACK_NAME = "smoke.tgz"
BUDGET_S = 240.0          # every notebook at smoke sizes, four at a time, on an H200 (16 cores)
JOBS = 4
MARGIN_S = 15.0           # kept back for reading the summary and packing
PACK_LIMIT = 12 * 2**20   # bytes; the device tool returns files of up to 16 MiB
ERROR_LINES = 3


def _number(stem: str) -> str:
    return stem[:2]


def _summary_rows(work: Path) -> list[dict]:
    """The runner's summary.json rows under `work` ([] when the runner wrote none)."""
    for path in sorted(Path(work).glob("*/summary.json")):
        try:
            rows = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rows, list):
            return [r for r in rows if isinstance(r, dict) and isinstance(r.get("notebook"), str)]
    return []


def _first_lines(text: str, n: int = ERROR_LINES) -> str:
    lines = [ln for ln in str(text or "").splitlines() if ln.strip()]
    return "\n".join(lines[:n])


def outcomes(notebooks: Iterable[str], rows: list[dict], runner_status: str, runner_note: str) -> dict[str, dict]:
    """{notebook: {"status", "seconds", "cell", "error"}} from the runner's summary rows: ok, failed (its cell
    and the error's first lines), interrupted, or "not run" for a notebook the summary does not name (the
    pass was stopped before it started, or the runner wrote no summary: `runner_note` says why)."""
    by_nb = {_number(r["notebook"]): r for r in rows}
    out = {}
    for nb in notebooks:
        r = by_nb.get(nb)
        if r is None:
            why = "not started before the budget ran out" if runner_status == "stopped" else \
                runner_note or "the runner did not report it"
            out[nb] = {"status": "not run", "seconds": 0.0, "cell": None, "error": why}
            continue
        status = str(r.get("status") or ("ok" if r.get("ok") else "failed"))
        out[nb] = {"status": status, "seconds": round(float(r.get("seconds") or 0.0), 1), "cell": r.get("cell"),
                   "error": "" if status == "ok" else _first_lines(r.get("error") or r.get("output") or "")}
    return out


def _pack(out: Path, doc: dict, work: Path, failed: list[str], limit: int = PACK_LIMIT) -> Path:
    """smoke.tgz in `out`: gpu-smoke.json and, while under `limit` bytes, each failed notebook's executed
    copy and log (the rest are named in the json as not packed)."""
    buf = io.BytesIO()
    files, size, left_out = [], 0, []
    for nb in failed:
        for path in sorted(Path(work).glob(f"*/notebooks/{nb}_*.ipynb")) + sorted(Path(work).glob(f"*/logs/{nb}_*.log")):
            if size + path.stat().st_size > limit:
                left_out.append(path.name)
                continue
            files.append(path)
            size += path.stat().st_size
    doc = {**doc, "not_packed": left_out}
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = (json.dumps(doc, indent=2) + "\n").encode()
        info = tarfile.TarInfo(SMOKE_FILE)
        info.size, info.mtime = len(data), int(time.time())
        tar.addfile(info, io.BytesIO(data))
        for path in files:
            tar.add(path, arcname=f"{path.parent.name}/{path.name}")
    return write_atomic(Path(out) / PACK_NAME, buf.getvalue(), mode=0o644)


def longest_first(notebooks: list[str], record: dict | None) -> list[str]:
    """`notebooks` in the order a pass should start them: those the last pass on this GPU (`record`, its
    gpu-smoke.json as `helpers.course.smoke_record.load` reads it, or None) did not see finish first, since they
    may be the longest (never run, cut by the budget or failed before their end), then the rest by the seconds
    they took, longest first; ties keep course order. Started so, the long ones do not begin last and meet the
    budget's end alone, as 14 did in course order on the H200 (cut after 105 s, while the pass held 227 s)."""
    seen = (record or {}).get("notebooks", {})

    def key(nb: str):
        o = seen.get(nb) or {}
        done = o.get("status") == "ok" and o.get("seconds") is not None
        return (1, -o["seconds"]) if done else (0, 0.0)

    return sorted(sorted(notebooks), key=key)  # stable: course order among equals


def smoke_pass(notebooks: list[str], out: Path, budget_s: float = BUDGET_S, *, jobs: int = JOBS,
               runner: Callable[..., tuple[str, str]] = run_notebook, clock: Callable[[], float] = time.monotonic,
               log: Callable[[str], None] = print, work: Path | None = None, margin_s: float = MARGIN_S,
               notebooks_dir: Path = NOTEBOOKS_DIR, stop=None) -> dict:
    """Run `notebooks` (two-digit numbers) in the smoke profile, `jobs` at a time, within `budget_s`; write
    `out/smoke.tgz` and return what it holds as a dict ({"started", "budget_s", "jobs", "gpu", "seconds",
    "runner", "notebooks": {nb: {...}}}). Raises ValueError for jobs < 1 or a budget not above margin_s."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs={jobs!r} must be a positive int")
    if not budget_s > margin_s:
        raise ValueError(f"budget_s={budget_s!r} must exceed the {margin_s:g} s kept for packing")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(work) if work is not None else Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    log(f"smoke pass: {len(notebooks)} notebook(s), {jobs} at a time, {budget_s:.0f} s")
    t0 = clock()
    status, note = runner(list(notebooks), work, "smoke", budget_s - margin_s, log=log, jobs=jobs,
                          notebooks_dir=notebooks_dir, stop=stop)
    seconds = round(clock() - t0, 1)
    per_nb = outcomes(sorted(notebooks), _summary_rows(work), status, note)  # course order, whatever the start order
    doc = {"started": started, "budget_s": budget_s, "jobs": jobs, "gpu": gpu_facts(), "seconds": seconds,
           "runner": {"status": status, "note": note}, "notebooks": per_nb}
    failed = [nb for nb, o in per_nb.items() if o["status"] != "ok"]
    try:
        pack_name = _pack(out, doc, work, [nb for nb in failed if per_nb[nb]["status"] != "not run"]).name
    except OSError as err:  # a full or vanished --out: say so in one line and keep the work
        doc["pack_error"] = write_problem(err, out / PACK_NAME, work)
        pack_name = "no pack"
    for nb, o in per_nb.items():
        log(f"{nb}: {o['status']}" + (f" in {o['seconds']:.1f} s" if o["seconds"] else "")
            + (f" at cell {o['cell']}" if o.get("cell") else "") + (f": {o['error'].splitlines()[0]}" if o["error"] else ""))
    log(f"smoke pass: {len(per_nb) - len(failed)} of {len(per_nb)} ok in {seconds:.0f} s -> {pack_name}")
    if doc.get("pack_error"):
        log(doc["pack_error"])
    return doc


def read_smoke_pack(pack: Path) -> dict:
    """The gpu-smoke.json inside a smoke.tgz. Raises BadPack when it is missing or torn."""
    members = read_pack(pack)
    if SMOKE_FILE not in members:
        raise BadPack(f"{pack}: no {SMOKE_FILE} inside: not a smoke pass")
    try:
        doc = json.loads(members[SMOKE_FILE])
    except ValueError as err:
        raise BadPack(f"{pack}: {SMOKE_FILE} is not valid JSON ({err})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("notebooks"), dict):
        raise BadPack(f"{pack}: {SMOKE_FILE} names no notebooks")
    if not isinstance(doc.get("gpu", {}), dict):
        raise BadPack(f"{pack}: {SMOKE_FILE}'s 'gpu' is {doc['gpu']!r}, not the machine's facts")
    for nb, o in doc["notebooks"].items():
        seconds = o.get("seconds") if isinstance(o, dict) else None
        if not isinstance(o, dict) or not isinstance(o.get("status"), str) or not (
                is_finite_number(seconds)):
            raise BadPack(f"{pack}: {SMOKE_FILE}'s entry for notebook {nb} is {o!r}, not a status with its seconds")
    return doc


def smoke_section(doc: dict) -> str:
    """The smoke pass as a README section: when it ran and, per notebook, its status, seconds, failing cell and
    the error's first line; where passes of different days or times are merged, the pass each row comes from."""
    notebooks = sorted(doc["notebooks"].items())
    starts = sorted({str(o.get("started") or doc.get("started", "?")) for _, o in notebooks})
    rows = [[nb, o.get("status", "?"), f"{o.get('seconds', 0):.0f}", o.get("cell") or "-",
             (str(o.get("error") or "").splitlines() or ["-"])[0][:100]]
            + ([str(o.get("started") or doc.get("started", "?"))[:16]] if len(starts) > 1 else [])
            for nb, o in notebooks]
    ok = sum(o.get("status") == "ok" for _, o in notebooks)
    when = (f"started {starts[0]}" if len(starts) == 1 else
            f"in {len(starts)} passes, started {', '.join(starts)} (a later pass of some notebooks replaces their "
            "rows; the last column says which pass a row comes from, and the earlier outcome is kept in "
            f"{SMOKE_FILE} as 'earlier')")
    return (f"{SMOKE_MARK}\n## The smoke pass on this GPU\n\n"
            f"Every notebook in the smoke profile, {doc.get('jobs', JOBS)} at a time, {when}: "
            f"{ok} of {len(rows)} ran every cell (`python -m tools.capture.gpu_smoke`; {SMOKE_FILE} beside this file).\n\n"
            "```\n" + table(["notebook", "status", "seconds", "cell", "error"] + (["pass started"] if len(starts) > 1
                                                                                 else []), rows) + "\n```\n")


def merge_passes(earlier: dict | None, later: dict) -> dict:
    """`later`, a smoke pass (perhaps of some notebooks only), over `earlier` (the record already imported for the
    same GPU, or None): each notebook keeps its latest outcome, stamped with the start of the pass it comes from;
    a replaced outcome is kept under the notebook's "earlier" (status, cell, error, started); the doc's own
    facts are the later pass's."""
    def stamped(doc: dict) -> dict:
        return {nb: {**o, "started": o.get("started") or doc.get("started")} for nb, o in doc["notebooks"].items()}

    merged = stamped(earlier) if earlier else {}
    for nb, o in stamped(later).items():
        if nb in merged:
            before = merged[nb]
            o = {**o, "earlier": {k: before.get(k) for k in ("status", "cell", "error", "started")}}
        merged[nb] = o
    return {**later, "notebooks": dict(sorted(merged.items()))}


def import_smoke(pack: Path, into: Path = REPO_ROOT / "results") -> Path:
    """Copy a smoke pass's gpu-smoke.json into `into/<gpu>/` (the GPU its facts name), merged over the pass
    already there for that GPU (`merge_passes`: a pass of some notebooks replaces their rows and keeps the
    others), and write its table into that folder's README.md (`smoke_section`, in place of an earlier pass's;
    the rest of the README is kept, and a capture's import keeps the table); returns the json file. Raises
    BadPack for a pack that is not a smoke pass, ValueError for one run without a GPU."""
    doc = read_smoke_pack(pack)
    gpu = str(doc.get("gpu", {}).get("gpu") or "")
    if not gpu or gpu.startswith("none"):
        raise ValueError(f"{pack}: this smoke pass ran without a GPU ({gpu or 'no GPU named'}); nothing to import")
    target = Path(into) / slug_of_gpu(gpu)
    target.mkdir(parents=True, exist_ok=True)
    doc = merge_passes(earlier_record(target / SMOKE_FILE, "notebooks", dict), doc)
    path = write_atomic(target / SMOKE_FILE, json.dumps(doc, indent=2) + "\n")
    set_section(target / "README.md", SMOKE_MARK, smoke_section(doc), f"# Reference: {gpu}")
    return path


# ---------------------------------------------------------------- command line

def main(argv: list[str] | None = None) -> int:
    """`run` (the pass; exit 0 when every notebook ran ok, 1 otherwise, 2 for a usage error, 130 / 143 when a
    signal stopped it) or `import` (smoke.tgz into results/<gpu>/; exit 1 for a pack it refuses)."""
    prog = "python -m tools.capture.gpu_smoke"
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run")
    p.add_argument("notebooks", nargs="*", help="two-digit numbers (default: every notebook)")
    p.add_argument("--out", type=Path, required=True, help="folder for smoke.tgz (the device tool's $OUT)")
    p.add_argument("--budget-s", type=positive_argument(float), default=BUDGET_S,
                   help=f"wall-clock seconds for the whole pass (default {BUDGET_S:.0f})")
    p.add_argument("--jobs", type=positive_argument(int), default=JOBS, help=f"notebooks at once (default {JOBS})")
    p.add_argument("--notebooks-dir", type=Path, default=NOTEBOOKS_DIR)
    p = sub.add_parser("import")
    p.add_argument("pack", type=Path, help="smoke.tgz")
    p.add_argument("--into", type=Path, default=REPO_ROOT / "results")
    args = parser.parse_args(argv)
    if args.command == "import":
        try:
            print(f"imported into {import_smoke(args.pack, args.into)}")
            return 0
        except (BadPack, ValueError) as err:
            print(f"import failed: {err}")
            return 1
        except OSError as err:
            print(f"import failed: {err.filename or args.pack}: {err.strerror or err}")
            return 1
    known = available_notebooks(args.notebooks_dir)
    if not known:
        print(f"{prog} run: no notebooks (NN_*.ipynb) in {args.notebooks_dir}", file=sys.stderr)
        return 2
    bad = [nb for nb in args.notebooks if nb not in known]
    if bad:
        print(f"unknown notebook(s) {bad}; these exist: {' '.join(known)}", file=sys.stderr)
        return 2
    if args.budget_s <= MARGIN_S:
        print(f"{prog} run: --budget-s {args.budget_s:g} must exceed the {MARGIN_S:.0f} s kept for packing",
              file=sys.stderr)
        return 2
    problem = folder_problem(args.out)
    if problem:
        print(f"{prog} run: --out {args.out} cannot be written: {problem}", file=sys.stderr)
        return 2
    gpu = str(gpu_facts().get("gpu") or "")
    record = None if not gpu or gpu.startswith("none") else smoke_record.load(REPO_ROOT / "results" / slug_of_gpu(gpu))
    order = longest_first(args.notebooks or known, record)
    print(f"{prog} run: starting order {' '.join(order)} (the last pass on this GPU's unfinished first, then its "
          "longest)" if record else f"{prog} run: no earlier pass on this GPU; course order")
    with Stop("the runner, its workers and kernels") as stop:
        runner = functools.partial(run_notebook, stop=stop)
        doc = smoke_pass(order, args.out, args.budget_s, jobs=args.jobs, runner=runner,
                         notebooks_dir=args.notebooks_dir, stop=stop)
    ok = all(o["status"] == "ok" for o in doc["notebooks"].values()) and not doc.get("pack_error")
    return stop.code(0 if ok else 1)


if __name__ == "__main__":
    raise SystemExit(main())
