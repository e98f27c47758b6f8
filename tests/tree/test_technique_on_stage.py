"""The technique on stage: each notebook defines the core of its technique in its own cells, and each such cell
is the same code, comments included, as its twin in helpers/ (which later notebooks, the tests and the capstone
import). Also: no lab prints a notebook section (`*_section`), and every notebook resolves its parameters the
one way (`params.fill`)."""
import ast
import json
import re
from pathlib import Path

import pytest

from helpers.course import on_stage

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _cells(nb: Path) -> list[dict]:
    return json.loads(nb.read_text())["cells"]


def _notebook(tmp_path: Path, *sources: str) -> Path:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": "## Build it"}]
    cells += [{"cell_type": "code", "metadata": {}, "source": s, "outputs": [], "execution_count": None}
              for s in sources]
    path = tmp_path / "99_planted.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


TWIN = on_stage.twin("helpers.course.on_stage.definitions")["definitions"]


def test_an_identical_cell_passes_and_every_kind_of_drift_is_caught(tmp_path):
    good = _notebook(tmp_path, "# on stage: helpers.course.on_stage.definitions\n" + TWIN + "\n\nprint(1)\n")
    assert [on_stage.differences(s) for s in on_stage.stages(good)] == [[]]
    drifts = {
        "a comment changed": TWIN.replace("{name: source}", "{name: text}"),
        "a line changed": TWIN.replace("splitlines()", "split('\\n')"),
        "a line added": TWIN + "\n    pass",
        "another name": TWIN.replace("def definitions(", "def definition("),
    }
    for why, src in drifts.items():
        bad = _notebook(tmp_path, "# on stage: helpers.course.on_stage.definitions\n" + src)
        found = on_stage.differences(on_stage.stages(bad)[0])
        assert found, why
    module_form = _notebook(tmp_path, "# on stage: helpers.course.on_stage\n" + TWIN + "\n\n\ndef extra():\n    pass\n")
    assert "extra is not defined" in on_stage.differences(on_stage.stages(module_form)[0])[0]
    nothing = _notebook(tmp_path, "# on stage: helpers.course.on_stage\nx = 1\n")
    assert "defines no function" in on_stage.differences(on_stage.stages(nothing)[0])[0]
    nowhere = _notebook(tmp_path, "# on stage: helpers.course.on_stage.no_such_thing\ndef no_such_thing(): pass\n")
    assert "no definition named" in on_stage.differences(on_stage.stages(nowhere)[0])[0]


def test_a_method_on_stage_is_compared_dedented():
    src = on_stage.twin("helpers.course.on_stage.Stage")["Stage"]
    assert src.startswith("@dataclass(frozen=True)\nclass Stage:")  # decorators belong to the definition
    stage = on_stage.Stage("x", 0, "helpers.course.on_stage.Stage", "# on stage: helpers.course.on_stage.Stage\n" + src)
    assert on_stage.differences(stage) == []


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_each_notebook_defines_its_technique_in_its_own_cells_identical_to_helpers(nb):
    cells = _cells(nb)
    heads = [(i, line) for i, c in enumerate(cells) if c["cell_type"] == "markdown"
             for line in "".join(c["source"]).splitlines() if line.startswith("## ")]
    theory = next(i for i, h in heads if h.startswith("## Theory"))
    exercises = next(i for i, h in heads if h.startswith("## Exercises"))
    found = on_stage.stages(nb)
    assert found, f"{nb.name}: no cell puts the technique on stage ('{on_stage.MARKER} helpers.<module>[.<name>]')"
    assert any(theory < s.index < exercises for s in found), f"{nb.name}: the on-stage cells are outside the lesson"
    problems = [d for s in found for d in on_stage.differences(s)]
    assert not problems, "\n".join(problems)


def test_no_lab_prints_a_notebook_section():
    sections = [f"{p.relative_to(ROOT)}: {n.name}" for p in (ROOT / "helpers").rglob("*.py")
                for n in ast.walk(ast.parse(p.read_text()))
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.endswith("_section")]
    assert not sections, "labs return rows and cells print them; these still print a section:\n" + "\n".join(sections)


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_parameters_are_resolved_one_way(nb):
    cells = _cells(nb)
    i = next(i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    setup = "".join(cells[i + 1]["source"])
    assert "params.fill(globals()," in setup, f"{nb.name}: the setup cell does not resolve with params.fill"
    code = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert not re.search(r"(?<![\w.])P\[[\"']", code), f"{nb.name}: parameters unpacked by hand from a dict"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_no_exercise_takes_the_name_of_an_on_stage_definition(nb):
    """A learner's exercise function named like an on-stage one would replace it in the kernel: cells that call the
    course's code (re-run, or run after the exercise) would then run the learner's draft instead."""
    staged = {name for s in on_stage.stages(nb) for name in on_stage.definitions(s.source)}
    clashes = []
    for c in _cells(nb):
        src = "".join(c["source"])
        if c["cell_type"] == "code" and "check.exercise(" in src:
            clashes += sorted(set(on_stage.definitions(src)) & staged)
    assert not clashes, f"{nb.name}: exercise cells define on-stage names {clashes}"
