"""The course's start cell (helpers.course.bootstrap): the same first code cell in every notebook, what it does
with the course installed and without it, the README's Colab links; and, in the notebook tier, notebooks copied
out of the repository into a fresh environment with another torch, started by that cell and run in smoke."""
import importlib.metadata
import json
import os
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


def test_the_address_is_the_one_pyproject_names():
    urls = (ROOT / "pyproject.toml").read_text().split("[project.urls]", 1)[1].split("\n[", 1)[0]
    assert re.findall(r'^Repository = "([^"]+)"', urls, re.M) == [bootstrap.REPOSITORY]


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
    assert out == [f"installed the course from /some/clone with {'uv' if uv else 'pip'}, keeping {torch}"]


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


# ---------------------------------------------------------------- the start, tested as a learner meets it

MAKEFILE_TORCH = re.search(r"^TORCH\s*\?=\s*torch==(\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
WHEELS = [Path("/opt/pypi-more/files"), Path("/opt/wheels"), Path("/opt/pypi/files")]  # wheels on this disk
INDEXES = ["file:///opt/pypi/simple", "file:///opt/pypi-more/simple"]  # local package indexes, tried before PyPI
STARTED = ["00_hardware", "03_mixed_precision", "08_quantization"]


def other_torch() -> str | None:
    """A torch release, other than the Makefile's, whose wheel for this Python lies on this disk, or None."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for folder in WHEELS:
        for wheel in sorted(folder.glob(f"torch-*-{tag}-*.whl"), reverse=True):
            version = wheel.name.split("-")[1]  # as its metadata says it, a local label (+cpu) included
            if version.split("+")[0] != MAKEFILE_TORCH:
                return version
    return None


def _no_error_outputs(path: Path) -> list[str]:
    """Each code cell's error output or traceback text in executed notebook `path`, as 'cell N: ...'."""
    found = []
    for i, cell in enumerate(_code_cells(path), 1):
        for out in cell.get("outputs", []):
            text = "".join(out.get("text", "")) if out.get("output_type") == "stream" else ""
            if out.get("output_type") == "error" or "Traceback (most recent call last)" in text:
                found.append(f"cell {i}: {out.get('ename') or text[:200]}")
    return found


@pytest.mark.notebook
@pytest.mark.slow
def test_notebooks_copied_out_start_in_a_fresh_environment_with_another_torch(tmp_path):
    """A fresh virtual environment with only ipykernel, papermill and a torch that is not the Makefile's; notebooks
    00, 03 and 08 copied out of the repository; the start cell pointed at this clone's package (COURSE_SOURCE: a copy
    of pyproject.toml, README.md and helpers/, so that the build writes nothing into the clone). Each runs
    to the end in smoke with no traceback, the first one's start cell says it installed the course, the others'
    find it installed in that environment, and torch is the same release afterwards. Packages come from the local
    indexes first, PyPI only for what they lack (here: uv, papermill and entrypoints, bitsandbytes, torchao,
    cuda-bindings); uv installs everything (pip takes minutes for the same)."""
    torch = other_torch()
    if torch is None:
        pytest.skip(f"no torch wheel other than the Makefile's {MAKEFILE_TORCH} on this disk ({', '.join(map(str, WHEELS))})")
    venv, work, clone = tmp_path / "venv", tmp_path / "copies", tmp_path / "clone"
    for part in ("pyproject.toml", "README.md"):
        (clone / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / part, clone / part)
    shutil.copytree(ROOT / "helpers", clone / "helpers", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_CONSTRAINT")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", COURSE_SOURCE=str(clone), COURSE_HEADLESS="1",
               UV_EXTRA_INDEX_URL=" ".join(i for i in INDEXES if Path(i[len("file://"):]).is_dir()),
               UV_FIND_LINKS=",".join(str(d) for d in WHEELS if d.is_dir()), UV_NO_PROGRESS="1")

    def run(*cmd, timeout=600):
        done = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{(done.stdout + done.stderr)[-3000:]}"
        return done.stdout

    work.mkdir()
    run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    try:
        _start_and_run(torch, venv, work, clone, tmp_path, run)
    finally:  # the environment is gigabytes (uv links it from its cache); nothing in it is needed afterwards
        shutil.rmtree(venv, ignore_errors=True)


def _start_and_run(torch, venv, work, clone, tmp_path, run):
    """The fresh environment's packages, then the three notebooks, then the checks (see the test above)."""
    python = str(venv / "bin" / "python")
    try:  # uv into the fresh environment, by this environment's pip (uv is on PyPI only)
        run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "uv", timeout=300)
    except AssertionError as err:
        pytest.skip(f"uv could not be installed into the fresh environment: {str(err)[-300:]}")
    run(str(venv / "bin" / "uv"), "pip", "install", "--quiet", "--python", python, f"torch=={torch}", "ipykernel",
        "papermill")
    for name in STARTED:
        shutil.copy(ROOT / "notebooks" / f"{name}.ipynb", work)
        run(python, "-m", "papermill", "--no-progress-bar", "-k", "python3", f"{name}.ipynb", f"{name}.out.ipynb",
            "-p", "PROFILE", "smoke", "-p", "INTERACTIVE", "False", "-p", "RESULTS_DIR", str(tmp_path / "results"))
    first = ["".join(o.get("text", "")).strip() for name in STARTED
             for o in _code_cells(work / f"{name}.out.ipynb")[0]["outputs"]]
    keep = f"torch=={torch}"
    assert first[0] == f"installed the course from {clone} with uv, keeping {keep}", first
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    assert first[1:] == [f"course found: {site}/helpers"] * 2, first
    assert run(python, "-c", "import importlib.metadata as m; print(m.version('torch'))").strip() == torch
    errors = {name: _no_error_outputs(work / f"{name}.out.ipynb") for name in STARTED}
    assert errors == {name: [] for name in STARTED}
