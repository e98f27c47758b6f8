"""helpers.attention.flash_lab: notebook 06's parameters, the unchecked combinations, the figures and the traffic verdict."""
import matplotlib.pyplot as plt
import pytest
import torch

from helpers.attention import kernels as A
from helpers.attention import flash_lab as fnb
from helpers.measure import params

RAW = dict(DTYPE="auto", SEQ_LENS=None, HEAD_DIMS=None, TOKENS=None, D_MODEL=None, MEMORY_SEQ_LENS=None,
           MEMORY_BUDGET_GB="auto", BLOCK_SIZES=None, PYTORCH_MAX_N=None, GPT_PRESET=None, GPT_BATCH=None, REPS=None)


@pytest.fixture
def setup(tmp_path):
    return params.setup("smoke", 0, False, str(tmp_path), device="cpu")


def test_defaults_follow_the_profile(setup):
    p = fnb.resolve_parameters(setup, **RAW)
    assert p.dtype == "fp32" and p.torch_dtype == torch.float32 and len(p.seq_lens) >= 3
    assert p.memory_budget_gb == 0.05 and p.reps == 3 and p.gpt_preset == "tiny"


@pytest.mark.parametrize("name, value", [("REPS", 0), ("REPS", -2), ("TOKENS", 0), ("SEQ_LENS", []),
                                         ("SEQ_LENS", [128, 0]), ("HEAD_DIMS", [8]), ("HEAD_DIMS", [64, 256]),
                                         ("BLOCK_SIZES", [16, -1]), ("GPT_PRESET", "huge"), ("DTYPE", "fp8"),
                                         ("MEMORY_BUDGET_GB", 0), ("MEMORY_BUDGET_GB", "lots"), ("GPT_BATCH", 1.5)])
def test_a_bad_parameter_fails_at_once_naming_itself(setup, name, value):
    with pytest.raises(ValueError, match=name):
        fnb.resolve_parameters(setup, **(RAW | {name: value}))


def test_memory_budget_semantics(setup):
    assert fnb.resolve_parameters(setup, **(RAW | {"MEMORY_BUDGET_GB": None})).memory_budget_gb is None
    assert fnb.resolve_parameters(setup, **(RAW | {"MEMORY_BUDGET_GB": 2})).memory_budget_gb == 2.0


def test_traffic_verdict_names_the_tiles_that_move_more_than_naive():
    n, d = 256, 64
    naive = A.naive_traffic_bytes(n, d, 8, 4)
    traffic = [{"block": b, "bytes": A.tiled_traffic_bytes(n, d, b, 8, 4)} for b in (16, 32, 64)]
    text = fnb.traffic_verdict(traffic, naive, d)
    assert "B_r = 16 moved MORE" in text and "B_r = 32, 64 moved fewer" in text and "d/2 = 32" in text
    text = fnb.traffic_verdict(traffic[1:], naive, d)
    assert "MORE" not in text


def test_not_checked_sentence_names_each_kernel_and_reason():
    missing = [("flash_triton", "bf16", "interpreter's bf16 is broken"), ("sdpa_cudnn", "fp32", "CUDA only")]
    text = fnb.not_checked_sentence(missing)
    assert text == "flash_triton: not checked in bf16 (interpreter's bf16 is broken)"
    assert "every course kernel" in fnb.not_checked_sentence([])


def _speed_rows(ns):
    return [{"impl": "naive", "head_dim": 64, "causal": c, "n": n, "pass": p, "tflops": 1.0 + n / 100,
             "tflops_lo": 0.9 + n / 100, "tflops_hi": 1.2 + n / 100} for n in ns for c in (False, True) for p in ("fwd", "fwd+bwd")]


def test_two_sizes_give_a_table_and_three_give_figures_with_error_bars(capsys):
    assert fnb.speed_figures(_speed_rows([128, 256]), ["naive"], [128, 256], [64], "fp32") == []
    assert "a table, not a curve" in capsys.readouterr().out
    figs = fnb.speed_figures(_speed_rows([64, 128, 256]), ["naive"], [64, 128, 256], [64], "fp32")
    assert len(figs) == 2 and figs[0].axes[0].containers  # errorbar containers
    plt.close("all")


def test_memory_wall_figure_draws_the_wall_and_says_which_lines_coincide():
    rows = [{"impl": i, "n": n, "status": "ok" if (i != "naive" or n < 1024) else "exceeds budget (x)",
             "saved_bytes": (n * n if i == "naive" else n) if (i != "naive" or n < 1024) else None}
            for n in (256, 512, 1024) for i in ("naive", "sdpa", "flash_pytorch")]
    fig, notes = fnb.memory_wall_figure(rows, ["naive", "sdpa", "flash_pytorch"], [256, 512, 1024], heads=2,
                                        head_dim=64, itemsize=4, budget_gb=0.05, device="cpu", title="t")
    labels = [line.get_label() for line in fig.axes[0].lines]
    assert "budget" in labels and any(label.startswith("naive stops") for label in labels)
    assert notes == ["flash_pytorch's line lies exactly on sdpa's (the same bytes at every N); it is drawn dashed on top"]
    plt.close("all")


def test_notebook_06_text_points_the_right_way_and_cites_in_words():
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "notebooks" / "06_flash_attention.ipynb"
    cells = json.loads(path.read_text())["cells"]
    for i, cell in enumerate(cells):
        text = "".join(cell["source"])
        if cell["cell_type"] != "markdown":
            continue
        if "next cell" in text.lower():
            assert cells[i + 1]["cell_type"] == "code", f"markdown cell {i} announces a next cell that is not code"
        assert "4d/B_r" not in text and "6N^2" not in text, "the traffic model is 2d/B_r N² against naive's 4N²"
        assert "`000`" not in text and "`003`" not in text and ".txt" not in text, "cite source texts in words"
