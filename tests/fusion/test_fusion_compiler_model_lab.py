"""helpers.fusion.compiler_model_lab: the course GPT's training step compiled equals eager, the modes that need
CUDA, the break-even counts and sentences, the training claim's verdicts and regional compilation's one graph
for all blocks. The GPT is notebook 09's smoke model, so that the notebook finds these graphs in Inductor's
on-disk cache. No test asserts a speed."""
import pytest
import torch

from helpers.fusion import compiler_lab, compiler_model_lab
from helpers.measure import bench, protocol


@pytest.mark.slow
def test_gpt_training_step_compiled_equals_eager(results_tmp):
    from helpers.gpt.model import GPTConfig

    cfg = GPTConfig.preset("tiny", n_layer=1, seq_len=32)  # notebook 09's smoke model, so its graphs are cached for it
    r = compiler_model_lab.train_step_compare(cfg, 4, reps=1, check_steps=2)  # asserts rtol 1e-4, atol 1e-5 itself
    assert len(r["losses"]) == 2 and all(abs(a - b) <= 1e-4 * abs(a) + 1e-5 for a, b in r["losses"])
    assert r["tokens"] == 4 * 32 and r["flops"] > 0 and r["first_step_s"] > 0
    assert 0 < compiler_model_lab.matmul_share(r["eager_step"], name="test_gpt_step") < 1  # the step is not only matmuls


def test_break_even_and_modes_that_need_cuda():
    assert compiler_model_lab.break_even_steps(10.0, 0.3, 0.1) == pytest.approx(50.0)
    assert compiler_model_lab.break_even_steps(10.0, 0.1, 0.2) is None  # never pays back
    with pytest.raises(ValueError):
        compiler_model_lab.break_even_steps(1.0, 0.0, 0.1)
    if not torch.cuda.is_available():
        from helpers.gpt.model import GPTConfig

        with pytest.raises(ValueError, match="needs CUDA"):
            compiler_model_lab.one_token_forward(GPTConfig.preset("tiny"), ["reduce-overhead"])


def test_modes_note_says_what_the_full_profile_leaves_out_on_cuda():
    note = compiler_model_lab.modes_note(["default", "reduce-overhead"], "cuda")  # the full profile's on CUDA
    assert note.startswith("Not timed in this run: max-autotune.") and "leaves max-autotune out" in note
    assert "MODES=['default', 'reduce-overhead', 'max-autotune']" in note
    assert compiler_model_lab.modes_note(["default"], "cuda").startswith("Not timed in this run: reduce-overhead, max-autotune.")
    assert compiler_model_lab.modes_note(list(compiler_lab.ALL_MODES), "cuda") == "" == compiler_model_lab.modes_note(["default"], "cpu")


def test_break_even_comes_from_the_median_ratio_and_never_when_not_faster():
    assert compiler_model_lab.break_even_from_ratio(10.0, 0.02, 2.0) == pytest.approx(1000)  # saves 10 ms per step
    assert compiler_model_lab.break_even_from_ratio(10.0, 0.02, 1.0) is None
    assert compiler_model_lab.break_even_from_ratio(10.0, 0.02, 0.9) is None
    assert compiler_model_lab.saved_per_call(0.02, 0.5) == pytest.approx(-0.02)
    with pytest.raises(ValueError, match="ratio"):
        compiler_model_lab.saved_per_call(0.02, 0.0)


def T(median, spread=0.1):
    """A planted Timing: the median with quartiles spread/2 either side."""
    return bench.Timing(median, median * (1 - spread / 2), median * (1 + spread / 2), [median] * 5)


def test_break_even_is_printed_only_when_the_ratio_is_separated_from_1():
    eager = T(0.010)
    straddles = protocol.ratio(T(0.010, 0.5), T(0.009, 0.5))  # IQRs overlap
    assert not straddles.separated
    text = compiler_model_lab.break_even_sentence(5.0, eager, straddles)
    assert "cannot tell" in text
    assert "pays back after" not in text
    faster = protocol.ratio(T(0.010), T(0.005))  # 2x, IQRs apart
    text = compiler_model_lab.break_even_sentence(5.0, eager, faster)
    assert "pays back after about 1,000 calls" in text and "between" in text  # 5 s / (10 ms * (1 - 1/2))
    slower = protocol.ratio(T(0.005), T(0.010))
    assert "never pays back" in compiler_model_lab.break_even_sentence(5.0, eager, slower, "steps")


def test_training_claim_is_judged_from_the_measured_step_and_not_testable_on_a_cpu():
    from helpers.measure import claims

    within = protocol.ratio(T(0.15, 0.2), T(0.10, 0.2))  # 1.5x, bounds about 1.23-1.83
    assert compiler_model_lab.training_claim(within, "cpu", 30.0)["verdict"] == "not testable"
    assert "CPU" in compiler_model_lab.training_claim(within, "cpu", 30.0)["reason"]
    assert compiler_model_lab.training_claim(within, "cuda", 30.0)["verdict"] == "supported"
    above = protocol.ratio(T(0.30), T(0.10))
    below = protocol.ratio(T(0.10), T(0.10))
    assert compiler_model_lab.training_claim(above, "cuda", 30.0)["verdict"] == "exceeded"
    assert compiler_model_lab.training_claim(below, "cuda", 30.0)["verdict"] == "contradicted"
    for r in (within, above, below):  # every verdict is one the ledger accepts
        kw = compiler_model_lab.training_claim(r, "cuda", 1.0)
        claims.verdict("pytorch2-training-1-41x", notebook="09", claim="c", source="s", quiet=True, **kw)


@pytest.mark.slow
def test_regional_compilation_traces_one_block_for_all(results_tmp):
    from helpers.gpt.model import GPTConfig

    cfg = GPTConfig.preset("tiny", n_layer=3, seq_len=16)
    reg = compiler_model_lab.regional_compare(cfg, 2, backend="aot_eager")  # asserts each loss equals eager's
    assert reg["each block"]["graphs"] == 1 and reg["whole model"]["graphs"] == 1
    assert sum(reg["whole model"]["nodes"]) > 2 * reg["each block"]["nodes"][0]  # the whole model holds 3 blocks
    text = compiler_model_lab.regional_sentence(reg, 3, "aot_eager", 12.0)
    assert "one graph of" in text and "all 3 blocks" in text and "12.0 s" in text
    with pytest.raises(ValueError, match="backend"):
        compiler_model_lab.regional_compare(cfg, 2, backend="tvm")
