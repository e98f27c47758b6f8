"""helpers.course.site and site_pages without Sphinx: the pages written from a small fixture run (every notebook
listed, the executed one with the reference beside it, the other said not executed right under its title), the
ledger cut from the report, the errors for a folder that is not a run, and a configuration that fetches nothing.
The build itself, in a browser, is tests/browser/test_site.py."""
from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from helpers.course import site, site_pages

# the smallest valid PNG (1x1), so the executed fixture notebook has a figure without matplotlib
PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d49444154789c6360000002"
    "0000050001e226059b0000000049454e44ae426082")).decode()


def _record(folder: Path, name: str, metrics: dict, device: str, profile: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"name": name, "metrics": metrics, "device": device,
                                                     "profile": profile, "versions": {"torch": "2.13.0"},
                                                     "date": "2026-12-01T10:00:00+00:00"}))


@pytest.fixture
def fixture_run(tmp_path):
    """(run folder, committed notebooks folder, references folder): notebook 00 executed with a figure, a claim
    and a summary; notebook 01 committed only; a reference GPU with notebook 00's summary."""
    sources, run_dir, refs = tmp_path / "notebooks", tmp_path / "runs" / "20261201-100000-cpu", tmp_path / "refs"
    sources.mkdir()
    for stem, title in (("00_alpha", "00 · Alpha"), ("01_beta", "01 · Beta")):
        cells = [new_markdown_cell(f"# {title}\n\nWhat {stem} measures."), new_code_cell("x = 1")]
        nbformat.write(new_notebook(cells=cells), sources / f"{stem}.ipynb")
    executed = nbformat.read(sources / "00_alpha.ipynb", as_version=4)
    executed.cells[1].outputs = [new_output("display_data", data={"image/png": PNG})]
    (run_dir / "notebooks").mkdir(parents=True)
    nbformat.write(executed, run_dir / "notebooks" / "00_alpha.ipynb")
    (run_dir / "summary.json").write_text(json.dumps([{"notebook": "00_alpha", "ok": True, "seconds": 12.0}]))
    res = run_dir / "results"
    _record(res, "claim-speed", {"id": "speed", "notebook": "00", "claim": "the alpha claim", "source": "a paper",
                                 "measured": "1.1x", "verdict": "not testable", "reason": "no GPU here"},
            "CPU: fixture", "smoke")
    _record(res, "summary-00", {"notebook": "00", "sentence": "Alpha.", "headline": {
        "copy bandwidth": {"value": 30.0, "unit": "GB/s"}}}, "CPU: fixture", "smoke")
    _record(refs / "nvidia-h200", "summary-00", {"notebook": "00", "sentence": "Alpha.", "headline": {
        "copy bandwidth": {"value": 4000.0, "unit": "GB/s"}}}, "NVIDIA H200", "full")
    return run_dir, sources, refs


def _page(src: Path, stem: str):
    return nbformat.read(src / "notebooks" / f"{stem}.ipynb", as_version=4)


def test_every_notebook_gets_a_page_and_the_index_lists_them_all(fixture_run, tmp_path):
    run_dir, sources, refs = fixture_run
    lines = []
    pages = site_pages.write_sources(run_dir, tmp_path / "src", refs, sources, say=lines.append)
    assert [p.doc for p in pages] == ["notebooks/00_alpha", "notebooks/01_beta", "ledger", "device"]
    assert [p.executed for p in pages[:2]] == [True, False]
    assert pages[0].title == "00 · Alpha" and pages[0].line == "executed: ok in 12 s"
    assert len(lines) == 4 and all(line.startswith("  page ") for line in lines)
    index = (tmp_path / "src" / "index.md").read_text()
    assert index.startswith(f"# {site_pages.COURSE_TITLE}")
    assert "device CPU: fixture, profile smoke" in index and run_dir.name in index and "1 of 2 notebooks" in index
    for p in pages:
        assert f"]({p.doc}." in index and f"\n{p.doc}\n" in index   # a line on the index and in the toctree


def test_the_executed_page_keeps_its_outputs_and_shows_the_reference_beside_them(fixture_run, tmp_path):
    run_dir, sources, refs = fixture_run
    site_pages.write_sources(run_dir, tmp_path / "src", refs, sources, say=lambda line: None)
    nb = _page(tmp_path / "src", "00_alpha")
    assert nb.cells[0].source.startswith("# 00 · Alpha")
    top = nb.cells[1].source
    assert "Beside the reference GPU" in top and "nvidia-h200" in top and "4000 GB/s" in top and "0.0075x" in top
    assert site_pages.NOT_EXECUTED not in "".join(c.source for c in nb.cells)
    assert nb.cells[2].outputs[0]["data"]["image/png"] == PNG


def test_a_page_the_run_did_not_execute_says_so_right_under_its_title(fixture_run, tmp_path):
    run_dir, sources, refs = fixture_run
    site_pages.write_sources(run_dir, tmp_path / "src", refs, sources, say=lambda line: None)
    nb = _page(tmp_path / "src", "01_beta")
    assert nb.cells[0].source == "# 01 · Beta"
    assert nb.cells[1].source.startswith(f"**{site_pages.NOT_EXECUTED}:**")
    assert "No reference GPU in results/ has recorded" in nb.cells[3].source
    assert all(not c.get("outputs") for c in nb.cells)
    nbformat.validate(nb)


def test_the_ledger_page_is_the_reports_ledger_with_its_verdicts(fixture_run, tmp_path):
    run_dir, sources, refs = fixture_run
    site_pages.write_sources(run_dir, tmp_path / "src", refs, sources, say=lambda line: None)
    ledger = (tmp_path / "src" / "ledger.md").read_text()
    assert ledger.startswith("# Claims ledger") and "```{raw} html" in ledger
    assert "the alpha claim" in ledger and "<td class='na'>not testable (no GPU here)</td>" in ledger
    device = (tmp_path / "src" / "device.md").read_text()
    assert "30 GB/s" in device and "4000 GB/s" in device


def test_a_missing_run_folder_or_one_that_is_not_a_run_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(site.SiteError, match="no run folder"):
        site.check_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(site.SiteError, match="not a run folder"):
        site.check_run(tmp_path / "empty")
    assert site.main(["--run", str(tmp_path / "nope"), "--out", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("helpers.course.site: no run folder") and err.count("\n") == 1
    with pytest.raises(site.SiteError, match="no run folder under"):
        site.latest_run(tmp_path)
    assert not (tmp_path / "site").exists()


def test_the_newest_run_folder_is_found_by_its_name(tmp_path):
    for name in ("20261201-100000-cpu", "20261202-090000-cpu", "interactive-cpu"):
        (tmp_path / name / "notebooks").mkdir(parents=True)
    assert site.latest_run(tmp_path).name == "20261202-090000-cpu"


def test_the_configuration_fetches_nothing(tmp_path):
    site.write_conf(tmp_path)
    conf = (tmp_path / "conf.py").read_text()
    css = (tmp_path / "_static" / "site.css").read_text()
    assert not re.search(r"https?://|//cdn|unpkg|jsdelivr", conf + css)
    scope: dict = {}
    exec(compile(conf, "conf.py", "exec"), scope)
    assert scope["nb_execution_mode"] == "off" and scope["html_theme"] == "alabaster"
    assert scope["nb_ipywidgets_js"] == {} and scope["html_math_renderer"] == "text"
    assert scope["html_theme_options"]["show_powered_by"] is False and scope["html_show_sphinx"] is False
    assert "td.ok{" in css and "td.bad{" in css   # the report's verdict colours
