"""The instructor panels work in a real JupyterLab, driven like a user drives them.

For every notebook that builds a panel (a code cell calls `widgets.panel(`): open it in JupyterLab
in headless Chromium, Run → Run All Cells with the mouse (smoke profile on a CPU, INTERACTIVE=True),
wait for the kernel to go idle and the `.course-panel` widget to draw, then, one control at a time,
move each slider with the arrow keys, pick another option in each <select> and click each checkbox, and check that the
panel redrew for the new value:
  - its output changed and settled (kernel idle), with no traceback, and a new figure;
  - if its printed line named the control's old value (`n=512`, `fp32`), it names the new one the
    same way (`n=256`, `fp16`). Measured numbers differ on every redraw, so "the output changed"
    alone would pass even for a callback that ignores the control.
Screenshots of each panel before and after go to runs/browser/<test>/ (git-ignored).
The Run All also stands in for the notebook's papermill smoke run (tests/course/test_course_notebooks.py skips
that one when this suite can run): no traceback anywhere in the notebook, and records written.
"""
from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
from notebook_support import keep_quiet

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = ROOT / "notebooks"
RUNS_DIR = ROOT / "runs" / "browser"   # git-ignored

pytestmark = [pytest.mark.browser, pytest.mark.notebook]

RUN_ALL_S = 420        # one notebook, smoke profile, all cells, on 2 busy cores
KERNEL_START_S = 120
REDRAW_S = 120         # one panel callback re-measures (smoke sizes) and redraws
SETTLE_S = 1.5         # the output must stay the same this long to count as redrawn
NO_FIGURE_S = 10       # ... and this long if it has fewer figures than before


def panel_count(path: Path) -> int:
    """How many panels the notebook's code cells build."""
    nb = json.loads(path.read_text())
    return sum("".join(c["source"]).count("widgets.panel(") for c in nb["cells"] if c["cell_type"] == "code")


PANEL_NOTEBOOKS = [p for p in sorted(NOTEBOOKS_DIR.glob("*.ipynb")) if panel_count(p)]


def test_the_roofline_notebook_is_among_those_with_panels():
    assert "01_roofline" in [p.stem for p in PANEL_NOTEBOOKS]


# -- the page --------------------------------------------------------------------------------------
NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden)"

SNAPSHOT_JS = """(panel) => {
  const out = panel.querySelector('.widget-output');
  if (!out) return {text: '', images: [], errors: []};
  const stderr = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]';
  return {text: out.innerText.trim(),
          images: Array.from(out.querySelectorAll('img')).map(img => img.getAttribute('src') || ''),
          errors: Array.from(out.querySelectorAll(stderr)).map(e => e.textContent)
                       .filter(t => /Traceback|Error\\b|Exception/.test(t))};
}"""

CELLS_JS = """(nb) => Array.from(nb.querySelectorAll('.jp-CodeCell')).map(cell => {
  const prompt = cell.querySelector('.jp-InputArea-prompt');
  return prompt ? prompt.textContent.trim() : '';   // textContent: off-screen cells are not rendered
})"""

ERRORS_JS = """(nb) => Array.from(nb.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'))
  .map(o => o.textContent).filter(t => /Traceback|Error/.test(t)).map(t => t.slice(-1500))"""

# Only real exceptions (a warning on stderr that mentions an error is not one).
TRACEBACKS_JS = ERRORS_JS.replace("/Traceback|Error/", "/Traceback \\(most recent call last\\)/")


