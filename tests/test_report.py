import base64
import errno
import json
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from helpers import report, run

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()


def _run_dir(tmp_path):
    """A run folder holding every kind of bad file, beside one good record and one good figure."""
    run_dir = tmp_path / "20261130-120000-cpu"
    shutil.copytree(FIXTURES / "bad_results", run_dir / "results")
    (run_dir / "results" / "good.json").write_text(json.dumps(
        {"name": "good", "metrics": {"tflops": 1.5}, "device": "CPU: fixture", "profile": "smoke", "date": None}))
    (run_dir / "notebooks").mkdir()
    shutil.copy(FIXTURES / "bad_notebooks" / "torn.ipynb", run_dir / "notebooks" / "20_torn.ipynb")
    cell = new_code_cell("plot()", outputs=[new_output("display_data", data={"image/png": PNG}),
                                            new_output("display_data", data={"image/png": "bm90IGEgcG5n"})])
    nbformat.write(new_notebook(cells=[cell]), run_dir / "notebooks" / "10_plots.ipynb")
    return run_dir


OUTCOMES = [run.Outcome("10_plots", True, 1.0), run.Outcome("20_torn", False, 2.0, 4, "ValueError: bad")]


def test_report_builds_from_what_is_readable_and_names_the_rest(tmp_path):
    run_dir = _run_dir(tmp_path)
    md, html = report.write_report(run_dir, OUTCOMES, FIXTURES / "bad_reference", profile="smoke",
                                   conditions="1 notebook at a time")
    text = md.read_text()
    unreadable = text[text.index("## Files the report could not read"):]
    for name, reason in [("results/torn.json", "torn or invalid JSON"), ("results/empty.json", "empty file"),
                         ("results/list.json", "JSON list"), ("results/none_metrics.json", "'metrics' is NoneType"),
                         ("nvidia-h200/torn.json", "torn or invalid JSON"),
                         ("notebooks/20_torn.ipynb", "unreadable executed notebook"),
                         ("notebooks/10_plots.ipynb", "not a PNG image")]:
        line = next((ln for ln in unreadable.splitlines() if name in ln), "")
        assert reason in line, (name, unreadable)
    # both records named "twin" are shown, each with its own device, profile and versions
    assert "### twin\n" in text and "### twin [twin-copy.json]" in text
    assert "CPU: fixture, profile smoke, torch 2.4.0" in text and "NVIDIA H200, profile full, torch 2.6.0" in text
    assert "Not this run's device and profile" in text
    assert "NVIDIA H200, profile full, torch ?, ?" in text  # the reference dated null
    assert "| good |" not in text and "| tflops | 1.5 |" in text
    assert "Run conditions: 1 notebook at a time." in text and "20_torn | FAILED | 2.0 | cell 4: ValueError: bad" in text
    assert len(list((run_dir / "figures").glob("*.png"))) == 1 and "data:image/png;base64," in html.read_text()


def test_a_full_disk_keeps_what_was_written_and_names_the_file(tmp_path, monkeypatch):
    run_dir = _run_dir(tmp_path)
    report.write_report(run_dir, OUTCOMES, tmp_path / "none")
    before = (run_dir / "report.html").read_bytes()
    real = report.write_atomic

    def full(path, data, **kw):
        if Path(path).suffix in (".html", ".png"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data, **kw)

    monkeypatch.setattr(report, "write_atomic", full)
    with pytest.raises(OSError) as err:
        report.write_report(run_dir, OUTCOMES, tmp_path / "none")
    assert err.value.filename.endswith("report.html")
    assert (run_dir / "report.html").read_bytes() == before  # the old page, whole
    assert "No space left on device" in (run_dir / "report.md").read_text()  # the figure that failed is named
    assert not [p for p in run_dir.rglob("*.tmp")]


def test_runner_says_in_one_line_that_the_report_was_not_written(tmp_path, monkeypatch, capsys):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    nbformat.write(new_notebook(cells=[]), nbs / "10_x.ipynb")
    monkeypatch.setattr(run, "_run_all", lambda *a, **k: [run.Outcome("10_x", True, 1.0)])

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", "report.html")

    monkeypatch.setattr(report, "write_report", full)
    assert run.main(["--notebooks-dir", str(nbs), "--out", str(tmp_path / "runs")]) == 1
    out = capsys.readouterr().out
    assert [ln for ln in out.splitlines() if "report" in ln] == [
        "helpers.run: report not written: report.html: No space left on device"]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())[0]["status"] == "ok"


def test_claims_ledger_beside_reference_verdicts(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "results").mkdir(parents=True)
    refs = tmp_path / "refs" / "nvidia-h200"
    refs.mkdir(parents=True)
    claim = {"id": "speed", "notebook": "03", "claim": "2x faster", "source": "a paper", "measured": "1.1x",
             "value": 1.1, "unit": "x", "verdict": "contradicted", "reason": ""}
    (run_dir / "results" / "claim-speed.json").write_text(json.dumps({"name": "claim-speed", "metrics": claim}))
    (run_dir / "results" / "claim-half.json").write_text(json.dumps({"name": "claim-half", "metrics": {"id": "half"}}))
    (refs / "claim-speed.json").write_text(json.dumps(
        {"name": "claim-speed", "metrics": {**claim, "measured": "1.9x", "verdict": "supported"}}))
    md, _ = report.write_report(run_dir, [], tmp_path / "refs")
    text = md.read_text()
    assert "## Claims ledger" in text
    assert "| 03 | 2x faster | a paper | 1.1x | contradicted | supported; measured 1.9x |" in text
    assert "claim-half.json | a claim record without id" in text and "### claim-speed" not in text
