"""report.html looks right in a real browser: built from small fixture records (no notebook runs),
opened from disk in headless Chromium with the network cut, it shows the claims ledger at the top,
a notebook section with its headline numbers, and figures that decode (natural width > 0).

A screenshot of the whole page goes to runs/browser/report/report.png (git-ignored) for a person to look at.
"""
from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from helpers.course import report, run

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "runs" / "browser" / "report"   # git-ignored

pytestmark = [pytest.mark.browser]


def _png() -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([64, 128, 256], [0.05, 0.09, 0.11], marker="o")
    ax.set(xlabel="n", ylabel="TFLOP/s", title="fixture sweep")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _record(folder: Path, name: str, metrics: dict, device: str, profile: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"name": name, "metrics": metrics, "device": device,
                                                     "profile": profile, "versions": {"torch": "2.9.0"},
                                                     "date": "2026-11-30T20:00:00+00:00"}))


def _claim(cid, nb, verdict, measured, reason=""):
    return {"id": cid, "notebook": nb, "claim": f"claim {cid}", "source": "the first source text, section 2.4",
            "measured": measured, "value": 1.0, "unit": "x", "verdict": verdict, "reason": reason}


@pytest.fixture
def report_page(tmp_path):
    """A run folder with two claims, two summaries, one raw record and an executed notebook with a
    figure, a reference GPU folder beside it; returns the path of the report.html written from them."""
    run_dir, refs = tmp_path / "20261130-210000-cpu", tmp_path / "refs"
    res = run_dir / "results"
    _record(res, "claim-speed", _claim("speed", "03", "not testable", "step x0.9", "a CPU has no tensor cores"),
            "CPU: fixture", "smoke")
    _record(res, "claim-gap", _claim("gap", "02", "contradicted", "ratio 0.9-1.2"), "CPU: fixture", "smoke")
    _record(res, "summary-02", {"notebook": "02", "sentence": "Timed training steps for their MFU.", "noise": "IQR 6%",
                                "headline": {"best MFU vs measured ceiling": {"value": 41.5, "unit": "%"},
                                             "best training step throughput": {"value": 0.08, "unit": "TFLOP/s"}}},
            "CPU: fixture", "smoke")
    _record(res, "mfu_train_step", {"tflops": 0.08, "steps": [1, 2, 3]}, "CPU: fixture", "smoke")
    _record(refs / "nvidia-h200", "claim-speed", _claim("speed", "03", "supported", "step x1.8"), "NVIDIA H200", "full")
    _record(refs / "nvidia-h200", "summary-02", {"notebook": "02", "sentence": "x", "noise": None, "headline": {
        "best training step throughput": {"value": 310.0, "unit": "TFLOP/s"}}}, "NVIDIA H200", "full")
    (run_dir / "notebooks").mkdir(parents=True)
    cells = [new_markdown_cell("# 02 · FLOPs and MFU"), new_markdown_cell("## Measure it: MFU of real training steps"),
             new_code_cell("plot()", outputs=[new_output("display_data", data={"image/png": _png()})])]
    nbformat.write(new_notebook(cells=cells), run_dir / "notebooks" / "02_flops_mfu.ipynb")
    _, page = report.write_report(run_dir, [run.Outcome("02_flops_mfu", True, 12.3)], refs, profile="smoke",
                                  conditions="one notebook at a time, 1 torch thread")
    return page


def test_report_renders_ledger_sections_and_figures(browser_requirements, browser, report_page):
    page = browser.new_page()
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    try:
        page.goto(report_page.as_uri())
        page.wait_for_load_state("load")
        headings = page.locator("h2").all_inner_texts()
        assert headings[:4] == ["The course in one picture", "Measurement conditions", "Claims ledger",
                                "Your device vs reference"], headings
        ledger = page.locator("h2:has-text('Claims ledger') ~ div.scroll table").first
        rows = ledger.locator("tr").all_inner_texts()
        assert any("claim gap" in r and "contradicted" in r and "CPU: fixture" in r for r in rows), rows
        assert any("claim speed" in r and "the first source text" in r and "not testable (a CPU has no tensor cores)" in r
                   and "supported; measured step x1.8" in r for r in rows), rows
        verdict_cells = page.locator("td.ok, td.bad, td.na").count()
        assert verdict_cells >= 3  # coloured by verdict
        versus = page.locator("h2:has-text('Your device vs reference') + p + div.scroll table, "
                              "h2:has-text('Your device vs reference') ~ div.scroll table").first.inner_text()
        assert "310 TFLOP/s" in versus and "0.000258x" in versus
        section = page.locator("h2:has-text('02 · FLOPs and MFU')")
        assert section.count() == 1
        assert "Timed training steps for their MFU." in page.locator("h2:has-text('02 · FLOPs and MFU') + p").inner_text()
        assert "41.5 %" in page.locator("h2:has-text('02 · FLOPs and MFU') ~ div.scroll table").first.inner_text()
        widths = page.eval_on_selector_all("figure img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
        assert widths and all(w > 0 for w in widths), widths
        assert "Measure it: MFU of real training steps" in page.locator("figcaption").first.inner_text()
        appendix = page.locator("details")
        assert appendix.count() == 1 and not appendix.first.evaluate("d => d.open")  # collapsed
        assert not page.locator("details table").first.is_visible()
        appendix.locator("summary").click()
        assert page.locator("details table").first.is_visible()
        assert all(u.startswith(("file:", "data:")) for u in requests), requests  # self-contained
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "report.png"), full_page=True)
    finally:
        page.close()