def kernel_status(page) -> str:
    """'idle', 'busy', 'starting', ... as the status bar says it: "Python 3 (ipykernel) | Idle"."""
    text = "\n".join(page.locator(".jp-StatusBar-Widget").all_inner_texts())
    found = re.search(r"\|\s*([A-Za-z][A-Za-z ]*?)\s*(?:$|\n|Mode:)", text)
    return found.group(1).lower() if found else "unknown"


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def open_notebook(page, lab, name: str) -> None:
    # A workspace of its own, so JupyterLab does not restore the tabs of the previous test.
    workspace = re.sub(r"\W", "-", Path(name).stem)
    page.goto(lab.url(f"lab/workspaces/{workspace}/tree/{name}"), wait_until="domcontentloaded")
    page.locator(f"{NOTEBOOK} .jp-Notebook .jp-Cell").first.wait_for(state="visible", timeout=KERNEL_START_S * 1000)
    wait_for(lambda: kernel_status(page) == "idle", KERNEL_START_S, f"the kernel of {name} to start")


def run_all_cells(page) -> None:
    """Run → Run All Cells, with the mouse, as an instructor would."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-item:visible", has_text=re.compile(r"^Run All Cells")).first.click()


def wait_until_executed(page, name: str) -> None:
    notebook = page.locator(f"{NOTEBOOK} .jp-Notebook").first
    # Every code cell is queued at once ([*]); done when none is queued and the kernel is idle.
    wait_for(lambda: any(re.search(r"\[[\d*]+\]", p) for p in notebook.evaluate(CELLS_JS)), 60,
             "Run All Cells to start executing")
    stable_since = None

    def finished() -> bool:
        nonlocal stable_since
        busy = any("*" in p for p in notebook.evaluate(CELLS_JS)) or kernel_status(page) != "idle"
        stable_since = None if busy else (stable_since or time.monotonic())
        return stable_since is not None and time.monotonic() - stable_since > 2

    wait_for(finished, RUN_ALL_S, f"all cells of {name} to run")
    prompts = notebook.evaluate(CELLS_JS)
    unrun = [i for i, p in enumerate(prompts) if not re.search(r"\[\d+\]", p)]
    assert not unrun, (f"{name}: code cells {unrun} did not run (prompts {prompts}); errors shown:\n"
                       + "\n---\n".join(notebook.evaluate(ERRORS_JS)))


# -- one panel ------------------------------------------------------------------------------------
def snapshot(panel) -> dict:
    return panel.evaluate(SNAPSHOT_JS)


def wait_for_redraw(page, panel, before: dict, what: str) -> dict:
    """The panel's output once it differs from `before` and has settled (kernel idle, unchanged)."""
    state = {"last": None, "since": 0.0}

    def settled():
        now = snapshot(panel)
        if now != state["last"]:
            state["last"], state["since"] = now, time.monotonic()
            return None
        if now == before or not now["text"] or kernel_status(page) != "idle":
            return None
        quiet = time.monotonic() - state["since"]
        # The figure arrives after the printed line: wait for it, so that the next control change
        # does not start while this drawing is still on its way (a callback returning no figure,
        # e.g. "fp8 needs a GPU", settles after NO_FIGURE_S instead).
        if len(now["images"]) >= len(before["images"]):
            return now if quiet >= SETTLE_S else None
        return now if quiet >= NO_FIGURE_S else None

    try:
        return wait_for(settled, REDRAW_S, what, interval_s=0.3)
    except AssertionError as err:
        last = state["last"] or {"text": "", "images": [], "errors": []}
        raise AssertionError(f"{err}; the panel's output stayed {'the same' if last == before else 'unsettled'}:"
                             f"\n{last['text']}") from None


NUMBER = re.compile(r"[-+]?\d+(\.\d*)?([eE][-+]?\d+)?")


def _plain(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("\xa0", " ")).strip()


def naming(text: str, label: str, value: str) -> str | None:
    """How the printed text names a control's value: "label" (`n=256` for a slider called n),
    "word" (a non-numeric value such as `fp16` standing on its own), or None."""
    text, value = _plain(text), _plain(value)
    v = re.escape(value)
    if label.isidentifier() and re.search(rf"(?<![\w.]){re.escape(label)}\s*=\s*{v}(?![\w.])", text):
        return "label"
    if not NUMBER.fullmatch(value) and re.search(rf"(?<![\w.]){v}(?![\w.])", text):
        return "word"
    return None


