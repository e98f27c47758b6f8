"""Plain-text tables for notebook output and the runner's summary."""
from __future__ import annotations

from typing import Any, Sequence


def cell(value: Any, digits: int = 4) -> str:
    """Format one table cell: floats to `digits` significant digits, None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns with a rule under the header."""
    text = [[str(h) for h in header]] + [[cell(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in text) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in text]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
