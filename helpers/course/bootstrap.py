"""The course's start where it is not installed: the first code cell of every notebook, and the links that open a
notebook on Colab. One home for both: the repository's address (`REPOSITORY`), the cell's text (`CELL`), built
from it, and the README's Colab links (`colab_url`); `tests/course/test_course_bootstrap.py` holds every
notebook and the README to them.

The cell runs before anything of the course is importable, so it uses the standard library only. Where the course
is installed (`make lab`, `make run`, the tests) it says where it found `helpers` and does nothing else. Elsewhere
(a notebook opened alone on Colab or Kaggle) it installs the course from `$COURSE_SOURCE` (any pip requirement: a
clone's path, a `git+` URL), or from `SOURCE`, with the platform's torch required at its installed version, so
that the installer keeps it rather than replacing a build made for the platform's GPU; uv where the platform has
it on PATH (faster), pip otherwise.
"""
from __future__ import annotations

# The course's public repository, as pyproject.toml's [project.urls] names it (a test keeps them equal). It must be
# set to the real address, in both places, when the course is published: the cell's default install and the
# README's "Open in Colab" links are built from it (then `python -m helpers.course.bootstrap notebooks/*.ipynb`).
REPOSITORY = "https://github.com/llm-efficiency-measured/course"
SOURCE = f"git+{REPOSITORY}"   # the pip requirement the cell installs when $COURSE_SOURCE is unset
BRANCH = "main"

CELL = f'''\
# Start: makes the course importable where it is not installed (this notebook opened alone on Colab or Kaggle).
import importlib, importlib.metadata, os, shutil, subprocess, sys
try:
    import helpers.course  # installed: `make lab`, `make run`, or this cell run before
    print(f"course found: {{os.path.dirname(helpers.__file__)}}")
except ModuleNotFoundError:
    # where from: $COURSE_SOURCE (any pip requirement: a URL, a clone's path) or the course's repository
    source = os.environ.get("COURSE_SOURCE", "{SOURCE}")
    try:  # the platform's torch is built for its GPU: required at its own version, so the install keeps it
        keep = [f"torch=={{importlib.metadata.version('torch')}}"]
    except importlib.metadata.PackageNotFoundError:
        keep = []  # no torch yet: the course's own requirement (torch>=2.4) brings one
    uv = shutil.which("uv")  # uv where the platform has it (faster), pip otherwise
    installer = [uv, "pip", "install", "--python", sys.executable] if uv else [sys.executable, "-m", "pip", "install"]
    subprocess.run(installer + ["--quiet", source, *keep], check=True)
    importlib.invalidate_caches()
    kept = f", keeping {{keep[0]}}" if keep else ""
    print(f"installed the course from {{source}} with {{'uv' if uv else 'pip'}}{{kept}}")'''


def colab_url(notebook: str) -> str:
    """The address that opens `notebook` (a file name in notebooks/, e.g. '00_hardware.ipynb') on Colab, from the
    repository's copy on its main branch.

    Raises ValueError when `REPOSITORY` is not a github.com address (Colab opens notebooks from GitHub only)."""
    prefix = "https://github.com/"
    if not REPOSITORY.startswith(prefix):
        raise ValueError(f"Colab opens notebooks from GitHub; the repository {REPOSITORY!r} is not there")
    return f"https://colab.research.google.com/github/{REPOSITORY[len(prefix):]}/blob/{BRANCH}/notebooks/{notebook}"


CELL_ID = "course-start"   # the cell's id in every notebook (ids are unique per notebook only)


def with_cell(nb: dict) -> dict:
    """Notebook JSON `nb` (as json.load reads it) with `CELL` as its first code cell: an older copy of the cell
    (found by its id) is rewritten in place, otherwise the cell goes before the first code cell. Nothing else
    changes.

    Raises ValueError for a notebook with no code cell, or whose cells already use the id for another cell."""
    cells = nb["cells"]
    code = [i for i, c in enumerate(cells) if c["cell_type"] == "code"]
    if not code:
        raise ValueError("a notebook with no code cell has no place for the start cell")
    source = CELL.splitlines(keepends=True)
    ours = [i for i, c in enumerate(cells) if c.get("id") == CELL_ID]
    if ours and ours[0] != code[0]:
        raise ValueError(f"the cell id {CELL_ID!r} is taken by cell {ours[0]}, which is not the first code cell")
    if ours:
        cells[ours[0]]["source"] = source
    else:
        cells.insert(code[0], {"cell_type": "code", "execution_count": None, "id": CELL_ID, "metadata": {},
                               "outputs": [], "source": source})
    return nb


def main(argv: list[str] | None = None) -> int:
    """`python -m helpers.course.bootstrap notebooks/*.ipynb`: put the current `CELL` in each notebook, each file
    read just before it is written (others may be editing the notebooks), written the way `make strip` writes."""
    import json
    import sys
    from pathlib import Path

    for path in map(Path, sys.argv[1:] if argv is None else argv):
        nb = with_cell(json.loads(path.read_text(encoding="utf-8")))
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
        print(f"{path}: start cell written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
