"""helpers.lowbit.fp8_train_lab: notebook 07's training with FP8 and its speed measurements
(bookkeeping on a CPU; no timing is asserted)."""
import math

import pytest
import torch

from helpers.gpt.model import GPT, GPTConfig
from helpers.lowbit import fp8, fp8_linear, fp8_train_lab
from helpers.measure import bench, protocol


def _skip_unless_torchao_runs(recipe, device="cpu"):
    why = fp8_linear.torchao_problem(recipe, device)
    if why:
        pytest.skip(why)


def _tiny_batches(n=2):
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 256, (2, 16), generator=g), torch.randint(0, 256, (2, 16), generator=g)) for _ in range(n)]


def test_training_sentences_state_the_measured_gap():
    res = {"fp32": {"losses": [3.0, 2.0], "val_loss": 2.5}, "ours rowwise": {"losses": [3.0, 2.1], "val_loss": 2.6}}
    (line,) = fp8_train_lab.training_sentences(res, 1)
    assert "2.1000, +0.1000 vs fp32" in line and "validation 2.6000, +0.1000 (+4.00%)" in line


def test_the_baseline_comes_first_and_names_the_sentences():
    assert fp8_train_lab.train_variants("bf16")[0] == "bf16"
    assert fp8_train_lab.train_variants("fp32")[1:] == fp8_train_lab.TRAIN_VARIANTS[1:]
    with pytest.raises(ValueError, match="baseline"):
        fp8_train_lab.train_variants("fp16")
    res = {"bf16": {"losses": [3.0, 2.0], "val_loss": 2.5}, "ours rowwise": {"losses": [3.0, 2.1], "val_loss": 2.6}}
    assert "vs bf16" in fp8_train_lab.training_sentences(res, 1)[0]


@pytest.mark.slow
def test_training_under_bf16_autocast_keeps_fp32_master_weights():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", n_layer=1))
    fp8_linear.convert_to_float8(model, "rowwise")
    batches = [(torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))) for _ in range(2)]
    out = fp8_train_lab.train(model, batches, batches[:1], lr=1e-3, autocast=torch.bfloat16)
    assert len(out["losses"]) == 2 and all(math.isfinite(v) for v in out["losses"] + [out["val_loss"]])
    assert all(p.dtype == torch.float32 and p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.slow
def test_gpt_steps_times_every_variant_or_says_why():
    torch.manual_seed(0)
    base = GPT(GPTConfig(n_layer=1, n_head=2, d_model=32, d_ff=64, seq_len=16))
    x = torch.randint(0, 256, (2, 16))
    out = fp8_train_lab.gpt_steps(base, x, x, reps=1, compile=False, with_torchao=False)
    assert out["failed"] == [] and out["skipped"] == {} and set(out) == {"failed", "skipped", "iqr", "bf16", "ours rowwise"}
    assert all(out[v] > 0 for v in ("bf16", "ours rowwise"))
    assert next(base.parameters()).dtype == torch.float32  # the base model is left as it was


@pytest.mark.slow
def test_gpt_steps_compiles_each_block_not_the_whole_model(monkeypatch):
    compiled = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **k: compiled.append(type(self).__name__))
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("the whole model was compiled"))
    base = GPT(GPTConfig(n_layer=2, n_head=2, d_model=32, d_ff=64, seq_len=16))
    x = torch.randint(0, 256, (2, 16))
    out = fp8_train_lab.gpt_steps(base, x, x, reps=1, compile=True, with_torchao=False)
    assert out["failed"] == [] and out["bf16"] > 0 and out["ours rowwise"] > 0
    assert compiled == ["Block"] * 4  # two blocks in each of the two variants


@pytest.mark.slow
def test_gpt_steps_skips_just_the_torchao_recipe_that_cannot_run(monkeypatch):
    if fp8_linear.import_torchao()[0] is None:
        pytest.skip(fp8_linear.import_torchao()[1])
    why = "torchao's rowwise recipe does not run on cpu here."
    monkeypatch.setattr(fp8_linear, "_TORCHAO_PROBLEMS", {("rowwise", "cpu"): why})
    torch.manual_seed(0)
    base = GPT(GPTConfig(n_layer=1, n_head=2, d_model=32, d_ff=64, seq_len=16))
    x = torch.randint(0, 256, (2, 16))
    out = fp8_train_lab.gpt_steps(base, x, x, reps=1, compile=False, with_torchao=True)
    assert out["skipped"] == {"torchao rowwise": why} and "torchao rowwise" not in out
    assert out["bf16"] > 0 and out["ours rowwise"] > 0