def reflects(before: str, after: str, label: str, old: str, new: str) -> bool:
    """If the output named the control's old value, the redrawn output must name the new one the
    same way. (Outputs that never named it, e.g. a strategy that ignores a size, are not judged.)"""
    named = naming(before, label, old)
    if named is None:
        return True
    return naming(after, label, new) == "label" if named == "label" else naming(after, label, new) is not None


def test_reflects_tells_an_ignored_control_from_timing_noise():
    before = "add n=512 fp32: 0.0833 FLOP/B, 0.0013 TFLOP/s, 16 GB/s"
    assert reflects(before, "add n=256 fp32: 0.0833 FLOP/B, 0.0009 TFLOP/s, 11 GB/s", "n", "512", "256")
    assert not reflects(before, "add n=512 fp32: 0.0833 FLOP/B, 0.0012 TFLOP/s, 256 GB/s", "n", "512", "256")
    assert reflects(before, "add n=512 fp16: 0.167 FLOP/B", "format", "fp32", "fp16")
    assert not reflects(before, "add n=512 fp32: 0.0833 FLOP/B", "format", "fp32", "fp16")
    assert reflects("weight gradients × 2^0", "activations × 2^0", "values", "weight\xa0gradients", "activations")
    assert reflects("L=12: 0.8 GFLOP", "L=11: 0.7 GFLOP", "layers", "12", "11")  # never named as layers=: not judged


def controls(panel) -> list[dict]:
    """The panel's sliders, dropdowns and checkboxes, in order: kind, label and the element to drive."""
    found = []
    for box in panel.locator(".widget-hbox > .widget-inline-hbox").all():
        label = box.locator(".widget-label").first.inner_text().strip() if box.locator(".widget-label").count() else ""
        if box.locator("select").count():
            found.append({"kind": "dropdown", "label": label, "box": box})
        elif box.locator(".noUi-handle").count():
            found.append({"kind": "slider", "label": label, "box": box})
        elif box.locator("input[type=checkbox]").count():
            found.append({"kind": "checkbox", "label": label or box.inner_text().strip(), "box": box})
    return found


