import base64
import errno
import json
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from helpers.course import executed_notebook, report, run
from helpers.measure.results import device_name

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
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
    monkeypatch.setattr(executed_notebook, "write_atomic", full)  # the figures
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
        "helpers.course.run: report not written: report.html: No space left on device"]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())[0]["status"] == "ok"


def _rec(folder, name, metrics, device="NVIDIA H200", profile="full"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(
        {"name": name, "metrics": metrics, "device": device, "profile": profile, "date": "2026-11-30T20:00:00"}))


CLAIM = {"id": "speed", "notebook": "03", "claim": "2x faster", "source": "a paper", "measured": "1.1x",
         "value": 1.1, "unit": "x", "verdict": "contradicted", "reason": ""}


def _course_run(tmp_path, monkeypatch):
    """A run folder as notebooks write it: claims and summaries through the helpers, one executed
    notebook with a figure under a section heading and one under "Play with it"."""
    from helpers.measure import claims, clock, results

    clock.reset()  # no timing of an earlier test makes these summaries look timed
    run_dir = tmp_path / "run"
    monkeypatch.setitem(results._state, "dir", run_dir / "results")
    monkeypatch.setitem(results._state, "profile", "smoke")
    claims.verdict("speed", notebook="03", claim="2x faster", source="a paper", measured="1.1x", value=1.1,
                   unit="x", claimed=(2.0, None), quiet=True)
    claims.verdict("gap", notebook="02", claim="a universal 1.7x gap", source="the second source text",
                   measured="ratio 0.9-1.1", verdict="not testable", reason="nothing is memory-bound here",
                   quiet=True)
    results.summary("02", "Measured MFU of training steps.", {"best MFU": (0.25, "%"), "ratio": (1.0, "x"),
                                                             "verdict": ("varies", "")}, noise="median IQR 6%")
    results.summary("05", "Measured accumulation.", {"tokens/s, b=1": (1000, "tokens/s", (950, 1040))})
    results.record("mfu_train_step", {"tflops": 0.5}, quiet=True)
    (run_dir / "notebooks").mkdir()
    cells = [nbformat.v4.new_markdown_cell("# 02 · FLOPs and MFU"), nbformat.v4.new_markdown_cell("## Measure it: MFU"),
             new_code_cell("PROFILE = 'smoke'", metadata={"tags": ["injected-parameters"]}),
             new_code_cell("plot()", outputs=[new_output("display_data", data={"image/png": REAL_PNG})]),
             nbformat.v4.new_markdown_cell("## Play with it"),
             new_code_cell("panel()", outputs=[new_output("display_data", data={"image/png": REAL_PNG})])]
    nbformat.write(new_notebook(cells=cells), run_dir / "notebooks" / "02_flops_mfu.ipynb")
    return run_dir


def _png_bytes() -> str:
    import matplotlib

    matplotlib.use("Agg")
    import io

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([1, 2, 3], [1, 4, 9])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


REAL_PNG = _png_bytes()


def test_ledger_lists_every_verdict_with_source_and_device_beside_the_reference(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "notebook_changed", lambda number: None)
    run_dir = _course_run(tmp_path, monkeypatch)
    _rec(run_dir / "results", "claim-half", {"id": "half"})
    _rec(run_dir / "results", "summary-09", {"notebook": "09", "headline": [1, 2]})
    (run_dir / "results" / "summary-02-copy.json").write_text(
        (run_dir / "results" / "summary-02.json").read_text())
    refs = tmp_path / "refs"
    _rec(refs / "nvidia-h200", "claim-speed", {**CLAIM, "measured": "1.9x", "value": 1.9, "verdict": "supported"})
    _rec(refs / "nvidia-h200", "claim-fp8", {**CLAIM, "id": "fp8", "notebook": "07", "claim": "FP8 2x",
                                            "measured": "1.6x", "verdict": "contradicted"})
    md, _ = report.write_report(run_dir, [run.Outcome("02_flops_mfu", True, 3.0)], refs, profile="smoke")
    text = md.read_text()
    ledger = text[text.index("## Claims ledger"):text.index("## Your device vs reference")]
    here = device_name()
    assert (f"| 02 | a universal 1.7x gap | the second source text | ratio 0.9-1.1 | not testable (nothing is "
            f"memory-bound here) | {here} | not recorded there |") in ledger
    assert f"| 03 | 2x faster | a paper | 1.1x | contradicted (the whole measured range 1.1x lies below the claimed " \
           f"at least 2x) | {here} | supported; measured 1.9x |" in ledger
    assert "| 07 | FP8 2x | a paper | not run here |  |  | contradicted; measured 1.6x |" in ledger  # only the reference tested it
    assert text.index("## Claims ledger") < text.index("## Notebooks")  # at the top
    assert "claim-half.json | a claim record without id" in text and "### claim-speed" not in text
    assert "summary-09.json | a summary record without notebook" in text
    assert "summary-02-copy.json | a second summary of notebook 02; the report shows summary-02 |" in text