def test_linear_profile_attributes_time_to_ops(tmp_path):
    prof = fp8_train_lab.linear_profile(64, "rowwise", "cpu", trace_dir=tmp_path, top=30)
    ops = [row[0] for row in prof.rows]
    refused = fp8_linear.scaled_mm_refusal("cpu")  # torch 2.11's CPU _scaled_mm takes per-tensor scales only
    sentences = fp8_train_lab.profile_sentences(prof, 64)
    if refused:  # the forward's rowwise product is the fp32 emulation: an aten::mm, said so in a sentence
        assert "aten::mm" in ops and len(sentences) == 2 and "emulated" in sentences[1] and refused.rstrip(".") in sentences[1]
    else:
        assert any("scaled_mm" in op for op in ops) and len(sentences) == 1 and "fp8 matmuls" in sentences[0]
    assert prof.trace_path.exists()
    assert 0.0 <= fp8_train_lab.cast_share(prof) < 1.0
    assert f"{fp8_train_lab.cast_share(prof):.0%} of the profiled CPU time" in sentences[0]


@pytest.mark.slow
def test_compiled_linears_each_get_their_graph_past_dynamos_recompile_limit(monkeypatch):
    # every compiled module shares Dynamo's recompile limit: without a reset per layer, those past it run eagerly
    graphs, real = [], torch.compile

    def counting(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm.forward
    monkeypatch.setattr(torch, "compile", lambda model: real(model, backend=counting))  # Dynamo only: cheap
    sizes = range(16, 16 * (torch._dynamo.config.recompile_limit + 3), 16)
    for n in sizes:
        assert fp8_train_lab.linear_tflops(n, "bf16", reps=1, compile=True, device="cpu") > 0
    assert len(graphs) == len(sizes)
    torch._dynamo.reset()


@pytest.mark.slow
def test_speed_sweep_leaves_out_just_the_torchao_recipe_that_cannot_run(monkeypatch):
    why = "torchao's rowwise recipe does not run on cuda here."
    monkeypatch.setattr(fp8_linear, "_TORCHAO_PROBLEMS", {("rowwise", "cuda"): why, ("tensorwise", "cuda"): None})
    monkeypatch.setattr(fp8_train_lab, "matmul_tflops", lambda n, kind, reps: float(n))  # no GPU needed: the bookkeeping only
    monkeypatch.setattr(fp8_train_lab, "linear_timing", lambda n, variant, reps, compile: _timing(6 * n ** 3 / (n * 1e9)))
    out = fp8_train_lab.speed_sweep([64, 128], 1, True, False)
    assert out["skipped"] == {"torchao rowwise": why} and out["failed"] == []
    assert list(out["linear"]) == ["bf16", "ours tensorwise", "ours rowwise", "torchao tensorwise"]
    assert out["linear"]["torchao tensorwise"] == pytest.approx([0.064, 0.128]) and out["matmul"]["rowwise"] == [64.0, 128.0]
    q25, q75 = out["linear_iqr"]["bf16"][1]
    assert q25 < 6 * 128 ** 2 / 1e9 < q75 and len(out["linear_iqr"]["bf16"]) == 2
    without = fp8_train_lab.speed_sweep([64], 1, False, False)
    assert without["skipped"] == {} and not any(v.startswith("torchao") for v in without["linear"])


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["tensorwise", "delayed", "rowwise"])
def test_our_emulated_training_matches_the_scaled_mm_path(recipe):
    # where torch._scaled_mm runs (the CPU), emulating it changes no bit with rowwise's power-of-two scales,
    # and at most fp32 rounding where a scale is not a power of two
    if fp8_linear.scaled_mm_refusal("cpu", rowwise=recipe == "rowwise"):
        pytest.skip("torch._scaled_mm refuses these scales on this CPU")
    torch.manual_seed(0)
    base = GPT(GPTConfig.preset("tiny", n_layer=1))
    runs = [fp8_train_lab.train(fp8_train_lab.make_variant(base, f"ours {recipe}", emulate=e)[0], _tiny_batches(),
                                _tiny_batches(1), lr=1e-3, emulate=e) for e in (False, True)]
    if recipe == "rowwise":
        assert runs[0] == runs[1]
    else:
        assert runs[0]["losses"] + [runs[0]["val_loss"]] == pytest.approx(runs[1]["losses"] + [runs[1]["val_loss"]],
                                                                         rel=1e-5, abs=0)


