"""helpers.attention.flash_lab: notebook 06's parameters, the correctness rule, the unchecked combinations, the
traffic verdict and the panel."""
import math
from contextlib import nullcontext

import matplotlib.pyplot as plt
import pytest
import torch

from helpers.attention import flash_lab, flash_speed_lab, kernels
from helpers.gpt.model import GPT, GPTConfig, naive_attention
from helpers.measure import params

RAW = dict(DTYPE="auto", SEQ_LENS=None, HEAD_DIMS=None, TOKENS=None, D_MODEL=None, MEMORY_SEQ_LENS=None,
           MEMORY_BUDGET_GB="auto", BLOCK_SIZES=None, PYTORCH_MAX_N=None, GPT_PRESET=None, GPT_BATCH=None, REPS=None,
           AUTOTUNE=None)


@pytest.fixture
def setup(tmp_path):
    return params.setup("smoke", 0, False, str(tmp_path), device="cpu")


def test_defaults_follow_the_profile(setup):
    p = flash_lab.resolve_parameters(setup, **RAW)
    assert p["DTYPE"] == "fp32" and p["TORCH_DTYPE"] == torch.float32 and len(p["SEQ_LENS"]) >= 3
    assert p["MEMORY_BUDGET_GB"] == 0.05 and p["REPS"] == 5 and p["GPT_PRESET"] == "tiny"


@pytest.mark.parametrize("name, value", [("REPS", 0), ("REPS", -2), ("TOKENS", 0), ("SEQ_LENS", []),
                                         ("SEQ_LENS", [128, 0]), ("HEAD_DIMS", [8]), ("HEAD_DIMS", [64, 256]),
                                         ("BLOCK_SIZES", [16, -1]), ("GPT_PRESET", "huge"), ("DTYPE", "fp8"),
                                         ("MEMORY_BUDGET_GB", 0), ("MEMORY_BUDGET_GB", "lots"), ("GPT_BATCH", 1.5)])
def test_a_bad_parameter_fails_at_once_naming_itself(setup, name, value):
    with pytest.raises(ValueError, match=name):
        flash_lab.resolve_parameters(setup, **(RAW | {name: value}))


def test_full_profile_sizes_keep_the_crossing_the_goal_and_the_wall(tmp_path):
    full = params.Setup(profile="full", device="cpu", seed=0, interactive=False, results_dir=tmp_path)
    p = flash_lab.resolve_parameters(full, **RAW)
    assert p["SEQ_LENS"] == [256, 1024, 4096, 16384] and p["HEAD_DIMS"] == [128] and p["PYTORCH_MAX_N"] == 1024
    assert sum(n >= flash_speed_lab.GOAL_MIN_N for n in p["SEQ_LENS"]) == 2  # the goal is measured at two N
    assert p["MEMORY_SEQ_LENS"] == [4096, 8192, 16384, 32768] and p["AUTOTUNE"] == "shortlist"
    naive_gib = [3 * 16 * n * n * 2 / 2**30 for n in p["MEMORY_SEQ_LENS"]]  # 16 heads of bf16 N x N buffers
    assert naive_gib[-1] > 80 and naive_gib[0] < 2  # fits at first, past an 80 GB GPU at last


def test_the_wall_reaches_past_any_gpu_only_on_one_larger_than_an_h200():
    assert flash_lab.wall_sizes(139.8) == [4096, 8192, 16384, 32768]  # an H200: naive ran out at 32768
    assert flash_lab.wall_sizes(None) == [4096, 8192, 16384, 32768]
    assert flash_lab.wall_sizes(178.0)[-2:] == [32768, 65536]  # 3 * 16 * 65536^2 * 2 bytes = 384 GiB: past any GPU