def test_a_reference_judged_by_an_older_rule_is_judged_again_and_flagged_when_older_than_its_notebook(
        tmp_path, monkeypatch):
    monkeypatch.setattr(report, "notebook_changed", lambda number: "2026-12-01T00:00:00+00:00")
    run_dir = _course_run(tmp_path, monkeypatch)
    refs = tmp_path / "refs"
    _rec(refs / "nvidia-h200", "claim-speed", {**CLAIM, "measured": "4.60x", "value": 4.6, "verdict": "contradicted"})
    text = report.write_report(run_dir, [], refs, profile="smoke")[0].read_text()
    assert ("supported; measured 4.60x; re-judged by today's rule (recorded as contradicted); recorded 2026-11-30, "
            "before notebook 03 last changed (2026-12-01)") in text
    _rec(refs / "nvidia-h200", "summary-02", {"notebook": "02", "sentence": "x", "headline": {"ratio": {"value": 1.0}}})
    text = report.write_report(run_dir, [], refs, profile="smoke")[0].read_text()
    assert "before the notebook last changed, so its numbers may come from code that is gone: 02 on nvidia-h200 " \
           "(recorded 2026-11-30, notebook changed 2026-12-01)." in text


def test_the_report_says_how_much_of_the_wall_time_each_notebooks_thread_ran(tmp_path, monkeypatch):
    from helpers.measure import clock, results

    run_dir = _course_run(tmp_path, monkeypatch)
    clock.reset()
    clock.add(0.46, 1.0)
    results.summary("01", "Measured the roofline.", {"gemv GB/s": (12.0, "GB/s")})
    clock.reset()
    text = report.write_report(run_dir, [], tmp_path / "refs", profile="smoke")[0].read_text()
    assert "Share of the wall time each notebook's timed thread ran" in text and ": 01 46%." in text
    assert "Clock: timed on the thread's CPU clock with torch on one thread; it ran 46% of the wall time: the " \
           "machine was shared" in text


def test_headline_numbers_matched_to_references_by_record_name(tmp_path, monkeypatch):
    run_dir = _course_run(tmp_path, monkeypatch)
    refs = tmp_path / "refs"
    _rec(refs / "nvidia-h200", "summary-02", {"notebook": "02", "sentence": "x", "noise": None, "headline": {
        "best MFU": {"value": 50, "unit": "%"}, "ratio": {"value": 2.0, "unit": ""}}})
    (refs / "nvidia-h200" / "capture.json").write_text(json.dumps({"device": "NVIDIA H200", "notebooks": {}}))
    (refs / "nvidia-h200" / "goals.json").write_text(json.dumps({"goals": []}))
    (refs / "nvidia-h200" / "gpu-smoke.json").write_text(json.dumps({"started": "2026-12-02T01:00:00+00:00", "notebooks": {
        "02": {"status": "failed", "seconds": 9.0, "cell": 4, "error": "RuntimeError: no kernel\nmore"}}}))
    md, html = report.write_report(run_dir, [run.Outcome("02_flops_mfu", True, 3.0)], refs, profile="smoke",
                                   conditions="1 notebook at a time, 1 thread")
    text = md.read_text()
    assert "capture.json" not in text  # the capture's index beside the references is no record, and no problem
    assert "goals.json" not in text and "gpu-smoke.json" not in text  # nor are the goals and the smoke pass
    versus = text[text.index("## Your device vs reference"):text.index("## Notebooks")]
    assert "| 02 | best MFU | 0.25 % | 50 % | 0.005x |" in versus          # matched by name and label, ratio
    assert "| 02 | ratio | 1 x | 2 | - |" in versus                     # units differ: no ratio
    assert "| 02 | verdict | varies | not in the reference | - |" in versus
    assert "| 05 | tokens/s, b=1 | 1000 tokens/s (IQR 950-1040) | no reference | - |" in versus
    assert "Missing on the reference: summary-05 on nvidia-h200" in versus and "scripts/gpu_capture.sh" in versus
    assert "Run conditions: 1 notebook at a time, 1 thread." in text and "02: median IQR 6%" in text
    # the notebook's section: title, sentence, status, headline numbers, its measured figure with its caption
    section = text[text.index("## 02 · FLOPs and MFU"):]
    assert "Measured MFU of training steps. Status: ok in 3.0 s." in section and "| best MFU | 0.25 % |" in section
    assert ("On the reference GPUs: Smoke pass on nvidia-h200 (2026-12-02): failed at cell 4: RuntimeError: no "
            "kernel.") in section
    assert "*Figure: 02_flops_mfu: Measure it: MFU (code cell 1)*" in section and "Play with it" not in section
    assert "figures/02_flops_mfu-code-cell01-0.png" in section  # the file is named by the caption's cell number
    assert "## 05" in text and "Measured accumulation." in text  # a summary without an executed notebook
    # raw records collapsed in the appendix, summaries and claims not repeated there
    appendix = text[text.index("<details><summary>Appendix: raw metrics"):text.index("</details>")]
    assert "### mfu_train_step" in appendix and "### summary-02" not in appendix
    assert html.read_text().count("<figure>") == 1


