"""helpers.lowbit.gptq_lab: notebook 08's GPTQ / AWQ rows (layer errors, perplexity), their sentences and AWQ's
explanation from the outlier table."""
from __future__ import annotations

import pytest

from helpers.lowbit import gptq, gptq_lab


@pytest.mark.slow
def test_layer_errors_and_perplexities_are_returned_as_rows(tiny, calib):
    rows = gptq_lab.layer_error_rows(tiny, calib, bits=(3,), group_size=64)
    assert len(rows) == len(gptq.block_linears(tiny))
    assert {"layer", "bits", "rtn", "gptq", "awq", "alpha"} <= set(rows[0])
    said = gptq_lab.layer_error_sentences(rows, 64)
    assert len(said) == 1 and said[0].startswith("3-bit, groups of 64: GPTQ's output error is below RTN's in")
    ppl = gptq_lab.perplexity_rows(tiny, calib, bits=(4,), group_size=64, batches=1)
    assert [r["method"] for r in ppl] == ["fp32", "rtn", "gptq", "awq"]
    assert all(r["perplexity"] > 1 for r in ppl)


def test_layer_error_sentences_count_the_wins_from_the_rows():
    rows = [{"layer": f"l{i}", "bits": b, "rtn": 1.0, "gptq": g, "awq": a, "alpha": al}
            for i, (b, g, a, al) in enumerate([(4, 0.5, 1.0, 0.0), (4, 0.5, 0.8, 0.5), (3, 2.0, 0.9, 0.5)])]
    four, three = gptq_lab.layer_error_sentences(rows, None)
    assert four.startswith("4-bit, one group per row: GPTQ's output error is below RTN's in 2 of 2 layers "
                           "(geometric mean 0.50× RTN's), AWQ's in 1 of 2 (0.89× RTN's); in 1 layer AWQ's search chose α = 0")
    assert three.startswith("3-bit, one group per row: GPTQ's output error is below RTN's in 0 of 1 layers (geometric "
                            "mean 2.00× RTN's), AWQ's in 1 of 1") and "α = 0" not in three


def test_perplexity_sentences_name_the_lowest_and_doubt_a_drop_below_fp32():
    rows = [{"method": "fp32", "bits": 32, "perplexity": 2.0}, {"method": "rtn", "bits": 4, "perplexity": 2.2},
            {"method": "gptq", "bits": 4, "perplexity": 1.99}, {"method": "awq", "bits": 4, "perplexity": 2.1}]
    (said,) = gptq_lab.perplexity_sentences(rows, batches=3)
    assert said.startswith("4-bit: perplexity against fp32's 2.000: RTN 2.200 (+10.00%), GPTQ 1.990 (-0.50%)")
    assert "the lowest is GPTQ. GPTQ came out below fp32 (by at most 0.50%)" in said and "on 3 batches" in said


def _outliers(max_abs, cols_over):
    return [{"layer": "blocks.0.mlp.down", "max_abs": max_abs, "cols_over": cols_over}]


def test_awq_explanation_follows_the_outlier_table():
    layers = [{"bits": 3, "alpha": 0.0}, {"bits": 3, "alpha": 0.25}, {"bits": 4, "alpha": 0.0}]
    none = gptq_lab.awq_explanation(_outliers(4.98, 0.0), layers, 3, 6.0)
    assert "no salient channels to protect" in none and "4.98" in none and "α = 0 (RTN itself) in 1 of 2" in none
    some = gptq_lab.awq_explanation(_outliers(40.0, 0.02), layers, 3, 6.0)
    assert "there were channels to protect" in some and "no salient" not in some
