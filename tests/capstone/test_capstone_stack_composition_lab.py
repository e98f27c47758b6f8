"""Notebook 14's "where each rung's step goes": ops sorted into the parts of a step, each rung profiled afresh,
and the sentence on why a technique's gain differs alone and in the stack."""
import pytest
import torch

from helpers.capstone import stack_composition_lab, stack
from helpers.gpt.model import GPTConfig
from helpers.measure import protocol
from helpers.measure.bench import Timing

CFG = GPTConfig(n_layer=2, n_head=2, d_model=32, d_ff=64, vocab_size=64, seq_len=16)


def _t(median, spread=0.02):
    return Timing(median, median * (1 - spread), median * (1 + spread), [median] * 5)


def test_step_part_sorts_ops_by_what_they_belong_to():
    part = stack_composition_lab.step_part
    assert part(["aten::mul_", "aten::_foreach_mul_", "Optimizer.step#AdamW.step"]) == "optimizer"
    assert part(["aten::mm", "autograd::engine::evaluate_function: MmBackward0"]) == "matmul"
    assert part(["aten::bmm", "aten::matmul"]) == "attention"  # only attention multiplies 4-D tensors
    assert part(["aten::_softmax", "aten::softmax"]) == "attention"
    assert part(["aten::empty", "aten::_scaled_dot_product_flash_attention_for_cpu"]) == "attention"
    assert part(["aten::copy_", "aten::_to_copy", "aten::to"]) == "casts"
    assert part(["aten::gelu"]) == "rest"


def test_category_shares_add_to_one_and_follow_the_callers():
    from helpers.measure import profiling

    a, b = torch.randn(128, 128), torch.randn(128, 128)

    def fn():
        with torch.profiler.record_function("Optimizer.step#Fake.step"):
            (a + b).relu_()
        return a @ b

    got = profiling.category_shares(fn, stack_composition_lab.step_part, steps=2)
    assert set(got.shares) <= {"matmul", "optimizer", "rest", "casts"} and {"matmul", "optimizer"} <= set(got.shares)
    assert sum(got.shares.values()) == pytest.approx(1.0) and got.ms_per_step > 0 and got.device == "cpu"
    with pytest.raises(ValueError):
        profiling.category_shares(fn, stack_composition_lab.step_part, steps=0)


def test_the_why_sentence_names_the_part_and_its_shares_and_ranks_only_separated_gains():
    from helpers.measure.profiling import Shares

    comp = {"baseline": Shares({"attention": 0.4, "rest": 0.6}, 10.0, "cpu"),
            "bf16": Shares({"attention": 0.2, "rest": 0.8}, 5.0, "cpu")}
    base = _t(1.0)
    less = stack_composition_lab.why_sentence("sdpa", "bf16", comp, protocol.ratio(base, _t(0.5)), protocol.ratio(base, _t(0.9)))
    assert "acts on attention: 40% of the baseline's step, 20% of the step of the rung it joined (bf16)" in less
    assert "bought less in the stack (1.11x against 2.00x alone), so it had less to act on" in less
    more = stack_composition_lab.why_sentence("compile", "bf16", comp, protocol.ratio(base, _t(0.9)), protocol.ratio(base, _t(0.5)))
    assert "bought more in the stack" in more and "so it had more to act on in the stack" in more
    same = stack_composition_lab.why_sentence("sdpa", "bf16", comp, protocol.ratio(base, _t(0.9, 0.3)), protocol.ratio(base, _t(0.8, 0.3)))
    assert "no interaction" in same
    assert "the number of micro-steps" in stack_composition_lab.why_sentence("checkpoint", "bf16", comp, protocol.ratio(base, _t(0.9, 0.3)),
                                                                      protocol.ratio(base, _t(0.8, 0.3)))


def test_composition_profiles_each_rung_built_afresh():
    rungs = stack.ladder("cpu", ["sdpa", "fused_adamw"])
    g = torch.Generator().manual_seed(0)
    batch = (torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g))
    comp = stack_composition_lab.composition(CFG, rungs, batch, "cpu", micro_batches=2, lr=1e-3, steps=1)
    assert list(comp) == ["baseline", "sdpa", "fused_adamw"]
    assert all(sum(c.shares.values()) == pytest.approx(1.0) for c in comp.values())
    assert all(comp[n].shares["optimizer"] > 0 and comp[n].shares["matmul"] > 0 for n in comp)
