"""helpers.course.worker: where an executed notebook stopped (cells numbered as JupyterLab numbers them),
marking an interrupted one or one whose kernel died, and the run's summary table."""
import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from helpers.course import worker


def _executed(path, cells):
    """An executed notebook by hand: cells are (source, tags, execution_count, papermill status, error name)."""
    nb_cells = [new_markdown_cell("# title")]
    for source, tags, count, status, error in cells:
        c = new_code_cell(source, execution_count=count,
                          outputs=[new_output("error", ename=error, evalue="0", traceback=[])] if error else [])
        c.metadata.update({"tags": tags, "papermill": {"status": status}})
        nb_cells.append(c)
    nbformat.write(new_notebook(cells=nb_cells), path)
    return path


def test_inspect_executed_counts_cells_as_jupyterlab_and_knows_what_ran(tmp_path):
    head = [("P = 1", ["parameters"], 1, "completed", None), ("P = 2", ["injected-parameters"], 2, "completed", None),
            ("", [], None, "completed", None)]  # an empty cell: not numbered, never run
    done = head + [("x = 1", [], 3, "completed", None)]
    assert worker.inspect_executed(_executed(tmp_path / "a.ipynb", done))["state"] == "complete"
    meant = head + [("raise X", ["raises-exception"], 3, "completed", "X"), ("y = 1", [], 4, "completed", None)]
    assert worker.inspect_executed(_executed(tmp_path / "b.ipynb", meant))["state"] == "complete"
    exits = head + [("sys.exit(0)", [], 3, "failed", "SystemExit"), ("y = 1", [], None, "pending", None)]
    found = worker.inspect_executed(_executed(tmp_path / "c.ipynb", exits))
    assert (found["state"], found["cell"]) == ("error", 2) and "SystemExit" in found["error"]
    stopped = head + [("sleep()", [], 3, "running", None), ("y = 1", [], None, "completed", None)]
    assert worker.inspect_executed(_executed(tmp_path / "d.ipynb", stopped)) == {"state": "running", "cell": 2, "error": ""}
    skipped = head + [("x = 1", [], 3, "completed", None), ("y = 1", [], None, "completed", None)]
    assert worker.inspect_executed(_executed(tmp_path / "e.ipynb", skipped))["cell"] == 3


def test_mark_interrupted_undoes_papermills_false_completed(tmp_path):
    head = [("P = 1", ["parameters"], 1, "completed", None), ("x = 1", [], 2, "completed", None)]
    path = _executed(tmp_path / "a.ipynb", head + [("sleep()", [], 3, "running", None),
                                                  ("y = 1", [], None, "completed", None)])
    worker.mark_interrupted(path, 3, "SIGTERM")
    nb = nbformat.read(path, 4)
    assert [c.metadata["papermill"]["status"] for c in nb.cells if c.cell_type == "code"] == [
        "completed", "completed", "interrupted", "pending"]
    assert "Interrupted** (SIGTERM) in code cell 3" in nb.cells[0].source
    assert worker.inspect_executed(path)["cell"] == 3  # the note is not counted as a cell
    between = _executed(tmp_path / "b.ipynb", head + [("y = 1", [], None, "completed", None)])
    worker.mark_interrupted(between, None, "SIGINT")
    assert [c.metadata["papermill"]["status"] for c in nbformat.read(between, 4).cells if c.cell_type == "code"][-1] == "pending"


def test_the_summary_names_the_failing_cell_and_the_first_line_of_its_error():
    ok = worker.Outcome("00_hardware", True, 1.5)
    failed = worker.Outcome("01_roofline", False, 2.0, 7, "ValueError: bad\nsecond line")
    stopped = worker.Outcome("02_flops_mfu", False, 3.0, 4, "interrupted by SIGINT in cell 4", status="interrupted")
    assert [worker.status_word(o) for o in (ok, failed, stopped)] == ["ok", "FAILED", "INTERRUPTED"]
    assert worker.summary_rows([ok, failed]) == [["00_hardware", "ok", "1.5", ""],
                                                 ["01_roofline", "FAILED", "2.0", "cell 7: ValueError: bad"]]
    assert worker.failure_text(stopped) == "interrupted by SIGINT in cell 4"  # the cell is in the message itself
    text = worker.summary_table([ok, failed])
    assert text.splitlines()[0].split() == worker.SUMMARY_HEADER and "cell 7: ValueError: bad" in text


def test_last_started_is_the_cell_that_was_running_when_the_kernel_died(tmp_path):
    """A dying kernel may have numbered its cell already (execution_count set) or not: papermill's start_time
    says which cell was running either way, and mark_stopped marks it failed and the cells after it pending."""
    cells = [("P = 1", ["parameters"], 1, "completed", None), ("x = 1", [], 2, "completed", None),
             ("os._exit(1)", [], 3, "completed", None), ("y = 1", [], None, "completed", None),
             ("z = 1", [], None, "completed", None)]
    path = _executed(tmp_path / "a.ipynb", cells)
    nb = nbformat.read(path, 4)
    for c in nb.cells[1:4]:
        c.metadata["papermill"]["start_time"] = "2026-12-01T00:00:00"
    nbformat.write(nb, path)
    assert worker.inspect_executed(path)["cell"] == 4  # what the execution counts alone say: one cell late
    assert worker.last_started(path) == 3
    worker.mark_stopped(path, 3, "DeadKernelError: Kernel died", title="Stopped", status="failed")
    nb = nbformat.read(path, 4)
    assert [c.metadata["papermill"]["status"] for c in nb.cells if c.cell_type == "code"] == [
        "completed", "completed", "failed", "pending", "pending"]
    assert nb.cells[0].source.startswith("**Stopped** (DeadKernelError: Kernel died) in code cell 3")
    assert nb.metadata["course_run"] == {"status": "failed", "cell": 3, "why": "DeadKernelError: Kernel died"}
    assert worker.last_started(_executed(tmp_path / "b.ipynb", cells)) is None  # nothing started


