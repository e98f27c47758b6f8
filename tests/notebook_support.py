"""A tiny course-style notebook for the runner's and the capture's tests (a parameters cell with the four
common parameters, then one code cell), and the records a quiet smoke run keeps for the loaded run's comparison."""
import nbformat


def tiny_notebook(path, body: str) -> None:
    """Write a notebook at `path`: a title, the tagged parameters cell, then `body` as its one code cell."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('PROFILE = "auto"\nSEED = 0\nINTERACTIVE = True\nRESULTS_DIR = None')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# tiny"), params, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


QUIET_RECORDS = ("summary-*.json", "claim-*.json")


def keep_quiet(results_dir, quiet_dir) -> None:
    """Copy the summary and claim records a notebook run wrote under `results_dir` into `quiet_dir` (the session's
    `quiet_smoke` folder), for tests/course/test_course_under_load.py."""
    import shutil
    from pathlib import Path

    for pattern in QUIET_RECORDS:
        for path in Path(results_dir).glob(pattern):
            shutil.copy2(path, Path(quiet_dir) / path.name)
