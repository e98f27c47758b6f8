"""Headless runner: `python -m helpers.course.run [NOTEBOOK ...]` executes notebooks with papermill.

Each run owns a new folder runs/<timestamp>-<device>[-k]/ (created exclusively) with the executed
notebooks, the recorded results (JSON), one log per notebook (its kernel's own messages), a summary
and a report (report.md, report.html). Every notebook runs in a worker process of its own; SIGINT
(Ctrl-C) or SIGTERM stops the workers and their kernels, marks the notebooks that were running as
interrupted (with their cell), writes summary and report for what finished and exits non-zero.

Cell numbers count the notebook's non-empty code cells from 1, as committed (without papermill's
injected-parameters cell): cell N is the one JupyterLab labels [N] after "Restart Kernel and Run
All Cells". Exit status: 0 all ok, 1 a notebook failed or an output could not be written, 2 a usage
error, 130 / 143 interrupted by SIGINT / SIGTERM.
"""
from __future__ import annotations

import argparse
import ast
import datetime as _dt
import difflib
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from helpers.course import report
from helpers.course.processes import OneLineParser, Stop, folder_problem, positive_argument
from helpers.course.worker import Outcome, Workers, status_word, summary_table, worker_main
from helpers.measure.params import PROFILES, resolve_profile
from helpers.measure.results import REPO_ROOT, device_slug, read_records, write_atomic

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
RUNNER_OWNED = ("INTERACTIVE", "RESULTS_DIR")  # the runner sets these; -p may not


class UsageError(Exception):
    """A command line the runner refuses before anything runs (one line, exit status 2)."""


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
            raise UsageError(f"no notebook matches {item!r} in {folder} (available: {names})")
        chosen += [h for h in hits if h not in chosen]
    return chosen


def parse_parameter(text: str) -> tuple[str, object]:
    """'NAME=VALUE' -> (NAME, python literal of VALUE, or the string itself).

    A literal must be what papermill writes into a notebook and JSON holds: None, True/False, an int, a
    finite float, a string, or lists and dicts (string keys) of them. Raises argparse.ArgumentTypeError
    for anything else (1e999 is inf, a tuple would reach the notebook as a string), naming the value.
    """
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"parameter {text!r} must look like NAME=VALUE")
    name, raw = text.split("=", 1)
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        value = raw
    problem = _not_json(value)
    if problem:
        raise argparse.ArgumentTypeError(f"-p {name.strip()}={raw}: {problem}")
    return name.strip(), value


def _not_json(value) -> str:
    """Why `value` cannot be a notebook parameter, or '' when it can (see parse_parameter)."""
    if value is None or isinstance(value, (bool, int, str)):
        return ""
    if isinstance(value, float):
        return "" if math.isfinite(value) else f"{value!r} is not a finite number; give a finite value"
    if isinstance(value, list):
        return next(filter(None, map(_not_json, value)), "")
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return "a dict's keys must be strings"
        return next(filter(None, map(_not_json, value.values())), "")
    return (f"a {type(value).__name__} cannot be a notebook parameter; give a number, a string, "
            "True/False, None, or a list or dict of them")


