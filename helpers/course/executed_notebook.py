"""What the report reads from an executed notebook: the notebook itself (or why it cannot be read), its code
cells numbered as JupyterLab labels them, its figures saved as PNG files, its title and each figure's caption.

Functions that take `problems` append (path, reason) to it when it is a list and raise when it is None.
"""
from __future__ import annotations

import base64
from pathlib import Path

from helpers.measure.results import write_atomic


def problem(problems: list | None, path: Path, reason: str, err: Exception) -> None:
    """Append (path, reason) to `problems`, or raise `err` when no list is given."""
    if problems is None:
        raise err
    problems.append((path, reason))


def read_executed(notebook: Path, problems: list | None):
    """The executed notebook, or None when it cannot be read: (path, reason) is then appended to `problems`
    when a list is given, else the error is raised."""
    import nbformat  # heavy: a second to import, and only a report with executed notebooks needs it

    try:
        nb = nbformat.read(notebook, as_version=4)
        nb.cells = list(nb.cells)
        return nb
    except Exception as err:  # torn JSON, not a notebook, unreadable: the report goes on without it
        problem(problems, notebook, f"unreadable executed notebook ({type(err).__name__}: {str(err)[:200]})", err)
        return None


def code_cell_numbers(nb) -> dict[int, int]:
    """{cell index: code cell number} of the read notebook `nb`: its code cells counted from 1 as JupyterLab
    labels them in the notebook a learner opens (papermill's injected-parameters cell not counted)."""
    out, n = {}, 0
    for i, cell in enumerate(nb.cells):
        if isinstance(cell, dict) and cell.get("cell_type") == "code" and \
                "injected-parameters" not in cell.get("metadata", {}).get("tags", []):
            n += 1
            out[i] = n
    return out


def save_figures(nb, notebook: Path, figures_dir: Path, problems: list | None) -> list[tuple[int, Path]]:
    """(cell index, saved file) for every PNG output of the read notebook `nb`, each written atomically.

    An image that is not valid base64 PNG, or a figure that cannot be written, is appended to `problems` as
    (path, reason) when a list is given, else raised."""
    saved, numbers = [], code_cell_numbers(nb)
    for i, cell in enumerate(nb.cells):
        for k, out in enumerate(cell.get("outputs", []) if isinstance(cell, dict) else []):
            data = out.get("data", {}).get("image/png") if isinstance(out, dict) else None
            if not data:
                continue
            path = figures_dir / f"{notebook.stem}-code-cell{numbers.get(i, 0):02d}-{k}.png"
            try:
                png = base64.b64decode(data if isinstance(data, str) else "".join(data), validate=False)
                if not png.startswith(b"\x89PNG"):
                    raise ValueError("not a PNG image")
                figures_dir.mkdir(parents=True, exist_ok=True)
                saved.append((i, write_atomic(path, png, fsync=False)))
            except (ValueError, TypeError, OSError) as err:
                why = f"{err.strerror}" if isinstance(err, OSError) and err.strerror else str(err)
                problem(problems, path if isinstance(err, OSError) else notebook,
                         f"figure of cell {i}, output {k} not saved: {why}", err)
    return saved


def title(nb, stem: str) -> str:
    """The read notebook's first markdown heading ('02 · FLOPs and MFU'), else `stem`."""
    try:
        for cell in nb.cells:
            if cell.cell_type == "markdown" and cell.source.lstrip().startswith("# "):
                return cell.source.lstrip()[2:].splitlines()[0].strip()
    except Exception:  # a malformed cell: the file name will do
        pass
    return stem


SKIP_SECTIONS = ("Play with it", "Exercises")   # figures there are the learner's, not the measurement's


def captions(nb) -> dict[int, str]:
    """{cell index: caption} of the read notebook `nb`, from the section heading each code cell sits under,
    and its code cell number as JupyterLab labels it (papermill's injected-parameters cell not counted)."""
    out, heading, numbers = {}, "", code_cell_numbers(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("## ") or line.startswith("### "):
                    heading = line.lstrip("#").strip()
        elif i in numbers:
            out[i] = f"{heading} (code cell {numbers[i]})" if heading else f"code cell {numbers[i]}"
    return out
