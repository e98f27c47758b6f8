"""helpers.lowbit.quant_lab: notebook 08's weight / activation errors, the sweep of formats, the highest
held-out loss beyond the noise and the sentences from its tables."""
from __future__ import annotations

import pytest
import torch

from helpers.gpt.model import GPT, GPTConfig
from helpers.lowbit import quant, quant_lab


def _w(shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_spec_sweep_quantizes_in_place_then_restores_and_orders_bits():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", n_layer=1)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randint(0, model.config.vocab_size, (2, 16))
    specs = [("absmax", 8, "channel"), ("zeropoint", 3, 32), ("nf4", 4, 64)]
    with torch.no_grad():
        ref = model(x)[0]
        got = quant_lab.spec_sweep(model, specs, lambda m: quant.error(ref, m(x)[0]))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    e8, e3, e4 = (got[(m, b, str(g))] for m, b, g in specs)
    assert e8["value"] < e4["value"] < e3["value"] and e8["error"] < e4["error"] < e3["error"]
    assert 8 + 32 / 512 <= e8["bits"] <= 8 + 32 / 128  # codes plus one fp32 scale per row of 128 or 512 inputs
    assert e4["bits"] == 4.5 and e3["bits"] == 3 + 64 / 32
    rows = quant_lab.weight_error_rows({"w": _w((16, 64))}, ["tensor", "channel", 32])
    assert [r["method"] for r in rows][-2:] == ["nf4", "nf4-dq"]


def test_notebook_08_sources_hold_no_control_characters():
    """No control characters: a LaTeX `\\rVert` in a Python string without r"" is a carriage return + "Vert"."""
    import json
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parents[2] / "notebooks" / "08_quantization.ipynb").read_text())
    for i, cell in enumerate(nb["cells"]):
        text = "".join(cell["source"])
        assert not any(ch in text for ch in "\r\t\b\f\v"), f"cell {i} holds a control character"


def test_outlier_profile_counts_columns_at_the_threshold_it_is_given():
    """The notebook's column header names its THRESHOLD parameter, so the share must be counted at that threshold,
    not at a fixed 6."""
    x = torch.zeros(4, 10)
    x[0, 0], x[1, 1], x[2, 2] = 7.0, -4.5, 3.0  # column maxima 7, 4.5, 3 and zeros elsewhere
    (at6,) = quant_lab.outlier_profile({"l": x})
    (at4,) = quant_lab.outlier_profile({"l": x}, threshold=4.0)
    (at3,) = quant_lab.outlier_profile({"l": x}, threshold=3.0)  # |x| >= threshold: 3 itself counts
    assert (at6["cols_over"], at4["cols_over"], at3["cols_over"]) == pytest.approx((0.1, 0.2, 0.3))
    assert at4["threshold"] == 4.0 and at6["top_column"] == 0
    for bad in (0, -1.0, True, "6"):
        with pytest.raises(ValueError, match="threshold"):
            quant_lab.outlier_profile({"l": x}, threshold=bad)


def test_highest_loss_names_a_model_only_beyond_the_noise():
    base = torch.tensor([1.0, 1.2, 0.8, 1.1, 0.9, 1.0])
    noisy = base + torch.tensor([0.02, -0.03, 0.01, -0.02, 0.03, 0.0])  # mean gap ~0.0017, spread 0.02
    shifted = base + 0.05 + torch.tensor([0.001, -0.001, 0.0, 0.001, -0.001, 0.0])
    assert "cannot be told apart" in quant_lab.highest_loss({"A": noisy, "B": base, "C": base - 0.5})
    assert quant_lab.highest_loss({"A": shifted, "B": base}).startswith("the highest loss is A's")
    assert quant_lab.highest_loss({"A": base}) == "the only loss is A's"


def test_zero_point_bits_note_prices_the_fp32_zero():
    note = quant_lab.zero_point_bits_note(4, 64, 5.0)
    assert "4 + 64/64 = 5.00 bits" in note and "(5.00 in the table)" in note and "NF4's 4 + 32/64 = 4.50" in note
    assert "fp16 scale and zero they would cost 4.50" in note and "4-bit integer zero 4.31" in note
    assert "4 + 64/128 = 4.50" in quant_lab.zero_point_bits_note(4, 128)
    measured = quant.quantize(torch.randn(8, 128), 4, "zeropoint", 64).packed_bits_per_param()
    assert measured == pytest.approx(4 + 64 / 64)  # the table's count is the note's formula


def test_takeaways_follow_the_numbers():
    err = [{"method": m, "bits": 4, "granularity": str(g), "mean_error": e, "bits_per_param": b}
           for m, g, e, b in [("absmax", "tensor", 0.30, 4.0), ("absmax", "channel", 0.20, 4.1),
                              ("absmax", 64, 0.10, 4.5), ("nf4", 64, 0.08, 4.5)]]
    win = lambda v: torch.full((8,), v) + torch.linspace(-1e-3, 1e-3, 8)  # noqa: E731
    labels = {"fp32": 1.00, "int4 RTN (absmax, g64)": 1.01, "NF4 (block 64)": 1.02, "int3 RTN (zero-point, g64)": 1.20,
              "GPTQ int3 (g64)": 1.10, "AWQ int3 (g64)": 1.20}
    windows = {k: win(v) for k, v in labels.items()}
    ppl = {k: {"loss": float(w.mean()), "ppl": float(w.mean().exp())} for k, w in windows.items()}
    layer = [{"gptq": 0.1, "awq": 0.3, "rtn": 0.2}, {"gptq": 0.1, "awq": 0.1, "rtn": 0.2}]
    lines = quant_lab.takeaways("tiny", ["tensor", "channel", 64], err, {False: (4.5, 4.5, 0.1), True: (4.127, 4.127, 0.1)},
                                64, ppl, windows, 2, layer, "WHY.", {0.0: {"ours": 0.2}, 6.0: {"ours": 0.02}}, 10.0, 0, 6.0)
    assert lines[0].endswith("0.300 with one scale per tensor, 0.200 per channel, 0.100 in groups of 64.")
    assert "error 0.080 vs 0.100, NF4 1.25x lower." in lines[1]
    assert lines[2] == "- Double quantization: 4.500 -> 4.127 bits/param at block 64, error 0.1000 -> 0.1000."
    assert "the highest median is int3 RTN (zero-point, g64)'s" in lines[3]
    assert "below RTN's in 2 of 2 layer x bit cases, AWQ's in 1; AWQ's loss was not measurably below RTN's" in lines[4]
    assert "WHY." in lines[4] and "GPTQ's loss was not measurably" not in lines[4]  # GPTQ's 0.1 nats beat the noise
    assert lines[5].startswith("- LLM.int8 on planted outliers: error 0.2000 without the decomposition, 0.0200 with it "
                               "(10.0x lower)")
