"""Exercise checkers: print a clear pass or fail, and a hint when it fails. They never raise.

They return None so a notebook cell shows only the printed verdict; tests read the printed text.
"""
from __future__ import annotations

import math
from typing import Any


def _verdict(name: str, answer: Any, ok: bool, hint: str, detail: str) -> None:
    if answer is None or answer is Ellipsis:
        print(f"TODO  {name}: not answered yet (replace the ... ); hint: {hint}")
    elif ok:
        print(f"PASS  {name}: {detail}")
    else:
        print(f"FAIL  {name}: {detail}\n      hint: {hint}")


def check_close(name: str, answer: Any, expected: float, *, rtol: float = 1e-2, hint: str = "") -> None:
    """Pass when the learner's number is within `rtol` (relative) of `expected`."""
    try:
        value = float(answer)
    except (TypeError, ValueError):
        _verdict(name, answer, False, hint, f"expected a number, got {type(answer).__name__}")
        return
    ok = math.isclose(value, expected, rel_tol=rtol)
    _verdict(name, answer, ok, hint, f"you gave {value:.4g}" + ("" if ok else f", expected about {expected:.4g}"))


def check_equal(name: str, answer: Any, expected: Any, *, hint: str = "") -> None:
    """Pass when the learner's answer equals `expected` (strings compared case-insensitively)."""
    if isinstance(answer, str) and isinstance(expected, str):
        ok = answer.strip().lower() == expected.strip().lower()
    else:
        ok = answer == expected
    _verdict(name, answer, ok, hint, f"you gave {answer!r}")