def show_whole(page, panel) -> None:
    """Scroll the notebook so that the whole panel is in view (for the screenshots)."""
    panel.evaluate("e => e.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)


def slider_value(box) -> str:
    return box.locator(".widget-readout").first.inner_text().strip()


def change(page, control: dict) -> tuple[str, str]:
    """Move one control as a user would; return the values it showed before and shows now."""
    box = control["box"]
    if control["kind"] == "slider":
        handle = box.locator(".noUi-handle").first
        old = slider_value(box)
        handle.focus()
        lo, now = handle.get_attribute("aria-valuemin"), handle.get_attribute("aria-valuenow")
        page.keyboard.press("ArrowLeft" if now is not None and lo is not None and float(now) > float(lo)
                            else "ArrowRight")
        wait_for(lambda: slider_value(box) != old, 10, f"slider {control['label']!r} to move")
        return old, slider_value(box)
    if control["kind"] == "checkbox":
        tick = box.locator("input[type=checkbox]").first
        old = str(tick.is_checked())
        tick.click()
        wait_for(lambda: str(tick.is_checked()) != old, 10, f"checkbox {control['label']!r} to change")
        return old, str(tick.is_checked())
    # The native option list of a <select> is not part of the page, so pick the option the way
    # Playwright documents for a user's choice: it selects it and fires input and change events.
    select = box.locator("select").first
    labels = select.evaluate("s => Array.from(s.options).map(o => o.text.trim())")
    old = select.evaluate("s => s.options[s.selectedIndex].text.trim()")
    new = next(label for label in labels if label != old)
    select.select_option(label=new)
    wait_for(lambda: select.evaluate("s => s.options[s.selectedIndex].text.trim()") == new, 10,
             f"dropdown {control['label']!r} to show {new!r}")
    return old, new


# A real browser on a busy 2-core machine can miss a deadline once; a broken panel fails both tries.
@pytest.mark.flaky(reruns=1)
@pytest.mark.parametrize("path", PANEL_NOTEBOOKS, ids=lambda p: p.stem)
def test_instructor_panels_redraw_in_jupyterlab(path, lab, browser, request, capsys, quiet_smoke):
    def say(line: str) -> None:  # shown even when pytest captures output: where the screenshots are
        with capsys.disabled():
            print(line, flush=True)

    out_dir = RUNS_DIR / re.sub(r"[^\w.-]+", "-", request.node.name).strip("-")
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    page = browser.new_page()
    page.set_default_timeout(30_000)
    try:
        open_notebook(page, lab, path.name)
        started = time.time()
        run_all_cells(page)
        wait_until_executed(page, path.name)
        # This run stands in for the notebook's papermill smoke run (tests/course/test_course_notebooks.py skips
        # it when this suite runs), so it checks the same: no traceback anywhere, records written.
        shown = page.locator(f"{NOTEBOOK} .jp-Notebook").first.evaluate(TRACEBACKS_JS)
        assert not shown, f"{path.name} showed a traceback:\n" + "\n---\n".join(shown)
        written = [p for p in (lab.root / "results").rglob("*.json") if p.stat().st_mtime >= started - 1]
        assert written, f"{path.name} recorded nothing under {lab.root / 'results'}"
        keep_quiet(lab.root / "results", quiet_smoke)
        panels = page.locator(f"{NOTEBOOK} .course-panel")
        wait_for(lambda: panels.count() >= panel_count(path), 60, f"{panel_count(path)} .course-panel widget(s)")
        for k in range(panels.count()):
            panel = panels.nth(k)
            show_whole(page, panel)
            prefix = "" if k == 0 else f"panel{k + 1}-"
            before = wait_for(lambda: (s := snapshot(panel))["text"] and s, REDRAW_S, "the panel's first drawing")
            assert not before["errors"], f"the panel's first drawing raised:\n{before['errors'][0][-2000:]}"
            shot = out_dir / f"{prefix}before.png"
            panel.screenshot(path=str(shot))
            say(f"\n{path.stem} panel {k + 1} before: {shot}\n  {before['text']}")
            found = controls(panel)
            assert found, f"panel {k + 1} of {path.name} has no slider, dropdown or checkbox"
            assert panel.locator(".widget-output img").count() or before["text"], "the panel drew nothing"
            for control in found:
                old, value = change(page, control)
                what = f"panel {k + 1} of {path.name} to redraw after {control['kind']} {control['label']!r} -> {value}"
                now = wait_for_redraw(page, panel, before, what)
                assert not now["errors"], f"the callback raised after {control['label']!r} -> {value}:\n{now['errors'][0][-2000:]}"
                assert reflects(before["text"], now["text"], control["label"], old, value), (
                    f"{control['kind']} {control['label']!r} went from {old!r} to {value!r}, and the panel redrew, "
                    f"but its output does not name the new value as it named the old one (the callback "
                    f"ignored the control?)\nbefore: {before['text']}\nafter:  {now['text']}")
                if before["images"] and now["images"]:
                    assert now["images"] != before["images"], (
                        f"{control['label']!r} -> {value}: the printed line changed but the figure is the old one")
                say(f"  {control['kind']} {control['label']!r} {old} -> {value}: {now['text']}")
                before = now
            show_whole(page, panel)
            shot = out_dir / f"{prefix}after.png"
            panel.screenshot(path=str(shot))
            say(f"{path.stem} panel {k + 1} after: {shot}")
    except Exception:
        page.screenshot(path=str(out_dir / "failure-page.png"), full_page=False)
        print(f"page at failure: {out_dir / 'failure-page.png'}\nserver log tail:\n{lab.log_tail(2000)}")
        raise
    finally:
        try:
            lab.shutdown_kernel_of(path.name)
        finally:
            page.close()