def test_use_autotune_says_what_the_autotuner_tries(monkeypatch):
    assert "not used" in flash_lab.use_autotune("shortlist")  # the interpreter: nothing autotuned
    monkeypatch.setattr(kernels.flash_triton, "TUNED", dict(kernels.flash_triton.autotuners(kernels.flash_triton.AUTOTUNE)))
    text = flash_lab.use_autotune("shortlist")
    assert text.startswith("Triton's autotuner tries 2 forward, 1 dK/dV and 1 dQ") and "compiles 4 kernels" in text
    assert "every configuration of flash_triton.AUTOTUNE (10 kernels per case)" in text
    text = flash_lab.use_autotune("all")
    assert "tries 4 forward, 3 dK/dV and 3 dQ" in text and "compiles 10 kernels" in text and "SHORTLIST" not in text
    with pytest.raises(ValueError, match="AUTOTUNE"):
        flash_lab.use_autotune("most")


def test_memory_budget_semantics(setup):
    assert flash_lab.resolve_parameters(setup, **(RAW | {"MEMORY_BUDGET_GB": None}))["MEMORY_BUDGET_GB"] is None
    assert flash_lab.resolve_parameters(setup, **(RAW | {"MEMORY_BUDGET_GB": 2}))["MEMORY_BUDGET_GB"] == 2.0


def test_traffic_verdict_names_the_tiles_that_move_more_than_naive():
    n, d = 256, 64
    naive = kernels.naive_traffic_bytes(n, d, 8, 4)
    traffic = [{"block": b, "bytes": kernels.tiled_traffic_bytes(n, d, b, 8, 4)} for b in (16, 32, 64)]
    text = flash_lab.traffic_verdict(traffic, naive, d)
    assert "B_r = 16 moved MORE" in text and "B_r = 32, 64 moved fewer" in text and "d/2 = 32" in text
    text = flash_lab.traffic_verdict(traffic[1:], naive, d)
    assert "MORE" not in text


def test_correctness_leaves_out_what_it_is_told_and_checks_a_precision_on_its_own_problem(monkeypatch):
    monkeypatch.setattr(kernels, "IMPLEMENTATIONS", ("naive", "sdpa_math", "flash_pytorch"))
    made, probed, make, probe = [], [], kernels.make_qkv, kernels._probe
    monkeypatch.setattr(kernels, "make_qkv", lambda *a, **kw: made.append(a[:4]) or make(*a, **kw))
    monkeypatch.setattr(kernels, "_probe", lambda impl, device, dtype: probed.append((impl, dtype)) or probe(impl, device, dtype))
    rows, checked, not_checked = flash_lab.correctness("cpu", (1, 2, 33, 16), False, shapes={"fp32": (1, 1, 20, 16)},
                                                       skip={("flash_pytorch", "fp16"): "left out here"})
    assert made == [(1, 1, 20, 16), (1, 2, 33, 16)]  # fp32 on its own problem, fp16 on the shared one; no bf16 units
    assert ("flash_pytorch", torch.float16) not in probed and ("flash_pytorch", torch.float32) in probed
    assert {(r[0], r[1]) for r in rows} == {("naive", "fp32"), ("sdpa_math", "fp32"), ("flash_pytorch", "fp32"),
                                            ("naive", "fp16"), ("sdpa_math", "fp16")}
    assert len(rows) == len(checked) == 10 and ("flash_pytorch", "fp16", True) not in checked  # x 2 causal flags
    text = flash_lab.not_checked_sentence(not_checked, only=("flash_pytorch",))
    assert text == "flash_pytorch: not checked in fp16 (left out here); in bf16 (this GPU has no bf16 units)"


@pytest.mark.slow
def test_gpt_kernels_times_a_slow_kernel_over_its_own_repetitions():
    torch.manual_seed(0)
    kernels.register_course_kernels()
    gpt = GPT(GPTConfig.preset("tiny"))
    idx, tgt = (torch.randint(0, gpt.config.vocab_size, (1, 32)) for _ in range(2))
    rows = flash_lab.gpt_kernels(gpt, idx, tgt, ["naive", "flash_pytorch"], device="cpu", reps=3, autocast=nullcontext,
                                 interpreted=set(), reps_of={"flash_pytorch": 1})
    assert rows["naive"]["reps"] == 3 and rows["flash_pytorch"]["reps"] == 1
    assert rows["naive"]["loss"] == pytest.approx(rows["flash_pytorch"]["loss"], rel=1e-5)


