"""One notebook in a worker process of its own, and the supervision of those workers (for helpers.course.run).

A worker (`python -m helpers.course.run --worker SPEC`) executes one notebook with papermill, writing the
executed notebook atomically, and leaves its Outcome as JSON. The runner's `Workers` starts them in
sessions of their own, remembers every process they start (kernels included), and on SIGINT or
SIGTERM (caught by `Stop`) ends them all: the worker ends its kernel, whatever remains is killed.
`inspect_executed` reads where an executed notebook stopped, numbering code cells as JupyterLab's
[N] after "Restart Kernel and Run All Cells" (see helpers.course.run); a kernel that dies, or a cell
over its time limit, is reported at the cell that was running, and the cells after it as not run.

What every command that starts processes shares (signals, process groups, command-line values) is
`helpers.course.processes`.
"""
from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from helpers.course.processes import kill_group, quietly
from helpers.measure.results import REPO_ROOT, write_atomic
from helpers.show.tables import table

GRACE_SECONDS = 10.0  # how long stopped workers get to shut their kernels down before SIGKILL
MARKER_TAG = "papermill-error-cell-tag"  # papermill's tag for the cells it inserts to point at an error


@dataclass
class Outcome:
    """How one notebook's execution went; status is 'ok', 'failed', 'interrupted' or 'not run'."""

    notebook: str
    ok: bool
    seconds: float
    cell: int | None = None
    error: str = ""
    output: str = ""
    status: str = ""
    log: str = ""

    def __post_init__(self):
        self.status = self.status or ("ok" if self.ok else "failed")


# ---------------------------------------------------------------------------------------------
# what happened inside an executed notebook

def _code_cells(nb) -> list[tuple[int, object]]:
    """(number, cell) for each non-empty code cell of the committed notebook, numbered from 1."""
    cells = [c for c in nb.cells if MARKER_TAG not in c.get("metadata", {}).get("tags", [])]
    numbered, n = [], 0
    for cell in cells:
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        injected = "injected-parameters" in cell.get("metadata", {}).get("tags", [])
        n += 0 if injected else 1
        numbered.append((None if injected else n, cell))
    return numbered


def inspect_executed(path: Path) -> dict:
    """Where an executed notebook stopped: {'state': 'complete'|'error'|'running'|'not run', 'cell', 'error'}.

    'error': a cell holds an error output (a raised exception, or `sys.exit`, which papermill lets
    pass); 'running': papermill left a cell running (the run was stopped inside it); 'not run': a
    cell never ran. `cell` is the code cell number (see the module docstring). Raises the
    nbformat/OSError error of an unreadable file.
    """
    import nbformat  # heavy: a second to import; the supervisor needs it only to read an executed notebook

    nb = nbformat.read(path, as_version=4)
    for number, cell in _code_cells(nb):
        status = cell.get("metadata", {}).get("papermill", {}).get("status")
        expected = "raises-exception" in cell.get("metadata", {}).get("tags", [])  # nbclient's tag for a cell meant to raise
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error" and not expected]
        if errors:
            text = f"{errors[0].get('ename')}: {errors[0].get('evalue')}"
            if errors[0].get("ename") == "SystemExit":
                text += " (sys.exit: the cells after it did not run)"
            return {"state": "error", "cell": number, "error": text}
        if status in ("running", "interrupted"):  # papermill left it running; mark_interrupted says so
            return {"state": "running", "cell": number, "error": ""}
        if cell.get("execution_count") is None:
            return {"state": "not run", "cell": number, "error": ""}
    return {"state": "complete", "cell": None, "error": ""}


def last_started(path: Path) -> int | None:
    """The number of the last code cell papermill started in an executed notebook (None if none did).

    Where a kernel died or a cell ran over its time limit, that is the cell that was running: papermill
    stamps `start_time` on each cell as it starts it, and never on the cells after.
    """
    import nbformat  # heavy: as in inspect_executed

    nb = nbformat.read(path, as_version=4)
    started = [n for n, c in _code_cells(nb) if c.get("metadata", {}).get("papermill", {}).get("start_time")]
    return started[-1] if started else None


def mark_interrupted(path: Path, cell: int | None, why: str) -> None:
    """Make an executed notebook say it was interrupted: the cell it was in, and no false 'completed'."""
    mark_stopped(path, cell, why)


