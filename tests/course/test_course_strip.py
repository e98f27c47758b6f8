"""helpers.course.strip: notebooks as the repository keeps them, an executed one stripped back to its committed
form (papermill's inserted cells and the runner's notes removed), and a torn file reported in one line."""
import json

import nbformat
import psutil
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from helpers.course import strip, worker


def _committed(path, *sources):
    """A notebook as the repository keeps it: a parameters cell, code cells, stripped and written like `make strip`."""
    params = new_code_cell('PROFILE = "auto"\nRESULTS_DIR = None')
    params.metadata["tags"] = ["parameters"]
    nb = new_notebook(cells=[new_markdown_cell("# fixture"), params, *map(new_code_cell, sources)],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                                "language_info": {"name": "python"}})
    path.write_text(nbformat.writes(strip.strip(nb)) + "\n")
    return path.read_text()


def _execute(source, output, **parameters):
    """Execute with papermill as the runner's worker does; nothing it starts may outlive the call."""
    import papermill

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    try:
        papermill.execute_notebook(str(source), str(output), parameters=parameters, kernel_name="python3",
                                   progress_bar=False, cwd=str(source.parent))
    except papermill.PapermillExecutionError:
        pass
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for p in left:
        p.kill()
    assert not left, "the kernel outlived papermill"


@pytest.mark.notebook
def test_a_notebook_executed_by_papermill_strips_back_to_its_committed_form(tmp_path):
    ok, failing = tmp_path / "ok.ipynb", tmp_path / "fails.ipynb"
    committed_ok = _committed(ok, "x = 1\nprint(x)", "import matplotlib\nx * 2")
    committed_failing = _committed(failing, "x = 1", "raise RuntimeError('on purpose')", "y = 2")
    _execute(ok, tmp_path / "ok-run.ipynb", PROFILE="smoke")
    _execute(failing, tmp_path / "fails-run.ipynb", PROFILE="smoke")
    ran = nbformat.read(tmp_path / "ok-run.ipynb", 4)
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in ran.cells)  # what papermill adds
    assert len(ran.metadata["language_info"]) > 1 and ran.cells[3].outputs
    failed = nbformat.read(tmp_path / "fails-run.ipynb", 4)
    assert any(worker.MARKER_TAG in c.metadata.get("tags", []) for c in failed.cells)  # papermill's error banners
    worker.mark_interrupted(tmp_path / "ok-run.ipynb", 2, "SIGTERM")  # the runner's note and metadata, too
    assert strip.main([str(tmp_path / "ok-run.ipynb"), str(tmp_path / "fails-run.ipynb")]) == 0
    assert (tmp_path / "ok-run.ipynb").read_text() == committed_ok
    assert (tmp_path / "fails-run.ipynb").read_text() == committed_failing
    assert strip.main(["--check", str(tmp_path / "ok-run.ipynb")]) == 0


def test_a_torn_notebook_is_one_line_and_the_files_after_it_are_still_stripped(tmp_path, capsys):
    first, torn, missing, last = (tmp_path / n for n in ("a.ipynb", "torn.ipynb", "missing.ipynb", "z.ipynb"))
    for path in (first, last):
        nb = new_notebook(cells=[new_code_cell("1 + 1", execution_count=3,
                                               outputs=[new_output("execute_result", {"text/plain": "2"})])])
        nbformat.write(nb, path)
    full = first.read_text()
    torn.write_text(full[: len(full) // 2])
    assert strip.main([str(first), str(torn), str(missing), str(last)]) == 1
    out, err = capsys.readouterr()
    assert f"stripped: {first}" in out and f"stripped: {last}" in out
    lines = err.splitlines()
    assert len(lines) == 2 and "Traceback" not in err
    assert str(torn) in lines[0] and "not a readable notebook" in lines[0]
    assert str(missing) in lines[1] and "No such file" in lines[1]
    for path in (first, last):
        cell = json.loads(path.read_text())["cells"][0]
        assert cell["outputs"] == [] and cell["execution_count"] is None
    assert torn.read_text() == full[: len(full) // 2]  # a torn file is left as it is


def test_strip_removes_outputs_counts_and_run_metadata_and_check_reports(tmp_path, capsys):
    nb = new_notebook(cells=[new_code_cell("x", execution_count=1, outputs=[new_output("stream", text="x")])],
                      metadata={"widgets": {"state": {}}, "papermill": {"parameters": {}}, "course_run": {},
                                "language_info": {"name": "python", "version": "3.11.7"}})
    nb.cells[0].metadata.update({"tags": ["parameters"], "execution": {}, "scrolled": True})
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    assert strip.main(["--check", str(path)]) == 1 and "not stripped" in capsys.readouterr().out
    assert strip.main([str(path)]) == 0
    kept = nbformat.read(path, 4)
    assert dict(kept.metadata) == {"language_info": {"name": "python"}}
    assert kept.cells[0].metadata == {"tags": ["parameters"]} and kept.cells[0].outputs == []
    assert strip.main([str(path)]) == 0 and strip.main(["--check", str(path)]) == 0
