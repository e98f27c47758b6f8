"""helpers.lowbit.gptq_lab: notebook 08's GPTQ / AWQ sections (layer errors, perplexity) and AWQ's
explanation from the outlier table."""
from __future__ import annotations

import pytest

from helpers.lowbit import gptq, gptq_lab


@pytest.mark.slow
def test_sections_print_and_return_rows(tiny, calib, capsys):
    rows = gptq_lab.layer_error_section(tiny, calib, bits=(3,), group_size=64)
    assert len(rows) == len(gptq.block_linears(tiny))
    out = capsys.readouterr().out
    assert "3-bit, groups of 64: GPTQ's output error is below RTN's in" in out
    ppl = gptq_lab.perplexity_section(tiny, calib, bits=(4,), group_size=64, batches=1)
    assert [r["method"] for r in ppl] == ["fp32", "rtn", "gptq", "awq"]
    assert all(r["perplexity"] > 1 for r in ppl)


def _outliers(max_abs, cols_over):
    return [{"layer": "blocks.0.mlp.down", "max_abs": max_abs, "cols_over": cols_over}]


def test_awq_explanation_follows_the_outlier_table():
    layers = [{"bits": 3, "alpha": 0.0}, {"bits": 3, "alpha": 0.25}, {"bits": 4, "alpha": 0.0}]
    none = gptq_lab.awq_explanation(_outliers(4.98, 0.0), layers, 3, 6.0)
    assert "no salient channels to protect" in none and "4.98" in none and "α = 0 (RTN itself) in 1 of 2" in none
    some = gptq_lab.awq_explanation(_outliers(40.0, 0.02), layers, 3, 6.0)
    assert "there were channels to protect" in some and "no salient" not in some