@pytest.mark.slow
def test_torchao_emulate_option_is_set_and_trains():
    _skip_unless_torchao_runs("rowwise")
    torch.manual_seed(0)
    model, _ = fp8_train_lab.make_variant(GPT(GPTConfig.preset("tiny", n_layer=1)), "torchao rowwise", emulate=True)
    converted = [m for m in model.modules() if type(m).__name__ == "Float8Linear"]
    assert converted and all(m.config.emulate for m in converted)
    out = fp8_train_lab.train(model, _tiny_batches(), _tiny_batches(1), lr=1e-3, emulate=True)
    assert all(math.isfinite(v) for v in out["losses"] + [out["val_loss"]])


def test_reference_kernel_cost_times_both_paths_or_says_none(monkeypatch):
    cost = fp8_train_lab.reference_kernel_cost(32, 64, 48, reps=2)
    if fp8_linear.scaled_mm_refusal("cpu", rowwise=False):
        assert cost is None
    else:
        assert len(cost["scaled_mm"].samples) == len(cost["emulated"].samples) == 2
        assert cost["ratio"].value == pytest.approx(cost["scaled_mm"].median / cost["emulated"].median)
    monkeypatch.setitem(fp8_linear._SCALED_MM_REFUSED, ("cpu", False, fp8.E4M3, fp8.E4M3, True), "refused.")
    assert fp8_train_lab.reference_kernel_cost(32, 64, 48, reps=2) is None


def test_the_matmul_headline_is_timed_by_the_protocol():
    # on a CPU torch._scaled_mm runs its reference kernel: slow, but the protocol's bookkeeping is the same
    if fp8_linear.scaled_mm_refusal("cpu", rowwise=False):
        pytest.skip("torch._scaled_mm refuses per-tensor scales on this CPU")
    r, c = fp8_train_lab.matmul_speedup(32, "tensorwise", reps=3, device="cpu")
    assert set(c.timings) == {"bf16", "tensorwise"} and 3 <= c.rounds <= 9
    assert r.value == pytest.approx(c["bf16"].median / c["tensorwise"].median) and r.lo <= r.value <= r.hi


def _timing(median, spread=0.02):
    return bench.Timing(median, median * (1 - spread), median * (1 + spread), [median] * 3)


def test_the_speed_claim_is_judged_by_the_rule_or_is_not_testable_with_its_range(results_tmp):
    def head(fp8_s, bf16_s=2.0, spread=0.02):
        return protocol.ratio(_timing(bf16_s, spread), _timing(fp8_s, spread)), None
    assert fp8_train_lab.speed_claim(head(1.0), 8192, 1.4, 1.2, None, quiet=True)["verdict"] == "supported"  # 2.0x
    row = fp8_train_lab.speed_claim(head(1.6), 8192, None, None, None, quiet=True)  # 1.25x, precisely below 1.7
    assert row["verdict"] == "contradicted" and row["spread"][0] < 1.25 < row["spread"][1]
    assert "linear fwd+bwd not measured" in row["measured"]
    assert fp8_train_lab.speed_claim(head(1.0, spread=0.3), 8192, None, None, None, quiet=True)["verdict"] == "not testable"
    row = fp8_train_lab.speed_claim(None, 512, None, None, "this device has no FP8 tensor cores", quiet=True)
    assert row["verdict"] == "not testable" and row["reason"] == "this device has no FP8 tensor cores"
    assert row["claimed"] == {"lo": 1.7, "hi": None, "above": "exceeded"} and row["unit"] == "x"


def test_faster_means_beyond_both_iqrs():
    assert fp8_train_lab.faster([1.0, 1.1], [1.2, 1.3]) and not fp8_train_lab.faster([1.0, 1.25], [1.2, 1.3])
    assert not fp8_train_lab.faster([1.2, 1.3], [1.0, 1.1]) and not fp8_train_lab.faster(None, [1.0, 1.1])


def test_the_reference_kernel_sentence_ranks_only_separated_costs_and_never_calls_them_fp8_speed():
    def cost(scaled_s, emulated_s, spread=0.02):
        a, b = _timing(scaled_s, spread), _timing(emulated_s, spread)
        return {"scaled_mm": a, "emulated": b, "ratio": protocol.ratio(a, b)}
    text = fp8_train_lab.reference_cost_sentence(cost(0.05, 0.001), "blocks.0.mlp.down")
    assert "Neither is FP8 speed" in text and "the emulation costs less" in text
    text = fp8_train_lab.reference_cost_sentence(cost(0.0011, 0.001, spread=0.2), "blocks.0.mlp.down")
    assert "cannot tell" in text and "costs less" not in text
    assert "refuses" in fp8_train_lab.reference_cost_sentence(None, "blocks.0.mlp.down")
