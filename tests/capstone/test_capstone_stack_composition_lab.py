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


def test_the_takeaways_follow_the_numbers_and_rank_only_what_the_spread_allows():
    base, fast, tie = _t(1.0), _t(0.5), _t(0.98, 0.1)

    def row(name, timing, before, gap=0.0):
        gain = None if before is None else protocol.ratio(before, timing)
        return {"rung": name, "timing": timing, "tokens_per_s": 1000 / timing.median, "emulated": False,
                "cumulative": protocol.ratio(base, timing), "gain": gain, "loss_gap": gap}

    rows = [row("baseline", base, None), row("bf16", fast, base, 0.01), row("sdpa", _t(0.49, 0.1), fast, -0.02)]
    mult = [{"technique": "bf16", "alone": protocol.ratio(base, fast), "in_stack": protocol.ratio(base, fast)}]
    serving = [{"rung": "baseline", "timing": base, "tokens_per_s": 1.0, "ms_per_token": 1000.0,
                "cumulative": protocol.ratio(base, base)},
               {"rung": "kv_cache", "timing": fast, "tokens_per_s": 2.0, "ms_per_token": 500.0,
                "cumulative": protocol.ratio(base, fast)},
               {"rung": "bf16", "timing": _t(0.51), "tokens_per_s": 1.96, "ms_per_token": 510.0,
                "cumulative": protocol.ratio(base, _t(0.51))}]
    lines = stack_composition_lab.takeaways(rows, mult, None, serving, {"speedup": 1.5, "separated": True},
                                            {"fp8": "no FP8 units"}, "cpu")
    text = "\n".join(lines)
    assert "faster than the baseline beyond the spread" in lines[0] and "(1000 -> 2041 tokens/s)" in lines[0]
    assert "beyond the noise: bf16; slower: none; this run could not rank the other rung." in lines[1]
    assert "largest gap 2.00%" in lines[2]
    assert "Taken out of the whole stack" not in text  # leave-one-out did not run
    assert "the highest median was kv_cache's" in text and "bf16 within its spread, so this run cannot rank them" in text
    assert "Continuous batching served 1.50x" in text and text.endswith("Not on this device's ladder: fp8 (each said why above).")
    flat = [row("baseline", base, None), row("bf16", tie, base), row("sdpa", _t(0.97, 0.1), tie)]
    first = stack_composition_lab.takeaways(flat, mult, [], serving, {"speedup": 1.0, "separated": False}, {}, "cpu")
    assert "within the baseline's spread, so this run ranks no rung above the baseline" in first[0]
    assert "this run could rank none of them" in first[1] and first[-1].endswith("within the runs' spread.")


def test_the_combination_guide_reads_every_step_off_its_measured_rung():
    assert {t for _, t, _, _ in stack_composition_lab.GUIDE} == set(stack.TECHNIQUES)  # every rung has its step
    assert [s for s, *_ in stack_composition_lab.GUIDE] == sorted(s for s, *_ in stack_composition_lab.GUIDE)

    def row(name, gain, peak=None, emulated=None):
        return {"rung": name, "gain": gain, "peak_bytes": peak, "emulated": emulated}

    rows = [row("baseline", None, 4 * 2**20), row("bf16", protocol.Ratio(1.5, 1.4, 1.6, True), 3 * 2**20),
            row("sdpa", protocol.Ratio(1.02, 0.9, 1.1, False)), row("fused_adamw", protocol.Ratio(0.8, 0.7, 0.9, True)),
            row("checkpoint", None, emulated="bf16 is emulated here")]
    left = {t: f"{t} needs a GPU" for t in ("tf32", "fp8", "compile", "data_path")}
    guide = {g["technique"]: g for g in stack_composition_lab.guide_rows(rows, left)}
    assert guide["bf16"]["says"] == ("faster than the rung before: 1.50x (IQR-bounded 1.40-1.60x); "
                                     "peak memory 4 -> 3 MiB")
    assert guide["sdpa"]["says"].startswith("cannot tell: 1.02x") and "peak memory" not in guide["sdpa"]["says"]
    assert guide["fused_adamw"]["says"].startswith("slower than the rung before: 0.80x")
    assert guide["checkpoint"]["says"].startswith("not ranked here: bf16 is emulated here; peak memory not measured")
    assert guide["fp8"]["says"] == "not run here: fp8 needs a GPU" and not guide["fp8"]["measured"]
    with pytest.raises(ValueError, match="compile"):  # a step with neither a rung nor a reason
        stack_composition_lab.guide_rows(rows, {t: "x" for t in ("tf32", "fp8", "data_path")})
