"""The course's website (helpers.course.site) in a real browser: built from a small real run (notebook 00 executed in
smoke by the course's runner, the other fourteen pages from their committed sources), opened from disk in headless
Chromium with every request outside the site refused.

Checked: every notebook page opens (15) with no console error, every image on the executed page has loaded, a page
the run did not execute says so, the ledger lists every claim the run recorded with its verdict, the device page
shows this run beside the reference, and no page links outside the site except to cited sources: the http(s) links
written in the notebooks' own markdown cells (papers, documentation). Anything else (a CDN, a theme's link to its
project, "Edit on GitHub") fails. One screenshot goes to runs/browser/site/ (git-ignored).
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import nbformat
import pytest

from helpers.course import site, site_pages
from helpers.measure import claims
from helpers.measure.results import read_records, records_by_name

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SHOTS = ROOT / "runs" / "browser" / "site"   # git-ignored
EXECUTED = "00"                               # the one notebook the small run executes (smoke: ~30 s on 2 cores)

pytestmark = [pytest.mark.browser]


def cited_sources() -> set[str]:
    """The http(s) addresses written in the committed notebooks' markdown cells: the only links allowed off the site."""
    urls = set()
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                urls |= {u.rstrip(".,;:") for u in re.findall(r"https?://[^\s)\]>\"']+", cell.source)}
    return urls


@pytest.fixture(scope="module")
def small_site(browser_requirements, tmp_path_factory):
    """(run folder, site's html folder) of one notebook executed in smoke and the site built from it."""
    tmp = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "helpers.course.run", EXECUTED, "--profile", "smoke", "--out",
                           str(tmp / "runs"), "--no-report"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = site.latest_run(tmp / "runs")
    index = site.build(run_dir, tmp / "site", say=lambda line: None)
    return run_dir, index.parent


def _open(context, url: str):
    """A page at `url` with every request off the site refused and recorded, and its console errors collected."""
    page = context.new_page()
    errors, outside = [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    def route(r):
        if r.request.url.startswith(("file:", "data:")):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(url)
    page.wait_for_load_state("load")
    return page, errors, outside


def _links_ok(page, html_dir: Path, cited: set[str]) -> list[str]:
    """The page's links that leave the site and are not cited sources, and the site links that lead nowhere."""
    bad = []
    for href in page.eval_on_selector_all("a[href]", "as => as.map(a => a.href)"):
        parsed = urlparse(href)
        if parsed.scheme in ("http", "https"):
            if href.split("#")[0] not in cited:
                bad.append(href)
        elif parsed.scheme == "file":
            target = Path(unquote(parsed.path))
            if not (target.resolve().is_relative_to(html_dir.resolve()) and target.exists()):
                bad.append(href)
        elif parsed.scheme not in ("", "javascript", "mailto"):
            bad.append(href)
    return bad


def test_the_site_opens_every_page_offline_with_figures_ledger_and_device(browser, small_site):
    run_dir, html = small_site
    cited = cited_sources()
    index, errors, outside = _open(browser, (html / "index.html").as_uri())
    try:
        hrefs = index.eval_on_selector_all("div.body a[href*='notebooks/']", "as => as.map(a => a.href)")
        assert len(dict.fromkeys(hrefs)) == len(NOTEBOOKS) == 15, hrefs
        assert "profile smoke" in index.inner_text("div.body") and run_dir.name in index.inner_text("div.body")
        assert not errors and not outside and not _links_ok(index, html, cited)
    finally:
        index.close()
    for href in dict.fromkeys(hrefs):
        page, errors, outside = _open(browser, href)
        try:
            text = page.inner_text("div.body")
            assert page.locator("div.body h1").count() == 1, href
            assert not errors, (href, errors)
            assert not outside, (href, outside)
            assert not _links_ok(page, html, cited), (href, _links_ok(page, html, cited))
            if f"/notebooks/{EXECUTED}_" in href:
                widths = page.eval_on_selector_all("div.body img", "is => is.map(i => i.complete ? i.naturalWidth : 0)")
                assert widths and all(w > 0 for w in widths), (href, widths)
                assert site_pages.NOT_EXECUTED not in text and "Beside the reference GPU" in text
                SHOTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SHOTS / "notebook.png"))
            else:
                assert f"{site_pages.NOT_EXECUTED}:" in text, href
        finally:
            page.close()

    recorded = claims.from_records(records_by_name(read_records(run_dir / "results")[0]))
    assert recorded, "the small run recorded no claim"
    ledger, errors, outside = _open(browser, (html / "ledger.html").as_uri())
    try:
        rows = ledger.locator("div.body table tr").all_inner_texts()
        for row in recorded:
            assert any(row["claim"] in r and claims.shown(row) in r for r in rows), (row["id"], rows)
        assert ledger.locator("td.ok, td.bad, td.na").count() >= len(recorded)   # verdicts coloured as in the report
        assert not errors and not outside and not _links_ok(ledger, html, cited)
    finally:
        ledger.close()
    device, errors, outside = _open(browser, (html / "device.html").as_uri())
    try:
        assert device.locator("div.body h1").inner_text().startswith("Your device against the reference")
        assert "this run" in device.locator("div.body table").first.inner_text()
        assert not errors and not outside and not _links_ok(device, html, cited)
    finally:
        device.close()
