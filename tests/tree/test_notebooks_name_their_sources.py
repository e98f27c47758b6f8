"""A notebook that cites "the first/second source text" says what those texts are where it first names them: a
learner who opens one notebook alone (on Colab, say) has not read notebook 00's introduction of them."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
NAMES = re.compile(r"source text", re.IGNORECASE)
SAYS_WHAT = "Japanese"  # every introduction says the texts are Japanese ones the course answers, and what each covers


def first_mention(cells: list[dict]) -> str | None:
    """The first markdown cell's text that names a source text, or None."""
    for cell in cells:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and NAMES.search(text):
            return text
    return None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_first_mention_of_a_source_text_says_what_it_is(path):
    text = first_mention(json.loads(path.read_text())["cells"])
    if text is None:
        return
    assert SAYS_WHAT in text, (f"{path.name} first names a source text in a cell that does not say what it is: "
                               f"{NAMES.search(text).group(0)!r} needs a few words (a Japanese survey of "
                               "training-efficiency techniques, or a Japanese text on FLOP counting and measured efficiency)")


def test_a_bare_mention_is_caught():
    cells = [{"cell_type": "code", "source": ["# the first source text, section 2\n"]},
             {"cell_type": "markdown", "source": ["The second source text says so.\n"]},
             {"cell_type": "markdown", "source": ["The second source text, a Japanese text on FLOPs, says so.\n"]}]
    assert SAYS_WHAT not in first_mention(cells)
    assert first_mention(cells[2:]) and SAYS_WHAT in first_mention(cells[2:])