def mark_stopped(path: Path, cell: int | None, why: str, *, title: str = "Interrupted",
                 status: str = "interrupted") -> None:
    """Make an executed notebook say where it stopped and why: `cell` gets papermill status `status`, the
    code cells after it that never ran 'pending' (papermill marks them 'completed'), and a note tagged
    MARKER_TAG goes on top ("**Interrupted** (SIGTERM) in code cell 3: ..."). Raises nbformat's or
    OSError's error for an unreadable or unwritable file."""
    import nbformat  # heavy: as in inspect_executed

    nb = nbformat.read(path, as_version=4)
    seen = False
    for number, c in _code_cells(nb):
        meta = c.setdefault("metadata", {}).setdefault("papermill", {})
        if number == cell or ((seen or cell is None) and c.get("execution_count") is None):
            meta["status"] = status if number == cell else "pending"
            seen = True
    where = f"in code cell {cell}" if cell else "between cells"
    note = nbformat.v4.new_markdown_cell(f"**{title}** ({why}) {where}: the cells after it did not run.")
    note.metadata["tags"] = [MARKER_TAG]
    nb.cells.insert(0, note)
    nb.metadata.setdefault("papermill", {})["exception"] = True
    nb.metadata["course_run"] = {"status": status, "cell": cell, "why": why}
    write_atomic(path, nbformat.writes(nb), fsync=False)


# ---------------------------------------------------------------------------------------------
# the worker: one process per notebook

def _atomic_handler(prefix: str):
    """A papermill I/O handler that writes files under `prefix` atomically (temporary file + rename)."""
    from papermill.iorw import LocalHandler, papermill_io  # heavy: only a worker process executes notebooks

    class AtomicHandler(LocalHandler):
        def write(self, buf, path):
            write_atomic(path, buf, fsync=False)

    papermill_io.register(prefix, AtomicHandler())


def execute_one(notebook: str, output: str, parameters: dict, cwd: str, timeout: int | None,
                run_dir: str) -> Outcome:
    """Execute one notebook with papermill (inside a worker process) and say how it went."""
    import papermill  # heavy: only a worker process executes notebooks

    _atomic_handler(str(Path(run_dir).resolve()))
    name, start = Path(notebook).stem, time.perf_counter()
    raised = ""
    try:
        papermill.execute_notebook(notebook, output, parameters=parameters, cwd=cwd, kernel_name="python3",
                            progress_bar=False, log_output=False, execution_timeout=timeout)
    except papermill.PapermillExecutionError:
        pass  # the executed notebook holds the error; inspect_executed reads it from there
    except OSError as err:  # could not write the executed notebook (full disk, permissions)
        raised = f"could not write {err.filename or output}: {err.strerror or err}"
    except Exception as err:  # kernel death, timeout, unreadable notebook: report, never crash the run
        raised = f"{type(err).__name__}: {str(err).strip()}"
    seconds = time.perf_counter() - start
    try:
        found = inspect_executed(Path(output))
        if raised and found["state"] != "error":  # the kernel died, or a cell ran over its limit, inside a cell
            found["cell"] = last_started(Path(output))
            if found["cell"] is not None:
                mark_stopped(Path(output), found["cell"], raised, title="Stopped", status="failed")
                raised += " (the cells after it did not run)"
    except Exception as err:
        return Outcome(name, False, seconds, None, raised or f"executed notebook unreadable: {err}")
    ok = found["state"] == "complete" and not raised
    error = raised or found["error"] or ("" if ok else f"cell {found['cell']} did not finish")
    return Outcome(name, ok, seconds, found["cell"], error)


def worker_main(spec_file: str) -> int:
    """Entry point of a worker process: run the notebook its spec names, write its Outcome as JSON."""
    def stop(signum, frame):  # the runner stops us: end the kernel (and what it started), then exit at once
        children = psutil.Process().children(recursive=True)
        for child in children:
            quietly(child.terminate)
        for child in psutil.wait_procs(children, timeout=3)[1]:
            quietly(child.kill)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    spec = json.loads(Path(spec_file).read_text())
    outcome = execute_one(spec["notebook"], spec["output"], ast.literal_eval(spec["parameters"]),
                          spec["cwd"], spec["timeout"], spec["run_dir"])
    write_atomic(spec["outcome"], json.dumps(asdict(outcome)))
    return 0


# ---------------------------------------------------------------------------------------------
# the supervisor: workers, their kernels, and signals