def notebook_parameters(path: Path) -> list[str]:
    """Names assigned in the notebook's cell tagged `parameters`, in order ([] when it has none)."""
    import nbformat  # heavy: a second to import, and only a run that reads notebooks needs it

    nb = nbformat.read(path, as_version=4)
    cell = next((c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    if cell is None:
        return []
    try:
        tree = ast.parse(cell.source)
    except SyntaxError as err:
        raise UsageError(f"{path.name}: its parameters cell is not valid Python ({err.msg})") from None
    names = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        names += [t.id for t in targets if isinstance(t, ast.Name) and t.id not in names]
    return names


def route_parameters(notebooks: list[Path], given: dict) -> dict[Path, dict]:
    """The -p values each notebook gets: only the names its parameters cell declares.

    Raises UsageError for a name the runner sets itself, or one that no selected notebook declares
    (naming the allowed ones and the closest match), before anything runs.
    """
    declared = {nb: notebook_parameters(nb) for nb in notebooks}
    for name in given:
        if name in RUNNER_OWNED:
            raise UsageError(f"-p {name}: the runner sets {name} itself (use --out for where results go)")
        if not any(name in names for names in declared.values()):
            allowed = sorted({n for names in declared.values() for n in names} - set(RUNNER_OWNED))
            close = difflib.get_close_matches(name, allowed, n=1) or [n for n in allowed if n.lower() == name.lower()]
            hint = f" (did you mean {close[0]}?)" if close else ""
            which = notebooks[0].stem if len(notebooks) == 1 else "the selected notebooks"
            raise UsageError(f"-p {name}: {which} has no parameter {name!r}{hint}; allowed: {', '.join(allowed)}")
    return {nb: {k: v for k, v in given.items() if k in names} for nb, names in declared.items()}


# ---------------------------------------------------------------------------------------------
# the command line

def conditions(jobs: int, threads: int, cuda: bool, explicit: bool) -> str:
    """One sentence on how notebooks share this machine, and why (shown in each notebook and the report). On a
    CPU every notebook runs torch on one thread (`params.setup`), timed on that thread's own CPU clock."""
    cores = os.cpu_count() or 1
    each = f"{threads} torch thread(s)" if cuda else "1 torch thread, timed on its own CPU clock,"
    if jobs == 1:
        return (f"1 notebook at a time ({'--jobs 1' if explicit else 'the default'}), {each} "
                f"on {cores} core(s): no other notebook of this run shares the {'GPU' if cuda else 'cores'}, as when "
                "notebook 00 measured its ceilings (other programs on the machine are not controlled)")
    return (f"{jobs} notebooks at a time (--jobs {jobs}), {each} each on {cores} core(s): "
            f"they compete for {'the GPU' if cuda else 'cores and memory bandwidth'}, so timings and fractions "
            "of notebook 00's ceilings (measured alone) are lower than a notebook alone would get")


def build_parser() -> argparse.ArgumentParser:
    """The command line of the runner."""
    p = OneLineParser(
        prog="python -m helpers.course.run",
        description="Execute course notebooks headlessly with papermill and write a report of their results. "
                    "Failing cells are numbered as JupyterLab's [N] after 'Restart Kernel and Run All Cells'.",
        epilog="Example: python -m helpers.course.run 00 01 --profile smoke -p SEED=1")
    p.add_argument("notebooks", nargs="*",
                   help="notebooks to run: number prefix (00), stem (00_hardware) or path; default: all")
    p.add_argument("--profile", default=None, choices=PROFILES,
                   help="auto picks 'full' on CUDA and 'smoke' on CPU (default: auto, or -p PROFILE=...)")
    p.add_argument("-p", "--parameter", action="append", default=[], type=parse_parameter, metavar="NAME=VALUE",
                   help="notebook parameter (python literal), repeatable; e.g. -p SEED=1; a name must be in the "
                        "notebook's parameters cell and goes only to the notebooks that declare it")
    p.add_argument("--jobs", type=positive_argument(int), default=None,
                   help="notebooks executed at once (default: 1, so that timings are not shared; more is faster "
                        "but each notebook's environment block and the report say that timings were shared)")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "runs",
                   help="parent folder of the run folder (default: runs/)")
    p.add_argument("--notebooks-dir", type=Path, default=NOTEBOOKS_DIR,
                   help="where to look for notebooks (default: notebooks/)")
    p.add_argument("--references", type=Path, default=REPO_ROOT / "results",
                   help="folder of reference results, one sub-folder per GPU (default: results/)")
    p.add_argument("--timeout", type=positive_argument(int), default=None,
                   help="seconds allowed per cell (default: none)")
    p.add_argument("--no-report", action="store_true", help="skip writing report.md and report.html")
    p.add_argument("--full-on-cpu", action="store_true",
                   help="run the full profile although no GPU is visible (its sizes are made for one 80-141 GB GPU)")
    p.add_argument("--save-reference", action="store_true",
                   help="also copy this run's records into <references>/<device>/ (for reference GPU runs)")
    p.add_argument("--list", action="store_true", help="list the notebooks that would run, then exit")
    return p


def make_run_dir(out: Path) -> Path:
    """Create a new run folder under `out`, exclusively: a second run in the same second gets '-2'."""
    out.mkdir(parents=True, exist_ok=True)
    base = f"{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{device_slug()}"
    for k in range(1, 10_000):
        run_dir = out / (base if k == 1 else f"{base}-{k}")
        try:
            run_dir.mkdir()
        except FileExistsError:
            continue
        for sub in ("notebooks", "results", "logs"):
            (run_dir / sub).mkdir()
        return run_dir
    raise FileExistsError(f"{out}: 10,000 run folders named {base}")


def _profile(args, given: dict) -> str:
    """The profile asked for, from --profile or -p PROFILE (they must agree)."""
    if "PROFILE" in given:
        value = given.pop("PROFILE")
        if value not in PROFILES:
            raise UsageError(f"-p PROFILE={value!r}: choose one of {', '.join(PROFILES)}")
        if args.profile is not None and args.profile != value:
            raise UsageError(f"--profile {args.profile} and -p PROFILE={value} disagree; give one of them")
        return value
    return args.profile or "auto"


def main(argv: list[str] | None = None) -> int:
    """Run the selected notebooks, print the summary, write the report; see the module docstring for the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker_main(argv[1])
    with Stop() as stop:
        try:
            return _main(build_parser().parse_args(argv), stop)
        except UsageError as err:
            print(f"helpers.course.run: {err}", file=sys.stderr)
            return 2


def _main(args, stop: Stop) -> int:
    notebooks = find_notebooks(args.notebooks, args.notebooks_dir)
    if args.list:
        print("\n".join(str(p) for p in notebooks))
        return 0
    if not notebooks:
        raise UsageError(f"no notebooks (*.ipynb) in {args.notebooks_dir}")
    given = dict(args.parameter)
    asked = _profile(args, given)
    routed = route_parameters(notebooks, given)
    import torch  # heavy: only a run needs it; the workers (--worker), --list and usage errors do not

    profile, cuda = resolve_profile(asked), torch.cuda.is_available()
    if profile == "full" and not cuda and not args.full_on_cpu:
        raise UsageError("the full profile is sized for one 80-141 GB GPU and no GPU is visible: on a CPU it would "
                         "run for hours, if memory lasts. Run the smoke profile, or pass --full-on-cpu to run it anyway")
    jobs = min(args.jobs or 1, len(notebooks))
    threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 and not cuda else torch.get_num_threads()
    try:
        run_dir = make_run_dir(args.out)
    except OSError as err:
        print(f"helpers.course.run: cannot create a run folder under {args.out}: {err.strerror or err}", file=sys.stderr)
        return 2
    problem = folder_problem(run_dir)  # a full disk makes the folder and fails the first real write
    if problem:
        print(f"helpers.course.run: the run folder cannot be written: {problem}", file=sys.stderr)
        return 2
    why = conditions(jobs, threads, cuda, args.jobs is not None)
    env = {**os.environ, "COURSE_HEADLESS": "1", "MPLBACKEND": "module://matplotlib_inline.backend_inline",
           "COURSE_RUN_CONDITIONS": why}
    env["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache_dir(env, say=print)
    if jobs > 1 and not cuda:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    base = {"PROFILE": profile, "INTERACTIVE": False, "RESULTS_DIR": str((run_dir / "results").resolve())}
    print(f"running {len(notebooks)} notebook(s), profile {profile}{'' if asked == profile else f' ({asked})'} "
          f"-> {run_dir}\nconditions: {why}", flush=True)
    outcomes = _run_all(notebooks, routed, base, Workers(run_dir, env, args.timeout), jobs, stop, run_dir)
    print("\n" + summary_table(outcomes))
    code = 0 if all(o.ok for o in outcomes) else 1
    if not _write(run_dir / "summary.json", json.dumps([asdict(o) for o in outcomes], indent=2)):
        code = 1
    if not args.no_report:
        try:
            md, html = report.write_report(run_dir, outcomes, args.references, profile=profile, conditions=why, asked=asked)
            print(f"\nreport: {md}\n        {html}")
        except OSError as err:
            print(f"helpers.course.run: report not written: {err.filename or run_dir}: {err.strerror or err}")
            code = 1
    if args.save_reference:
        try:
            saved, problems = save_reference(run_dir / "results", args.references / device_slug())
        except OSError as err:
            print(f"helpers.course.run: references not saved: {err.filename or args.references}: {err.strerror or err}")
            return stop.signum + 128 if stop.why else 1
        print(f"copied {len(saved)} record(s) to {args.references / device_slug()}")
        for path, reason in problems:
            print(f"  not copied: {path}: {reason}")
    return stop.signum + 128 if stop.why else code


def inductor_cache_dir(env: dict, say=lambda line: None) -> str:
    """The one Inductor cache folder (TORCHINDUCTOR_CACHE_DIR) every notebook kernel of a run shares.

    The caller's own setting in `env` wins; otherwise `inductor/` under the course cache folder
    (`helpers.gpt.data.resolve_cache_dir()`), which outlives the run: torch.compile's compiled graphs and
    kernels are then reused by later notebooks and later runs, which so skip the cold compiles, while a
    notebook that measures a cold compile uses a folder of its own. Where that folder cannot be written
    (a read-only home, a path under a file), a new temporary folder for this run, and `say` gets one
    line saying so: an unwritable cache would break every torch.compile of the run.
    """
    if env.get("TORCHINDUCTOR_CACHE_DIR"):
        return env["TORCHINDUCTOR_CACHE_DIR"]
    from helpers.gpt.data import resolve_cache_dir  # heavy: imports torch, which the runner's workers never load

    folder = (resolve_cache_dir() / "inductor").resolve()
    problem = folder_problem(folder)
    if not problem:
        return str(folder)
    fallback = tempfile.mkdtemp(prefix="course-inductor-")
    say(f"helpers.course.run: the course's compile cache cannot be written ({problem}); "
        f"torch.compile caches in {fallback} for this run")
    return fallback


def _write(path: Path, text: str) -> bool:
    """Write one output file atomically; on failure say so in one line and return False."""
    try:
        write_atomic(path, text)
        return True
    except OSError as err:
        print(f"helpers.course.run: could not write {path}: {err.strerror or err}")
        return False


def _run_all(notebooks, routed, base, workers: Workers, jobs: int, stop: Stop, run_dir: Path) -> list[Outcome]:
    """Notebook 00 alone first (it measures the ceilings the others compare against), then the rest."""
    first = [nb for nb in notebooks if nb.stem.startswith("00")]
    queue = first + [nb for nb in notebooks if nb not in first]
    outcomes: list[Outcome] = []
    next_watch = 0.0
    try:
        while (queue or workers.running) and not stop.why:
            while queue and not stop.why and _may_start(queue[0], list(workers.running), jobs):
                nb = queue.pop(0)
                workers.start(nb, {**routed[nb], **base})
            if time.monotonic() >= next_watch:  # a /proc scan: each second while kernels start, then rarely
                workers.watch()
                young = any(time.perf_counter() - w[1] < 30 for w in workers.running.values())
                next_watch = time.monotonic() + (1.0 if young else 10.0)
            for nb in workers.finished():
                o = workers.collect(nb)
                print(f"  {o.notebook}: {status_word(o)} in {o.seconds:.1f} s", flush=True)
                outcomes.append(o)
                _write(run_dir / "summary.json", json.dumps([asdict(x) for x in outcomes], indent=2))
            time.sleep(0.2)
    finally:
        if workers.running:  # a signal, or an error in the runner itself: nothing may outlive it
            outcomes += workers.stop(stop.why or "the runner's own error")
    outcomes += [Outcome(nb.stem, False, 0.0, None, f"not run ({stop.why})", status="not run") for nb in queue]
    order = [nb.stem for nb in notebooks]
    return sorted(outcomes, key=lambda o: order.index(o.notebook) if o.notebook in order else len(order))


def _may_start(nb: Path, running: list[Path], jobs: int) -> bool:
    """Whether `nb` may start now: at most `jobs` at once, and notebook 00 always alone."""
    if not running:
        return True
    is_00 = lambda p: p.stem.startswith("00")  # noqa: E731
    return not is_00(nb) and not any(map(is_00, running)) and len(running) < jobs


def save_reference(results_dir: Path, target: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Copy every readable record of a run into a reference folder (results/<device>/), replacing older ones.

    Returns (copied paths, [(path, reason)] for files that were not copied because they are unreadable).
    """
    target.mkdir(parents=True, exist_ok=True)
    good, bad = read_records(results_dir)
    return [write_atomic(target / p.name, p.read_bytes()) for p, _ in good], bad


if __name__ == "__main__":
    sys.exit(main())
