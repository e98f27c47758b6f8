"""Every committed notebook is clean, has a parameters cell, validates its parameters and runs in smoke.

A notebook with an instructor panel is run in full by the browser suite as well (JupyterLab's Run
All Cells in the smoke profile, then its controls moved; tests/browser/test_panels_live.py), which
checks what the smoke run here checks: every cell ran, no traceback, records written. When that suite
can run (Chromium and Playwright present), the papermill run of such a notebook is skipped here, so
that CI does not execute it twice (except the first notebook, for the headless path); without
them it runs here as before.
"""
import importlib.util
from pathlib import Path

import nbformat
import papermill as pm
import pytest
from notebook_support import keep_quiet

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
BROWSER = ROOT / "tests" / "browser"


def _module(path: Path):
    """A file of the browser suite as a plain module (tests/browser is not a package)."""
    spec = importlib.util.spec_from_file_location(f"_browser_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_by_the_browser_suite(path: Path) -> bool:
    """Whether the browser suite will Run All Cells of this notebook in this session. The first
    notebook always runs here too, so that the headless path (INTERACTIVE=False) is run end to end."""
    if path == NOTEBOOKS[0] or _module(BROWSER / "conftest.py").missing_requirement() is not None:
        return False
    return _module(BROWSER / "test_panels_live.py").panel_count(path) > 0


def test_there_are_notebooks():
    assert [p.stem[:2] for p in NOTEBOOKS][:2] == ["00", "01"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs_and_with_parameters(path):
    nb = nbformat.read(path, as_version=4)
    assert "widgets" not in nb.metadata, "widget state is committed"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"cell {i} has outputs"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    source = tagged[0].source
    for name in ("PROFILE", "SEED", "INTERACTIVE", "RESULTS_DIR"):
        assert f"{name} =" in source
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_code_cell_compiles_on_this_python(path):
    """A syntax error (an f-string quote only Python 3.12 allows, a broken edit) fails here in a second, not after
    the cells before it ran for a minute."""
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        code = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
        try:
            compile(code, f"{path.name} code cell {i + 1}", "exec")
        except SyntaxError as err:
            pytest.fail(f"{path.name}, code cell {i + 1}: {err}")


def test_the_strip_command_leaves_a_notebook_as_the_tests_require(tmp_path):
    from helpers.course import strip

    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", text="hi")]
    code.execution_count = 3
    code.metadata["execution"] = {"iopub.status.busy": "x"}
    path = tmp_path / NOTEBOOKS[0].name
    nbformat.write(nb, path)
    assert strip.main(["--check", str(path)]) == 1
    assert strip.main([str(path)]) == 0
    assert strip.main(["--check", str(path)]) == 0
    test_committed_without_outputs_and_with_parameters(path)
    assert path.read_text() == NOTEBOOKS[0].read_text()  # exactly the committed form


def _execute(path, tmp_path, **parameters):
    params = {"PROFILE": "smoke", "INTERACTIVE": False, "RESULTS_DIR": str(tmp_path / "results"), **parameters}
    return pm.execute_notebook(str(path), str(tmp_path / path.name), parameters=params, cwd=str(path.parent),
                               kernel_name="python3", progress_bar=False)


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_smoke_profile(path, tmp_path, monkeypatch, quiet_smoke):
    if run_by_the_browser_suite(path):
        pytest.skip("run in full by the browser suite (test_instructor_panels_redraw_in_jupyterlab)")
    monkeypatch.setenv("COURSE_HEADLESS", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    _execute(path, tmp_path)
    assert list((tmp_path / "results").glob("*.json")), "the notebook recorded nothing"
    keep_quiet(tmp_path / "results", quiet_smoke)


@pytest.mark.notebook
def test_a_bad_profile_fails_with_a_value_error_naming_it(tmp_path):
    with pytest.raises(pm.PapermillExecutionError) as err:
        _execute(NOTEBOOKS[0], tmp_path, PROFILE="fast")
    assert err.value.ename == "ValueError"
    assert "PROFILE='fast'" in err.value.evalue and "'smoke'" in err.value.evalue and "'full'" in err.value.evalue