class Workers:
    """The worker processes of a run and every process they started, so that none outlives the run."""

    def __init__(self, run_dir: Path, env: dict, timeout: int | None):
        self.run_dir, self.env, self.timeout = run_dir, env, timeout
        self.running: dict[Path, tuple[subprocess.Popen, float, Path, dict]] = {}
        self.known: dict[int, object] = {}  # pid -> psutil.Process of every descendant ever seen

    def start(self, nb: Path, parameters: dict) -> None:
        logs = self.run_dir / "logs"
        output = (self.run_dir / "notebooks" / nb.name).resolve()
        spec = {"notebook": str(nb.resolve()), "output": str(output), "parameters": repr(parameters),
                "cwd": str(nb.parent.resolve()), "timeout": self.timeout, "run_dir": str(self.run_dir.resolve()),
                "outcome": str((logs / f"{nb.stem}.outcome.json").resolve())}
        spec_file = write_atomic(logs / f"{nb.stem}.spec.json", json.dumps(spec), fsync=False)
        log = open(logs / f"{nb.stem}.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "helpers.course.run", "--worker", str(spec_file.resolve())],
                                cwd=REPO_ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.running[nb] = (proc, time.perf_counter(), output, spec)

    def watch(self) -> None:
        """Remember every descendant of the workers (kernels in their own sessions included)."""
        for proc, *_ in self.running.values():
            try:
                for child in psutil.Process(proc.pid).children(recursive=True):
                    self.known.setdefault(child.pid, child)
            except psutil.Error:
                pass

    def finished(self) -> list[Path]:
        return [nb for nb, (proc, *_) in self.running.items() if proc.poll() is not None]

    def collect(self, nb: Path, interrupted: str = "") -> Outcome:
        """The Outcome of a worker that has exited; `interrupted` names the signal that stopped it."""
        proc, started, output, spec = self.running.pop(nb)
        seconds = time.perf_counter() - started
        self.reap()
        log = str(Path("logs") / f"{nb.stem}.log")
        try:
            o = Outcome(**json.loads(Path(spec["outcome"]).read_text()))
        except (OSError, ValueError, TypeError):
            o = Outcome(nb.stem, False, seconds, None,
                        f"the worker ended (exit status {proc.returncode}) before reporting; see {log}")
        o.log = log
        if interrupted:
            try:
                found = inspect_executed(output)
                o.cell = found["cell"] if found["state"] != "complete" else None
                mark_interrupted(output, o.cell, interrupted)
            except Exception:  # the executed notebook is missing or torn: the outcome still says why
                o.cell = None
            o.ok, o.status, o.seconds = False, "interrupted", seconds
            o.error = f"interrupted by {interrupted}" + (f" in cell {o.cell}" if o.cell else "")
        return o

    def reap(self) -> None:
        """Kill every remembered process that outlived its worker (a kernel, a compile worker...)."""
        live = {proc.pid for proc, *_ in self.running.values()}
        for pid, p in list(self.known.items()):
            try:
                ancestors = {a.pid for a in p.parents()}
            except psutil.Error:
                ancestors = set()
            if live & ancestors:
                continue  # still owned by a running worker
            quietly(p.kill)
            self.known.pop(pid)

    def stop(self, why: str) -> list[Outcome]:
        """SIGTERM every worker (it shuts its kernel down), SIGKILL what remains after a grace period."""
        self.watch()
        for proc, *_ in self.running.values():
            kill_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_SECONDS
        while time.monotonic() < deadline and any(p.poll() is None for p, *_ in self.running.values()):
            time.sleep(0.1)
        for proc, *_ in self.running.values():
            kill_group(proc.pid, signal.SIGKILL)
            proc.wait()
        outcomes = [self.collect(nb, why) for nb in list(self.running)]
        self.reap()
        return outcomes


# ---------------------------------------------------------------------------------------------
# the summary of a run, printed by the runner and shown by the report

SUMMARY_HEADER = ["notebook", "status", "seconds", "failure"]


def summary_rows(outcomes: list[Outcome]) -> list[list[str]]:
    """One row per notebook under SUMMARY_HEADER (the printed summary's and the report's)."""
    return [[o.notebook, status_word(o), f"{o.seconds:.1f}", failure_text(o)] for o in outcomes]


def summary_table(outcomes: list[Outcome]) -> str:
    """A plain-text table: notebook, status, seconds, failing cell and error."""
    return table(SUMMARY_HEADER, summary_rows(outcomes))


def status_word(o: Outcome) -> str:
    """'ok', 'FAILED', 'INTERRUPTED' or 'not run'."""
    return {"ok": "ok", "not run": "not run"}.get(o.status, o.status.upper())


def failure_text(o: Outcome, width: int = 160) -> str:
    """'cell N: Error: message' (first line) for a failed notebook, '' for a passing one."""
    if o.ok:
        return ""
    first = (o.error.splitlines() or [""])[0][:width]
    return (f"cell {o.cell}: " if o.cell is not None and o.status == "failed" else "") + first
