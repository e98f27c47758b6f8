"""Every notebook that uses bf16 says so where bf16 is emulated (a GPU without bf16 units, a T4; a CPU without
AVX512-BF16 or AMX): one sentence from `hardware.emulated`, or the format chosen by `hardware.capabilities` /
`hardware.default_dtype`, in its own cells or in the lab that times it. A new notebook that times bf16 without it
fails here."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SAYS = re.compile(r"\bemulated\(|emulated_formats\(|capabilities\(\)\[\"bf16\"\]|default_dtype\(")
USES_BF16 = re.compile(r"bf16|bfloat16")

# Notebooks whose sentence is said by the lab that picks or times the format (the module must say it), or which
# use bf16 only where nothing is timed.
BY_LAB = {"01": "helpers/cost/roofline_lab.py", "14": "helpers/capstone/stack_lab.py"}
NOTHING_TIMED = {"13": "bf16 appears only as the tolerance of a correctness check of FSDP's mixed precision"}


def code(path: Path) -> str:
    nb = json.loads(path.read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_using_bf16_says_where_it_is_emulated(path):
    number, text = path.stem[:2], code(path)
    if not USES_BF16.search(text) or number in NOTHING_TIMED:
        return
    if number in BY_LAB:
        assert SAYS.search((ROOT / BY_LAB[number]).read_text()), f"{BY_LAB[number]} no longer says when bf16 is emulated"
        return
    assert SAYS.search(text), (f"{path.name} uses bf16 but none of its code cells says where it is emulated: print "
                               "hardware.emulated(...) where the format is chosen (or pick it with hardware.default_dtype)")


def test_the_exceptions_are_real():
    assert set(BY_LAB) | set(NOTHING_TIMED) <= {p.stem[:2] for p in NOTEBOOKS}
    for number in NOTHING_TIMED:   # an exception for a notebook that starts timing bf16 must be reconsidered
        text = code(next(p for p in NOTEBOOKS if p.stem.startswith(number)))
        assert "torch.bfloat16" not in text, f"notebook {number} now uses torch.bfloat16: does it time it?"


def test_the_rule_catches_a_notebook_that_times_bf16_silently(tmp_path):
    planted = tmp_path / "99_planted.ipynb"
    planted.write_text(json.dumps({"cells": [{"cell_type": "code", "source": ["x = torch.randn(8).to(torch.bfloat16)\n"]}]}))
    with pytest.raises(AssertionError, match="says where it is emulated"):
        test_a_notebook_using_bf16_says_where_it_is_emulated(planted)
