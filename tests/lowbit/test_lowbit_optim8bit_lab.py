"""helpers.lowbit.optim8bit_lab: 8-bit optimizer state (bitsandbytes AdamW8bit) against torch's AdamW."""
from __future__ import annotations

import pytest

from helpers.lowbit import optim8bit_lab


def test_adamw8bit_state_is_uint8_above_the_threshold_only(tiny, capsys):
    res = optim8bit_lab.optimizer_section(tiny, steps=2)
    by = {t["name"]: t for t in res["tensors"]}
    big, small = by["blocks.0.mlp.up.weight"], by["blocks.0.mlp.up.bias"]
    assert big["adamw"] == small["adamw"] == 8.0
    assert big["dtypes8"] == "float32/uint8" and big["adamw8bit"] == pytest.approx(2 + 2 * 4 / 256)
    assert small["dtypes8"] == "float32" and small["adamw8bit"] == 8.0
    assert res["losses"]["adamw"][0] == res["losses"]["adamw8bit"][0]  # same start, same batch
    out = capsys.readouterr().out
    assert "consistent with bitsandbytes' min_8bit_size of 4096" in out and "4095 elements → float32" in out
    assert 0 < res["update_gap"] < 0.05


def test_adamw8bit_threshold_and_update_against_adamw():
    assert optim8bit_lab.threshold_probe() == {4095: "float32", 4096: "uint8"}
    gap = optim8bit_lab.update_gap(steps=5)
    assert 0 < gap < 0.05  # 8-bit moments: the update moves, by about a percent, never by much
