"""The crossover rows and claim, and Hugging Face's gradient checkpointing against the course's policy."""
import pytest

from helpers.gpt.model import GPTConfig
from helpers.measure import claims
from helpers.training import activation_bytes_lab, checkpointing


def test_crossover_rows_use_the_blocks_exact_parameters_and_the_claim_judges_against_the_context():
    rows = activation_bytes_lab.crossover_rows(["tiny", "gpt2"])
    tiny, gpt2 = rows
    assert tiny["weight_bytes"] == 2 * (12 * 128**2 + 13 * 128)  # four matrices, their biases, two LayerNorms
    assert gpt2["crossover"] == pytest.approx(checkpointing.activation_crossover(768, 12, gpt2["weight_bytes"]))
    assert gpt2["ratio_at_context"] == pytest.approx(checkpointing.korthikanti_bytes(1024, 1, 768, 12) / gpt2["weight_bytes"])
    row = activation_bytes_lab.crossover_claim(rows, "gpt2")
    assert row["basis"] == "formula" and row["claimed"] == (None, 1024) and row["value"] == gpt2["crossover"]
    assert claims.judge_interval(row["value"], row["value"], row["value"], *row["claimed"], above=row["above"])[0] == "supported"
    far = activation_bytes_lab.crossover_claim([dict(gpt2, context=128)], "gpt2")  # a context shorter than the crossover
    assert claims.judge_interval(far["value"], far["value"], far["value"], *far["claimed"], above=far["above"])[0] == "contradicted"


def test_hf_policy_rows_put_hugging_face_beside_the_course():
    rows = activation_bytes_lab.hf_policy_rows({"saved_off": 4 * 2**20, "saved_on": 2**20}, {"none": 8 * 2**20, "every": 2**20})
    assert [r[0] for r in rows] == ["none", "every"] and rows[1][2:] == [1.0, 1.0, "0.25 / 0.12"]


@pytest.mark.slow
def test_hf_gradient_checkpointing_keeps_gradients_and_saves_bytes():
    pytest.importorskip("transformers")
    cfg = GPTConfig.preset("tiny", n_layer=2, vocab_size=64, seq_len=16)
    hf = activation_bytes_lab.hf_checkpointing(cfg, 2, 16)
    assert hf["identical"] and hf["max_grad_diff"] == 0.0
    assert hf["checkpointed_layers"] == hf["layers"] == 2
    assert 0 < hf["saved_on"] < hf["saved_off"]