def test_no_reference_is_said_in_one_sentence_with_how_to_make_one(tmp_path, monkeypatch):
    run_dir = _course_run(tmp_path, monkeypatch)
    text = report.write_report(run_dir, [], tmp_path / "no-refs")[0].read_text()
    versus = text[text.index("## Your device vs reference"):text.index("## Notebooks")]
    assert "There is no reference GPU run in results/<gpu>/ yet" in versus and "scripts/gpu_capture.sh" in versus
    assert "| 02 | best MFU | 0.25 % |" in versus
    assert "| 05 | tokens/s, b=1 | 1000 tokens/s (IQR 950-1040) |" in versus  # a headline shows its spread
    assert "No reference GPU in results/<gpu>/ has recorded a verdict yet." in text


@pytest.mark.parametrize("args, match", [
    (("2", "s", {"a": (1, "x")}), "two-digit"),
    (("02", " ", {"a": (1, "x")}), "sentence"),
    (("02", "s", {}), "1 to 6"),
    (("02", "s", {"a": 1}), r"\(value, unit\)"),
    (("02", "s", {"a": (float("nan"), "x")}), "finite"),
    (("02", "s", {"a": (None, "x")}), "finite"),
    (("02", "s", {"a": (1, None)}), "unit"),
    (("02", "s", {"a": (1, "x", (2, 3))}), "lo <= value <= hi"),
    (("02", "s", {"a": (1, "x", (0, float("inf")))}), "spread"),
    (("02", "s", {"a": ("fast", "", (0, 1))}), "numeric value"),
])
def test_summary_refuses_what_the_report_cannot_show(args, match, tmp_path, monkeypatch):
    from helpers.measure import results

    monkeypatch.setitem(results._state, "dir", tmp_path)
    with pytest.raises(ValueError, match=match):
        results.summary(*args)
    assert not list(tmp_path.iterdir())


SUMMARISED = ["00", "01", "02", "03", "04", "05", "06", "07"]


@pytest.mark.parametrize("number", SUMMARISED)
def test_notebook_records_its_summary_in_its_takeaways(number):
    import re

    (path,) = (Path(__file__).resolve().parents[2] / "notebooks").glob(f"{number}_*.ipynb")
    cells = nbformat.read(path, as_version=4).cells
    takeaways = next(i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("## Takeaways"))
    calls = [re.findall(r'(?<!check\.)\b(?:record_)?summary\("(\d\d)"', c.source) for c in cells[takeaways:] if c.cell_type == "code"]
    assert [n for found in calls for n in found] == [number], f"{path.name}: one results.summary call after '## Takeaways'"


def test_notebook_02_records_its_verdict_on_the_gap():
    (path,) = (Path(__file__).resolve().parents[2] / "notebooks").glob("02_*.ipynb")
    code = "".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    assert 'claims.verdict("attention-mlp-gap", notebook="02"' in code
