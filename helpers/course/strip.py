"""Leave notebooks exactly as the repository keeps them: no outputs, no execution counts, no widget state.

`python -m helpers.course.strip notebooks/*.ipynb` (or `make strip`) rewrites each file in place and
prints the ones it changed; `--check` only reports, and exits 1 when a file would change.
`jupyter nbconvert --clear-output` is not enough: it keeps the widget state in the metadata.
A notebook executed by papermill (or the course runner) strips back to its committed form: the cells
papermill inserts (its injected parameters, its error banners) and the runner's notes go too, and
`language_info` keeps only the language's name (the kernel's version and the rest are the machine's). A file
that cannot be read as a notebook, or written, is one line on stderr; the files after it are still
stripped, and the exit status is 1.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat

from helpers.course.processes import OneLineParser
from helpers.course.worker import MARKER_TAG
from helpers.measure.results import write_atomic

# metadata that a run adds and the repository does not keep
NOTEBOOK_KEYS = ("widgets", "papermill", "course_run")
CELL_KEYS = ("execution", "papermill", "collapsed", "scrolled", "ExecuteTime")
# cells that a run inserts: papermill's injected parameters, papermill's error banners and the runner's notes
INSERTED_TAGS = ("injected-parameters", MARKER_TAG)
# what the repository keeps of `language_info`; a kernel adds its version, mimetype, lexer...
LANGUAGE_KEYS = ("name",)


def strip(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Remove outputs, execution counts, run metadata and the cells a run inserted from `nb` (in place); return it."""
    for key in NOTEBOOK_KEYS:
        nb.metadata.pop(key, None)
    info = nb.metadata.get("language_info")
    if isinstance(info, dict):
        nb.metadata["language_info"] = {k: v for k, v in info.items() if k in LANGUAGE_KEYS}
    nb.cells = [c for c in nb.cells if not set(c.get("metadata", {}).get("tags", [])) & set(INSERTED_TAGS)]
    for cell in nb.cells:
        for key in CELL_KEYS:
            cell.metadata.pop(key, None)
        if cell.metadata.get("tags") == []:  # papermill gives every cell a tags list; the repository keeps none empty
            cell.metadata.pop("tags")
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


def strip_file(path: str | os.PathLike, *, check: bool = False) -> bool:
    """Strip one notebook file atomically; return True when its content changed (or would, with check).

    Raises ValueError naming the file when it is not a readable notebook (torn JSON, not nbformat 4),
    OSError when it cannot be read or written."""
    path = Path(path)
    try:
        before = path.read_text(encoding="utf-8")
        nb = strip(nbformat.reads(before, as_version=4))
    except OSError:
        raise
    except Exception as err:  # nbformat raises NotJSONError, ValidationError, KeyError... for a torn file
        text = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise ValueError(f"{path}: not a readable notebook ({text})") from None
    after = nbformat.writes(nb) + "\n"
    if after == before:
        return False
    if not check:
        write_atomic(path, after, fsync=False)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m helpers.course.strip", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="notebooks to strip")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file is not stripped")
    args = parser.parse_args(argv)
    changed, broken = [], 0
    for p in args.paths:
        try:
            if strip_file(p, check=args.check):
                changed.append(p)
                print(f"{'not stripped' if args.check else 'stripped'}: {p}")
        except ValueError as err:
            print(f"{parser.prog}: {err}", file=sys.stderr)
            broken += 1
        except OSError as err:
            print(f"{parser.prog}: {err.filename or p}: {err.strerror or err}", file=sys.stderr)
            broken += 1
    return 1 if broken or (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
