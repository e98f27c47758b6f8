"""helpers.show.units: percentages, byte counts and durations, one format each."""
import pytest

from helpers.show import units


@pytest.mark.parametrize("fraction, text", [(0.0028, "0.28%"), (0.26, "26%"), (0.1, "10%"), (1.5, "150%"),
                                            (0.05, "5%"), (0.0, "0%")])
def test_percent(fraction, text):
    assert units.percent(fraction) == text


@pytest.mark.parametrize("n, text", [(2**20, "1 MiB"), (480 * 2**20, "480 MiB"), (1.5 * 2**30, "1.5 GiB"),
                                     (48 * 2**10, "48 KiB"), (512, "512 B")])
def test_fmt_bytes(n, text):
    assert units.fmt_bytes(n) == text


@pytest.mark.parametrize("s, text", [(12.3e-6, "12.3 µs"), (0.01343, "13.43 ms"), (1.234, "1.23 s"),
                                     (-2e-6, "-2.0 µs")])
def test_fmt_seconds(s, text):
    assert units.fmt_seconds(s) == text
