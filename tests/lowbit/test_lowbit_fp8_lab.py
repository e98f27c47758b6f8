"""helpers.lowbit.fp8_lab: notebook 07's parameters and numerics (planted outliers, delayed scaling,
the panel, MX clipping)."""
import pytest
import torch

from helpers.lowbit import fp8_lab


def _acts(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(32, 256, generator=g) * torch.exp2(torch.randn(32, 1, generator=g))


def test_planted_outlier_is_left_out_of_the_error_and_the_order_appears():
    x = _acts()
    planted = fp8_lab.plant_outlier(x, 2.0 ** 14)
    mask = planted != x
    assert mask.sum() == 4 and mask[::8, 7].all()  # one channel, every eighth row
    rows = {r["recipe"]: r for r in fp8_lab.error_rows({"p": planted}, masks={"p": mask})}
    assert rows["tensorwise"]["row_rel_error"] > rows["rowwise"]["row_rel_error"] > rows["blockwise"]["row_rel_error"]
    sweep = fp8_lab.outlier_sweep(x, [0, 14])
    assert sweep["tensorwise"][1] > 2 * sweep["tensorwise"][0]  # a large outlier costs the rest dearly
    with pytest.raises(ValueError, match="magnitude"):
        fp8_lab.plant_outlier(x, 0.0)


def test_delayed_scaling_overflows_at_a_spike_that_current_scaling_absorbs():
    rows = fp8_lab.delayed_vs_current(_acts(), [1.0, 1.0, 16.0, 1.0, 2.0 ** -12, 2.0 ** -12], history_len=2)
    assert [r["current"]["overflow"] for r in rows] == [0] * 6
    assert rows[2]["delayed max"]["overflow"] > 0 and rows[1]["delayed max"]["overflow"] == 0
    # after the fall, 'max' still remembers the spike's neighbours one step longer than 'most_recent'
    assert rows[5]["delayed max"]["underflow"] >= rows[5]["delayed most_recent"]["underflow"]
    assert rows[4]["delayed most_recent"]["underflow"] > rows[4]["current"]["underflow"]


@pytest.mark.slow
def test_quant_panel_is_a_plain_callback(capsys):
    import matplotlib

    matplotlib.use("Agg")
    x = _acts(1)
    a = fp8_lab.quant_panel("blockwise", 64, 12, x=x)
    b = fp8_lab.quant_panel("tensorwise", 64, 12, x=x)
    out = capsys.readouterr().out
    assert "recipe=blockwise, block=64 (tiles of 1x64), log2_outlier=12" in out
    assert "recipe=tensorwise, block=64 (one scale per tensor), log2_outlier=12" in out
    assert b["row_rel_error"] > a["row_rel_error"]


@pytest.mark.notebook
def test_notebook_07_rejects_a_bad_outlier_at_once(tmp_path):
    import papermill as pm

    from tests.course.test_course_notebooks import NOTEBOOKS, _execute

    path = next(p for p in NOTEBOOKS if p.stem.startswith("07"))
    with pytest.raises(pm.PapermillExecutionError) as err:
        _execute(path, tmp_path, OUTLIER=0)
    assert err.value.ename == "ValueError" and "OUTLIER=0" in err.value.evalue


def test_mx_clipped_blocks_counts_the_blocks_whose_top_the_floor_rule_clamps():
    x = torch.ones(2, 64)
    x[0, 0], x[0, 40], x[1, 3] = 1.9, 1.8, 0.0  # 1.9: mantissa past 1.8125, clamped; 1.8: rounds to 448
    assert fp8_lab.mx_clipped_blocks(x) == (1, 4)
    assert fp8_lab.mx_clipped_blocks(torch.zeros(1, 32)) == (0, 0)


def test_the_parity_checks_run_the_matmul_they_are_given():
    """Notebook 07 passes its own cell's Float8Matmul: the layer must apply that one, not the module's."""
    from helpers.gpt.model import GPT, GPTConfig
    from helpers.lowbit import fp8_linear

    if why := fp8_linear.torchao_problem("tensorwise", "cpu"):
        pytest.skip(why)
    calls = []

    class Counted(fp8_linear.Float8Matmul):
        @staticmethod
        def forward(ctx, x, w, recipe, scalers):
            calls.append(recipe)
            return fp8_linear.Float8Matmul.forward(ctx, x, w, recipe, scalers)

    got = fp8_lab.linear_parity("tensorwise", matmul=Counted)
    assert calls == ["tensorwise", "tensorwise"] and got["recipe"] == "tensorwise"  # the check's run and the emulated one
    calls.clear()
    fp8_lab.linear_parity("tensorwise")
    assert calls == []  # without one, the module's own
    gpt = GPT(GPTConfig.preset("tiny"))
    x = torch.randint(0, gpt.config.vocab_size, (1, 16))
    fp8_lab.gpt_parity(gpt, x, x, "tensorwise", matmul=Counted)
    assert len(calls) == sum(isinstance(m, torch.nn.Linear) for n, m in gpt.named_modules() if n != "lm_head")


def test_the_takeaways_are_generated_from_the_numbers():
    row = {"recipe": "tensorwise", "dX": 0.0, "dW": 2e-7, "loss_diff": 0.0}
    kw = dict(parity=[row], gpt_parity=[row], parity_skip={}, ao_skip={"rowwise": "it does not run here."},
              torchao_version="0.0", device="cpu", outlier=4096.0,
              errors={"tensorwise": 0.04, "rowwise": 0.03, "blockwise": 0.02}, clean={"tensorwise": 0.026, "mx": 0.032},
              order_holds=True, clipped=0, blocks=8, worse=[12], log2s=[0, 12], history_len=8, spike=16.0,
              spike_row={"delayed max": {"overflow": 81}, "current": {"overflow": 0}},
              fall={"delayed max": 55, "current": 8}, steps=12, gaps={"ours tensorwise": -0.004}, baseline="fp32",
              reorder_gap=0.03, verdict={"claim_id": "fp8-2x-bf16", "verdict": "not testable", "reason": "no GPU"},
              no_speed="no FP8 tensor cores", largest_n=512, head=None, linear_ratio=None, gpt_ratio=None,
              matmul_ratio=None)
    lines = fp8_lab.takeaways(**kw)
    assert lines[0].startswith("- Built from scratch, our tensorwise Float8Linear equals torchao 0.0 bit for bit")
    assert "was identical." in lines[0]
    assert lines[1] == ("- torchao's rowwise recipe was not compared in the GPT and training runs (cpu): "
                        "it does not run here.")
    assert "(tensorwise >= rowwise >= blockwise held)" in lines[2] and "2^12 x amax" in lines[2]
    assert "saturated 81 entries" in lines[3] and lines[-1] == "- Speed: no FP8 tensor cores."
    lines = fp8_lab.takeaways(**(kw | {"order_holds": False, "worse": [], "torchao_version": None}))
    assert "(the predicted order did not hold)" in lines[1] and "never rose by 10% up to 2^12" in lines[1]
