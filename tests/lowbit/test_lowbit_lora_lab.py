"""helpers.lowbit.lora_lab: notebook 08's fine-tuning and memory measurements and their sentences, and the
QLoRA 65B formula verdict."""
from __future__ import annotations

import pytest
import torch

from helpers.lowbit import lora, lora_lab
from helpers.measure import claims


@pytest.mark.slow
def test_finetune_compare_returns_its_numbers(tiny):
    res = lora_lab.finetune_compare(tiny, steps=2, eval_batches=1)
    assert set(res["losses"]) == set(lora.KINDS) and all(len(v) == 2 for v in res["losses"].values())
    assert len(res["untuned"]) == 2 and res["untuned"][0] == pytest.approx(res["losses"]["lora"][0], abs=1e-5)
    assert res["trainable"]["lora"] == res["trainable"]["qlora"] < res["trainable"]["full"]
    assert len(res["merged"]) == 4 and lora_lab.finetune_sentence(res).startswith("Held-out loss before fine-tuning")
    assert lora_lab.merged_sentence(res).startswith("Against the adapters as trained (unmerged on the NF4 base): ")
    assert lora_lab.last_steps(res) == 1
    assert lora_lab.gain(res, "full", 1) == pytest.approx(res["losses"]["full"][-1] - res["untuned"][-1])
    import matplotlib.pyplot as plt

    plt.close(lora_lab.finetune_figure(res))


def test_finetune_sentences_follow_the_signs():
    kinds = list(lora.KINDS)
    up = {k: 0.01 for k in kinds}
    assert "All three lowered it" in lora_lab._verdict([], "lora", 10, up)
    text = lora_lab._verdict(kinds, "lora", 10, up)
    assert "All three made the held-out loss worse (the least: lora)" in text and "did not fall either" in text
    text = lora_lab._verdict(["full"], "lora", 10, {**up, "full": -0.01})
    assert "The largest drop: lora; full made the held-out loss worse" in text and "fell for full" in text
    assert "did not fall" not in text
    assert lora_lab._merge_reason("merged into original 16-bit W", -0.01).startswith(": lower")
    assert lora_lab._merge_reason("merged into original 16-bit W", 0.01).startswith(": higher")
    assert lora_lab._merge_reason("merged, re-quantised to NF4", 0.01) == "."


def test_memory_measured_against_formula(tiny):
    rows = {r["method"]: r for r in lora_lab.memory_rows(tiny, r=4)}
    for kind in ("full", "lora"):
        assert rows[kind]["measured"] == rows[kind]["formula"]
    q = rows["qlora"]
    assert q["measured"]["gradients"] == q["formula"]["gradients"] == rows["lora"]["measured"]["gradients"]
    gap = q["measured"]["weights"] - q["formula"]["weights"]
    assert 0 <= gap - q["code_tables"] < 0.002 * q["formula"]["weights"]  # the rest: a few scalars and padding
    assert q["measured"]["weights"] < 0.4 * rows["full"]["measured"]["weights"]
    said = lora_lab.memory_sentence(list(rows.values()))
    assert "differ from the formulas by at most 0.0% (" not in said  # QLoRA's code tables are measured, not formula
    assert said.startswith("Weights + gradients + AdamW state: full ") and f"take {q['code_tables'] / 1024:.1f} KiB" in said


def test_finetune_verdict_ranks_only_beyond_the_noise():
    kinds = list(lora.KINDS)
    up = {k: 0.01 for k in kinds}
    jitter = torch.tensor([0.02, -0.02, 0.01, -0.01])
    tied = {k: -0.0001 + jitter for k in kinds}  # the qlora-by-0.0001 case: no drop beats the noise
    text = lora_lab._verdict([], "qlora", 10, up, tied)
    assert "changed the held-out loss by less than the noise" in text and "not named" in text
    clear = {"full": torch.full((4,), -0.05) + jitter / 10, "lora": torch.full((4,), -0.01) + jitter / 10,
             "qlora": torch.full((4,), -0.02) + jitter / 10}
    text = lora_lab._verdict([], "full", 10, up, clear)
    assert text == "All three lowered it from where they started; the largest drop: full."


def test_qlora_claim_is_a_formula_verdict_from_the_measured_bits(results_tmp):
    kw = lora_lab.qlora_65b_claim(4.127, 64)
    total = sum(lora.finetune_gb(65, lora.FINETUNE[2], rank=64, base_bits=4.127).values())
    assert kw["basis"] == "formula" and "verdict" not in kw and kw["value"] == pytest.approx(total)
    assert kw["claimed"] == (None, 48) and kw["above"] == "contradicted"  # a ceiling: over it is against the claim
    assert "4.127 bits" in kw["measured"] and "blocks of 64" in kw["measured"] and "activations are not counted" in kw["measured"]
    row = claims.verdict("qlora-65b-48gb", quiet=True, **kw)
    assert row["basis"] == "formula" and row["verdict"] == "supported" and "left for them" in row["reason"]
    heavy = lora_lab.qlora_65b_claim(8.0, 32)  # 65 GB of base alone: over 48 GB even widened by 10%
    row = claims.verdict("qlora-65b-48gb", quiet=True, **heavy)
    assert row["verdict"] == "contradicted" and heavy["value"] > 52.8 and "8.000 bits" in heavy["measured"]


def test_takeaways_say_whether_qlora_65b_fits_in_48_gb():
    merged = {"QLoRA, unmerged": (1.0, 2.718), "merged into original 16-bit W": (1.1, 3.004)}
    adapters, adamw, memory = lora_lab.takeaways(merged, 10, {"adamw": 8.0, "adamw8bit": 2.5}, 780.0, 41.2, 4.127)
    assert adapters == "- QLoRA adapters after 10 steps: QLoRA, unmerged perplexity 2.718; merged into original 16-bit W perplexity 3.004."
    assert adamw == "- 8-bit AdamW: adamw 8.00 bytes/param, adamw8bit 2.50 bytes/param of optimizer state."
    assert "QLoRA 41.2 GB with the base at the measured 4.127 bits/param, under 48 GB" in memory
    assert ", over 48 GB" in lora_lab.takeaways(merged, 10, {}, 780.0, 50.0, 4.5)[2]
