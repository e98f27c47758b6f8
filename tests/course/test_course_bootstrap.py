"""The course's start cell (helpers.course.bootstrap): the same first code cell in every notebook, what it does
with the course installed and without it, the README's Colab links; and, in the notebook tier, notebooks copied
out of the repository into a fresh environment with another torch, started by that cell and run in smoke."""
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.course import bootstrap

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_starts_with_the_one_start_cell_then_its_parameters(path):
    first, second = _code_cells(path)[:2]
    assert "".join(first["source"]) == bootstrap.CELL, f"{path.name}: run python -m helpers.course.bootstrap on it"
    assert first["id"] == bootstrap.CELL_ID and first["metadata"] == {}
    assert "parameters" in second["metadata"].get("tags", []), "papermill injects after the tagged cell"


def test_the_cell_is_short_stdlib_and_installs_from_the_one_address():
    assert bootstrap.SOURCE in bootstrap.CELL and bootstrap.REPOSITORY in bootstrap.SOURCE
    lines = bootstrap.CELL.splitlines()
    assert len(lines) <= 20 and max(map(len, lines)) <= 120
    imported = {n for line in lines for n in re.findall(r"^import (.+)$", line) for n in n.split(", ")}
    assert imported <= set(sys.stdlib_module_names) | {"importlib.metadata"}


def _run_cell(monkeypatch, capsys, installed: bool, uv: str | None):
    """Execute the cell in a fresh namespace, with the course importable or not, and the installer recorded."""
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, check: calls.append(cmd))
    monkeypatch.setattr(shutil, "which", lambda name: uv if name == "uv" else None)
    monkeypatch.setenv("COURSE_SOURCE", "/some/clone")
    if not installed:
        monkeypatch.setitem(sys.modules, "helpers.course", None)  # an import of it then raises ModuleNotFoundError
    exec(compile(bootstrap.CELL, "start cell", "exec"), {})
    return calls, capsys.readouterr().out.strip().splitlines()


def test_with_the_course_installed_the_cell_says_where_and_installs_nothing(monkeypatch, capsys):
    calls, out = _run_cell(monkeypatch, capsys, installed=True, uv="/usr/bin/uv")
    assert calls == [] and out == [f"course found: {ROOT / 'helpers'}"]


@pytest.mark.parametrize("uv", [None, "/usr/local/bin/uv"])
def test_without_it_the_cell_installs_the_source_keeping_torch_at_its_version(monkeypatch, capsys, uv):
    calls, out = _run_cell(monkeypatch, capsys, installed=False, uv=uv)
    torch = f"torch=={importlib.metadata.version('torch')}"
    head = [uv, "pip", "install", "--python", sys.executable] if uv else [sys.executable, "-m", "pip", "install"]
    assert calls == [head + ["--quiet", "/some/clone", torch]]
    assert out == [f"installed the course from /some/clone with {'uv' if uv else Path(sys.executable).name}, keeping {torch}"]


def test_the_writer_puts_the_cell_first_once_and_touches_nothing_else(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "id": "t", "metadata": {}, "source": ["# title"]},
                    {"cell_type": "code", "id": "p", "metadata": {"tags": ["parameters"]}, "outputs": [],
                     "execution_count": None, "source": ["N = 1"]}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    bootstrap.main([str(path)])
    once = path.read_text()
    bootstrap.main([str(path)])
    assert path.read_text() == once
    cells = json.loads(once)["cells"]
    assert [c["id"] for c in cells] == ["t", bootstrap.CELL_ID, "p"] and cells[2]["source"] == ["N = 1"]
    with pytest.raises(ValueError, match="no code cell"):
        bootstrap.with_cell({"cells": [nb["cells"][0]]})


def test_the_readme_opens_every_notebook_on_colab_from_the_one_address(monkeypatch):
    links = re.findall(r"\((https://colab\.research\.google\.com/[^)]+)\)", (ROOT / "README.md").read_text())
    assert links == [bootstrap.colab_url(p.name) for p in NOTEBOOKS]
    monkeypatch.setattr(bootstrap, "REPOSITORY", "https://example.org/course")
    with pytest.raises(ValueError, match="GitHub"):
        bootstrap.colab_url("00_hardware.ipynb")