def test_not_checked_sentence_names_each_kernel_and_reason():
    missing = [("flash_triton", "bf16", "interpreter's bf16 is broken"), ("sdpa_cudnn", "fp32", "CUDA only")]
    text = flash_lab.not_checked_sentence(missing)
    assert text == "flash_triton: not checked in bf16 (interpreter's bf16 is broken)"
    assert "every course kernel" in flash_lab.not_checked_sentence([])


# ---------------------------------------------------------------- correctness rule, timing, speed, goal

def _problem(dtype):
    q, k, v = kernels.make_qkv(1, 2, 33, 16, dtype, "cpu", seed=4)
    return q, k, v, torch.randn(q.shape, generator=torch.Generator().manual_seed(5)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_compare_passes_a_correct_implementation(dtype):
    result = flash_lab.compare("flash_pytorch", *_problem(dtype), is_causal=True)
    assert result["passed"] and len(result["errors"]) == 4
    assert (result["naive"] is None) == (dtype == torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_compare_fails_an_implementation_that_is_slightly_off(monkeypatch, dtype):
    monkeypatch.setattr(kernels, "attention", lambda q, k, v, impl, causal: naive_attention(q, k, v, causal) * 1.01)
    result = flash_lab.compare("flash_pytorch", *_problem(dtype), is_causal=False)
    assert not result["passed"]


@pytest.mark.slow
def test_flash_panel_moves_with_its_controls(capsys):
    small = flash_lab.flash_panel(32, 1024, bandwidth_gbs=1000.0)
    first = capsys.readouterr().out
    large = flash_lab.flash_panel(128, 1024)
    second = capsys.readouterr().out
    assert "block 32" in first and "block 128" in second and first != second
    assert "floors at 1000 GB/s (model, not measured)" in first  # a prediction for the bandwidth given, said so
    y_small = small.axes[0].collections[0].get_offsets()[0][1]
    y_large = large.axes[0].collections[0].get_offsets()[0][1]
    assert y_large < y_small  # the marked point: less traffic with the larger block
    longer = flash_lab.flash_panel(128, 8192)
    assert longer.axes[1].lines[-1].get_xdata()[0] == 8192  # the marker line follows N
    assert math.isclose(small.axes[0].lines[0].get_ydata()[0], kernels.naive_traffic_bytes(1024, 64, 32) / 1e9)
    plt.close("all")


# ---------------------------------------------------------------- the notebook

def test_notebook_06_text_points_the_right_way_and_cites_in_words():
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "notebooks" / "06_flash_attention.ipynb"
    cells = json.loads(path.read_text())["cells"]
    for i, cell in enumerate(cells):
        text = "".join(cell["source"])
        if cell["cell_type"] != "markdown":
            continue
        if "next cell" in text.lower():
            assert cells[i + 1]["cell_type"] == "code", f"markdown cell {i} announces a next cell that is not code"
        assert "4d/B_r" not in text and "6N^2" not in text, "the traffic model is 2d/B_r N² against naive's 4N²"
        assert "`000`" not in text and "`003`" not in text and ".txt" not in text, "cite source texts in words"


def test_smoke_on_a_gpu_sweeps_the_head_dim_128_kernels(tmp_path, monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=141 * 2**30))
    monkeypatch.setattr(flash_lab.hardware, "capabilities", lambda: {"bf16": True})
    gpu = params.Setup(profile="smoke", device="cuda", seed=0, interactive=False, results_dir=tmp_path)
    cpu = params.Setup(profile="smoke", device="cpu", seed=0, interactive=False, results_dir=tmp_path)
    assert flash_lab.resolve_parameters(gpu, **RAW)["HEAD_DIMS"] == [128]
    assert flash_lab.resolve_parameters(cpu, **RAW)["HEAD_DIMS"] == [64]


def test_without_triton_the_kernel_cells_still_define_their_functions():
    triton = tl = flash_lab.NO_TRITON  # what notebook 06 binds where Triton is not installed

    @triton.jit
    def kernel(x, BLOCK: tl.constexpr):
        return x

    assert kernel(3, 4) == 3 and tl.constexpr is None
