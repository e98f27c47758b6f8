"""helpers.lowbit.optim8bit_lab: 8-bit optimizer state (bitsandbytes AdamW8bit) against torch's AdamW."""
from __future__ import annotations

import pytest

from helpers.lowbit import optim8bit_lab


def test_adamw8bit_state_is_uint8_above_the_threshold_only(tiny):
    res = optim8bit_lab.compare_optimizers(tiny, steps=2)
    by = {t["name"]: t for t in res["tensors"]}
    big, small = by["blocks.0.mlp.up.weight"], by["blocks.0.mlp.up.bias"]
    assert big["adamw"] == small["adamw"] == 8.0
    assert big["dtypes8"] == "float32/uint8" and big["adamw8bit"] == pytest.approx(2 + 2 * 4 / 256)
    assert small["dtypes8"] == "float32" and small["adamw8bit"] == 8.0
    assert res["losses"]["adamw"][0] == res["losses"]["adamw8bit"][0]  # same start, same batch
    shown = optim8bit_lab.shown_tensors(res)
    assert shown[0]["numel"] >= 4096 > shown[-1]["numel"] and len(shown) <= 7
    out = " ".join(optim8bit_lab.optimizer_sentences(res))
    assert "consistent with bitsandbytes' min_8bit_size of 4096" in out and "4095 elements → float32" in out
    assert 0 < res["update_gap"] < 0.05


def test_adamw8bit_threshold_and_update_against_adamw():
    assert optim8bit_lab.threshold_probe() == {4095: "float32", 4096: "uint8"}
    gap = optim8bit_lab.update_gap(steps=5)
    assert 0 < gap < 0.05  # 8-bit moments: the update moves, by about a percent, never by much


def test_optimizer_sentences_say_when_the_threshold_is_not_bracketed():
    res = {"tensors": [{"name": "w", "numel": 5000, "adamw": 8.0, "adamw8bit": 8.0, "dtypes8": "float32"},
                       {"name": "b", "numel": 10, "adamw": 8.0, "adamw8bit": 8.0, "dtypes8": "float32"}],
           "threshold": {4095: "float32"}, "update_gap": 0.01, "bytes_per_param": {"adamw": 8.0, "adamw8bit": 8.0},
           "losses": {"adamw": [2.0, 1.5], "adamw8bit": [2.0, 1.6]}}
    first, _, last = optim8bit_lab.optimizer_sentences(res)
    assert first.startswith("0 of 2 tensors got uint8 state; the threshold 4096 is not bracketed")
    assert "(1.0× less; above the 2 bytes" in last and "the largest per-step gap is 1.0e-01" in last
