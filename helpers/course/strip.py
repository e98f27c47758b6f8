"""Leave notebooks exactly as the repository keeps them: no outputs, no execution counts, no widget state.

`python -m helpers.course.strip notebooks/*.ipynb` (or `make strip`) rewrites each file in place and
prints the ones it changed; `--check` only reports, and exits 1 when a file would change.
`jupyter nbconvert --clear-output` is not enough: it keeps the widget state in the metadata.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import nbformat

from helpers.measure.results import write_atomic

# metadata that a run adds and the repository does not keep
NOTEBOOK_KEYS = ("widgets", "papermill")
CELL_KEYS = ("execution", "papermill", "collapsed", "scrolled", "ExecuteTime")


def strip(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Remove outputs, execution counts and run metadata from `nb` (in place) and return it."""
    for key in NOTEBOOK_KEYS:
        nb.metadata.pop(key, None)
    for cell in nb.cells:
        for key in CELL_KEYS:
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


def strip_file(path: str | os.PathLike, *, check: bool = False) -> bool:
    """Strip one notebook file atomically; return True when its content changed (or would, with check)."""
    path = Path(path)
    before = path.read_text(encoding="utf-8")
    nb = strip(nbformat.reads(before, as_version=4))
    after = nbformat.writes(nb) + "\n"
    if after == before:
        return False
    if not check:
        write_atomic(path, after, fsync=False)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.course.strip", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="notebooks to strip")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file is not stripped")
    args = parser.parse_args(argv)
    changed = [p for p in args.paths if strip_file(p, check=args.check)]
    for p in changed:
        print(f"{'not stripped' if args.check else 'stripped'}: {p}")
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
