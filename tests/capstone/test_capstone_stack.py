"""The training ladder's rungs are what they say (read on the built objects, never timed), every rung trains
the same function from the same weights, and a device that cannot run a technique says why."""
import pytest
import torch

from helpers.capstone import stack
from helpers.gpt.model import GPTConfig

CFG = GPTConfig(n_layer=2, n_head=2, d_model=32, d_ff=64, vocab_size=64, seq_len=16)


def _batches(n=2, b=4):
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 64, (b, 16), generator=g), torch.randint(0, 64, (b, 16), generator=g)) for _ in range(n)]


def test_the_cpu_ladder_adds_one_technique_per_rung_and_names_what_it_cannot_run():
    rungs = stack.ladder("cpu")
    assert [r.name for r in rungs] == ["baseline", "bf16", "sdpa", "fused_adamw", "compile", "data_path", "checkpoint"]
    assert all(rungs[i].techniques < rungs[i + 1].techniques for i in range(len(rungs) - 1))
    assert len(rungs[-1].techniques) == len(rungs) - 1
    assert set(rungs[-1].skipped) == {"tf32", "fp8"} and "compute capability 8.9" in rungs[-1].skipped["fp8"]
    with pytest.raises(ValueError, match="names one twice"):
        stack.ladder("cpu", ["bf16", "bf16"])
    with pytest.raises(ValueError, match="choose one of"):
        stack.unavailable("fp4", "cpu")


@pytest.mark.parametrize("technique, field, baseline, value", [
    ("sdpa", "attn_impl", "naive", "sdpa"), ("fused_adamw", "adamw", {"foreach": False}, {"fused": True}),
    ("bf16", "autocast", None, torch.bfloat16), ("fp8", "fp8", False, True), ("compile", "compile", False, True),
    ("checkpoint", "checkpoint", False, True), ("checkpoint", "micro_batches", 4, 1)])
def test_each_technique_changes_its_one_field(technique, field, baseline, value):
    base, one = stack.settings(set(), 4), stack.settings({technique}, 4)
    assert base[field] == baseline and one[field] == value
    assert {k for k in base if base[k] != one[k]} == ({"checkpoint", "micro_batches"} if technique == "checkpoint"
                                                      else {field})
    with pytest.raises(ValueError, match="unknown technique"):
        stack.settings({"fp4"}, 4)


def test_each_rung_is_built_as_it_says():
    for rung in stack.ladder("cpu"):
        b = stack.build(CFG, rung, "cpu", micro_batches=2)
        assert b.model.attn_impl == ("sdpa" if rung.has("sdpa") else "naive")
        assert b.optimizer.defaults["fused"] is (True if rung.has("fused_adamw") else None)
        assert b.optimizer.defaults["foreach"] is (None if rung.has("fused_adamw") else False)
        assert b.autocast == (torch.bfloat16 if rung.has("bf16") else None)
        assert b.model.checkpointed_layers == ([0, 1] if rung.has("checkpoint") else [])
        assert b.micro_batches == (1 if rung.has("checkpoint") else 2)
        assert stack.compiled(b.model) == rung.has("compile")


def test_a_rung_holding_what_the_device_cannot_run_is_refused():
    with pytest.raises(RuntimeError, match="fp8, which cpu cannot run"):
        stack.build(CFG, stack.Rung("fp8", frozenset({"fp8"})), "cpu")


def test_every_fp32_rung_trains_the_same_function_from_the_same_weights():
    # naive vs SDPA attention, for-loop vs fused AdamW, 2 micro-batches vs the whole batch recomputed: the
    # same losses over three steps, to fp32 rounding (parameters are not compared: Adam divides by the root
    # of tiny second moments, so a rounding-sized gradient difference can move a weight by a whole lr)
    ends = {}
    for rung in [stack.Rung("baseline", frozenset()), stack.Rung("sdpa", frozenset({"sdpa"})),
                 stack.Rung("fused", frozenset({"sdpa", "fused_adamw"})),
                 stack.Rung("checkpoint", frozenset({"sdpa", "fused_adamw", "checkpoint"}))]:
        b = stack.build(CFG, rung, "cpu", micro_batches=2, lr=1e-2)
        ends[rung.name] = [b.step(x, y) for x, y in stack.batches(b, _batches(3), "cpu")]
    base_losses = ends.pop("baseline")
    for name, losses in ends.items():
        assert losses == pytest.approx(base_losses, rel=1e-5), name
    assert all(0 < v < 10 for v in base_losses)


def test_the_data_path_hands_over_the_same_batches_in_the_same_order():
    data = _batches(3)
    b = stack.build(CFG, stack.Rung("data_path", frozenset({"data_path"})), "cpu")
    got = list(stack.batches(b, data, "cpu"))
    assert len(got) == 3 and all(torch.equal(x, dx) and torch.equal(y, dy) for (x, y), (dx, dy) in zip(got, data))


def test_tf32_is_switched_for_the_block_only():
    before = torch.backends.cuda.matmul.allow_tf32
    with stack.tf32(not before):
        assert torch.backends.cuda.matmul.allow_tf32 is (not before)
    assert torch.backends.cuda.matmul.allow_tf32 is before


def test_the_triton_attention_row_stands_in_for_sdpa_and_says_why_a_cpu_cannot_run_it():
    assert stack.settings({"bf16", "triton_attention"}, 2)["attn_impl"] == "flash_triton"
    with pytest.raises(ValueError, match="two attention kernels"):
        stack.settings({"sdpa", "triton_attention"}, 2)
    assert "interpreter" in stack.unavailable("triton_attention", "cpu")
    assert "triton_attention" not in [r.name for r in stack.ladder("cpu")]
