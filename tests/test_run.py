import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from helpers import run


def _notebook(path, *sources):
    cells = [new_markdown_cell("# fixture")]
    params = new_code_cell('PROFILE = "auto"\nINTERACTIVE = True\nRESULTS_DIR = None')
    params.metadata["tags"] = ["parameters"]
    cells.append(params)
    cells += [new_code_cell(s) for s in sources]
    nb = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                             "language": "python"}})
    nbformat.write(nb, path)


RECORD = ("from helpers import params\nfrom helpers.results import record\n"
          "S = params.setup(PROFILE, 0, INTERACTIVE, RESULTS_DIR)\nrecord('fixture', {'answer': 42})")


@pytest.fixture
def fixture_dir(tmp_path):
    folder = tmp_path / "nbs"
    folder.mkdir()
    _notebook(folder / "10_ok.ipynb", RECORD,
              "import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4]);")
    _notebook(folder / "20_fails.ipynb", "x = 1", "raise RuntimeError('broken on purpose')")
    return folder


def test_runner_exits_non_zero_and_names_the_failing_cell(fixture_dir, tmp_path, capsys):
    ref = tmp_path / "refs" / "nvidia-h200"
    ref.mkdir(parents=True)
    (ref / "fixture.json").write_text(json.dumps({"name": "fixture", "metrics": {"answer": 41},
                                                  "date": "2026-10-01", "profile": "full"}))
    code = run.main([str(fixture_dir / "10_ok.ipynb"), "20", "--notebooks-dir", str(fixture_dir),
                     "--out", str(tmp_path / "runs"), "--references", str(tmp_path / "refs"), "--jobs", "2"])
    out = capsys.readouterr().out
    assert code == 1
    line = next(ln for ln in out.splitlines() if ln.startswith("20_fails"))
    assert "FAILED" in line and "cell 3" in line and "RuntimeError: broken on purpose" in line
    assert next(ln for ln in out.splitlines() if ln.startswith("10_ok")).split()[1] == "ok"
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(s["notebook"], s["ok"], s["cell"]) for s in summary] == [("10_ok", True, None), ("20_fails", False, 3)]
    report = (run_dir / "report.md").read_text()
    assert "| answer | 42 | 41 |" in report  # this run beside the reference GPU
    assert "nvidia-h200" in report and "figures/10_ok-" in report
    html = (run_dir / "report.html").read_text()
    assert "data:image/png;base64," in html and "broken on purpose" in html
    assert json.loads((run_dir / "results" / "fixture.json").read_text())["profile"] in ("smoke", "full")


def test_runner_injects_parameters(fixture_dir, tmp_path):
    code = run.main(["10", "--notebooks-dir", str(fixture_dir), "--out", str(tmp_path / "runs"), "--no-report",
                     "--profile", "smoke", "-p", "EXTRA=[1, 2]"])
    assert code == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    nb = nbformat.read(run_dir / "notebooks" / "10_ok.ipynb", as_version=4)
    injected = next(c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", []))
    for text in ('PROFILE = "smoke"', "INTERACTIVE = False", "RESULTS_DIR = ", "EXTRA = [1, 2]"):
        assert text in injected.source
    assert not (run_dir / "report.md").exists()


def test_save_reference_copies_records(fixture_dir, tmp_path):
    from helpers.results import device_slug

    refs = tmp_path / "refs"
    code = run.main(["10", "--notebooks-dir", str(fixture_dir), "--out", str(tmp_path / "runs"), "--no-report",
                     "--references", str(refs), "--save-reference"])
    assert code == 0
    saved = json.loads((refs / device_slug() / "fixture.json").read_text())
    assert saved["metrics"] == {"answer": 42} and saved["versions"]["torch"]


def test_selection_errors_and_listing(fixture_dir, capsys):
    with pytest.raises(SystemExit, match="no notebook matches '99'"):
        run.find_notebooks(["99"], fixture_dir)
    assert run.main(["--list", "--notebooks-dir", str(fixture_dir)]) == 0
    assert "10_ok.ipynb" in capsys.readouterr().out
    assert [p.name for p in run.find_notebooks(["20_fails"], fixture_dir)] == ["20_fails.ipynb"]


def test_parse_parameter():
    assert run.parse_parameter("N=4") == ("N", 4)
    assert run.parse_parameter("DTYPE=bf16") == ("DTYPE", "bf16")
    assert run.parse_parameter("S=[1,2]") == ("S", [1, 2])
    with pytest.raises(Exception):
        run.parse_parameter("novalue")


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        run.main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for option in ("--profile", "--parameter", "--jobs", "--out", "--notebooks-dir", "--references",
                   "--timeout", "--no-report", "--save-reference", "--list"):
        assert option in text
