"""Numbers in words: percentages, byte counts and durations, formatted one way in every sentence and table."""
from __future__ import annotations


def percent(fraction: float) -> str:
    """A fraction as a percentage with two significant digits below 10% and none above (0.0028 -> '0.28%',
    0.26 -> '26%', 1.5 -> '150%')."""
    value = 100 * fraction
    return f"{value:.0f}%" if value >= 10 else f"{value:.2g}%"


def fmt_bytes(n: float) -> str:
    """Bytes in binary units to three significant digits: '48 KiB', '480 MiB', '1.5 GiB'; under 1 KiB '512 B'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:g} B"


def fmt_seconds(s: float) -> str:
    """A duration: '12.3 µs' below 1 ms, '13.43 ms' below 1 s, else '1.23 s'."""
    a = abs(s)
    return f"{s * 1e6:.1f} µs" if a < 1e-3 else f"{s * 1e3:.2f} ms" if a < 1 else f"{s:.2f} s"
