"""Notebook 14's serving ladder: each rung is built as it says, keeps the tokens it must keep, and its table and
sentences rank only what the spread allows."""
import dataclasses

import matplotlib
import pytest
import torch

from helpers.capstone import serve_stack_lab, serve_stack
from helpers.gpt import generation
from helpers.gpt.pretrained import pretrained
from helpers.lowbit.quant_linear import WeightOnlyLinear
from helpers.measure import params, protocol
from helpers.measure.bench import Timing

matplotlib.use("Agg")
PROMPT_LEN, N = 16, 12


@pytest.fixture(scope="module")
def models():
    """The shipped tiny course GPT and notebook 11's shipped one-layer draft (loaded, never trained here)."""
    target = pretrained("tiny", device="cpu", quiet=True).model
    draft = pretrained("tiny", device="cpu", quiet=True, n_layer=1, d_model=64, n_head=2, d_ff=256).model
    return target, draft


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(32, 127, (PROMPT_LEN,), generator=g) for _ in range(2)]


@pytest.fixture(scope="module")
def decoders(models):
    rungs, _ = serve_stack_lab.rungs_for("cpu", compile=False)
    return serve_stack.build(rungs, *models, max_len=PROMPT_LEN + N + 6, gamma=3)


def test_the_ladder_puts_each_rung_on_its_base_and_moves_int8_and_int4_to_bf16_without_compile():
    rungs, left = serve_stack.ladder("cpu")
    bases = {r.name: r.base for r in rungs}
    assert bases == {"baseline": None, "kv_cache": "baseline", "bf16": "kv_cache", "compile": "bf16", "int8": "compile",
                     "int4": "compile", "speculative": "bf16"} and left == {}
    assert {r.name: r for r in rungs}["int4"].techniques == {"kv_cache", "bf16", "compile", "int4"}
    rungs, left = serve_stack_lab.rungs_for("cpu", compile=False)
    assert {r.name: r.base for r in rungs}["int8"] == "bf16" and "COMPILE=False" in left["compile"]
    assert "int8" not in {r.name: r for r in rungs}["int4"].techniques


def test_the_ladder_refuses_unknown_repeated_and_cacheless_techniques():
    with pytest.raises(ValueError, match="choose one of"):
        serve_stack.ladder("cpu", ["kv_cache", "paged"])
    with pytest.raises(ValueError, match="names one twice"):
        serve_stack.ladder("cpu", ["kv_cache", "kv_cache"])
    with pytest.raises(ValueError, match="keep 'kv_cache'"):
        serve_stack.ladder("cpu", ["bf16"])


def test_each_rung_decodes_with_what_it_says(decoders):
    assert next(decoders["baseline"].model.parameters()).dtype == torch.float32 and decoders["baseline"].weight_bytes is None
    assert next(decoders["kv_cache"].model.parameters()).dtype == torch.float32
    bf16 = decoders["bf16"].model
    assert next(bf16.parameters()).dtype == torch.bfloat16 and decoders["speculative"].model is bf16
    for name, bits in (("int8", 8), ("int4", 4)):
        linears = [m for m in decoders[name].model.modules() if isinstance(m, WeightOnlyLinear)]
        assert linears and all(m.bits == bits for m in linears)
        assert not any(isinstance(m, torch.nn.Linear) for m in decoders[name].model.blocks.modules())
    wb = {n: decoders[n].weight_bytes for n in ("kv_cache", "bf16", "int8", "int4")}
    assert wb["kv_cache"] == 2 * wb["bf16"] and wb["bf16"] > wb["int8"] > wb["int4"]
    assert decoders["bf16"].kv_bytes_per_token * 2 == decoders["kv_cache"].kv_bytes_per_token


def test_the_static_cache_decodes_the_same_tokens_as_the_dynamic_one_and_is_reused(models, prompts):
    target = models[0].float().eval()
    gen = serve_stack.static_decoder(target, PROMPT_LEN + N, compiled=False)
    want = generation.generate(target, prompts[0], N)[0]
    assert torch.equal(gen(prompts[0], N), want)
    gen(prompts[1], N)
    assert torch.equal(gen(prompts[0], N), want)  # a second call resets the cache's position
    with pytest.raises(ValueError, match="pass the static cache"):
        gen(prompts[0], N + 1)


def test_the_exact_rungs_keep_the_tokens_and_a_planted_wrong_rung_is_caught(decoders, prompts):
    ex = serve_stack_lab.exactness(decoders, prompts, N)
    assert all(ex[n]["exact_ok"] for n in serve_stack.EXACT if n in ex)
    assert ex["kv_cache"]["identical"] == len(prompts) and ex["baseline"]["agreement"] == 1.0
    assert ex["int8"]["exact_ok"] is None and 0 < ex["int4"]["agreement"] <= 1
    wrong = dict(decoders)
    good = decoders["kv_cache"].generate
    wrong["kv_cache"] = dataclasses.replace(decoders["kv_cache"], generate=lambda p, n: (good(p, n) + 1) % 256)
    bad = serve_stack_lab.exactness(wrong, prompts, N)["kv_cache"]
    assert bad["exact_ok"] is False and bad["differences"][0]["index"] == 0 and not bad["differences"][0]["tie"]
    assert "NOT at a tie" in serve_stack_lab.exact_sentence(_row("kv_cache", "baseline", _t(1.0), _t(1.0), bad))


def test_tie_tolerance_is_fp32_rounding_or_four_bf16_ulps():
    assert serve_stack.tie_tolerance(12.0, torch.float32) == 1e-4
    assert serve_stack.tie_tolerance(12.0, torch.bfloat16) == 4 * 2.0 ** (3 - 7)
    assert serve_stack.tie_tolerance(-0.75, torch.bfloat16) == 4 * 2.0 ** (-1 - 7)
    with pytest.raises(ValueError):
        serve_stack.tie_tolerance(1.0, torch.float16)


def test_agreement_is_one_for_a_model_given_its_own_greedy_text(models, prompts):
    target = models[0].float().eval()
    assert serve_stack.agreement(target, prompts[0], generation.generate(target, prompts[0], N)[0]) == 1.0
    assert serve_stack.first_difference(target, prompts[0], torch.zeros(3, dtype=torch.long),
                                        torch.zeros(3, dtype=torch.long)) is None


def test_weight_only_refuses_other_widths(models):
    with pytest.raises(ValueError, match="8 or 4"):
        serve_stack.weight_only(models[0], 2)


def test_a_speculative_rung_needs_a_draft_of_the_same_vocabulary(models):
    rungs, _ = serve_stack_lab.rungs_for("cpu", compile=False)
    with pytest.raises(ValueError, match="needs a draft"):
        serve_stack.build(rungs, models[0], None, max_len=40)


def test_the_held_out_gaps_are_against_the_fp32_model(decoders):
    from helpers.gpt import data

    held = serve_stack_lab.held_out(decoders, data.load_corpus("val"), batches=1, seq_len=64)
    assert held["baseline"]["gap"] == 0.0 and held["kv_cache"] is held["baseline"]  # one fp32 model
    assert held["speculative"] is held["bf16"] and held["int4"]["windows"].numel() == 8


def _t(median, spread=0.02):
    return Timing(median, median * (1 - spread), median * (1 + spread), [median] * 5)


def _row(name, base, timing, base_timing, check, loss_gap=0.0):
    return {"rung": name, "title": serve_stack.TITLES[name], "base": base, "timing": timing, "ms_per_token": 1.0,
            "tokens_per_s": 1000.0, "gbps": None, "copy_share": None, "identical": check["identical"],
            "prompts": len(check["tokens"]), "exact_ok": check["exact_ok"], "agreement": check["agreement"],
            "differences": check["differences"], "loss": 1.0, "loss_gap": loss_gap, "loss_se": 0.001,
            "loss_separated": abs(loss_gap) > 0.002,
            "gain": None if base is None else protocol.ratio(base_timing, timing),
            "cumulative": protocol.ratio(base_timing, timing)}


def test_rows_take_each_gain_over_the_rung_it_stands_on(decoders):
    names = list(decoders)
    times = {"baseline": 4.0, "kv_cache": 1.0, "bf16": 0.5, "int8": 0.4, "int4": 0.45, "speculative": 0.25}
    cmp = protocol.Comparison({n: _t(times[n]) for n in names}, {n: 3 for n in names}, 5, "max_reps")
    checks = {n: {"tokens": [torch.zeros(N)], "identical": 1, "exact_ok": True, "agreement": 1.0, "differences": [None]}
              for n in names}
    losses = {n: {"loss": 1.0, "gap": 0.0, "se": 0.0, "separated": False} for n in names}
    table = serve_stack_lab.rows(decoders, cmp, checks, losses, prompt_len=PROMPT_LEN, n=N, copy_gbps=10.0)
    by = {r["rung"]: r for r in table}
    assert by["int4"]["gain"].value == pytest.approx(0.5 / 0.45) and by["speculative"]["gain"].value == pytest.approx(2.0)
    assert by["int8"]["cumulative"].value == pytest.approx(10.0) and by["kv_cache"]["ms_per_token"] == pytest.approx(1e3 / N)
    assert by["baseline"]["gbps"] is None and by["speculative"]["gbps"] is None
    d = decoders["bf16"]
    assert by["bf16"]["gbps"] == pytest.approx((d.weight_bytes + (PROMPT_LEN + N / 2) * d.kv_bytes_per_token)
                                               / (0.5 / N) / 1e9)
    assert by["bf16"]["copy_share"] == pytest.approx(by["bf16"]["gbps"] / 10.0)
    assert "faster than bf16" in serve_stack_lab.gain_sentence(by["speculative"])
    rec = serve_stack_lab.record_metrics(table, {"speedup": 2.1, "speedup_range": (1.9, 2.3), "separated": True}, model="tiny",
                                   prompt_len=PROMPT_LEN, n=N, left_out={})
    assert [r["rung"] for r in rec["rungs"]] == names and rec["batching"]["lo"] == 1.9
    assert rec["rungs"][1]["q25_ms_per_token"] == pytest.approx(1e3 * 0.98 / N)
    fig = serve_stack_lab.waterfall(table)
    assert len(fig.axes[0].patches) == len(names)


def test_a_gain_sentence_ranks_only_separated_calls():
    check = {"tokens": [torch.zeros(1)], "identical": 1, "exact_ok": None, "agreement": 0.9, "differences": [None]}
    noisy = serve_stack_lab.gain_sentence(_row("bf16", "kv_cache", _t(0.95, 0.3), _t(1.0), check))
    assert "within the noise of kv_cache" in noisy and "faster" not in noisy
    assert "slower than kv_cache" in serve_stack_lab.gain_sentence(_row("bf16", "kv_cache", _t(2.0), _t(1.0), check))
    assert "90.0% of next tokens agree" in serve_stack_lab.exact_sentence(_row("int8", "bf16", _t(1.0), _t(1.0), check))


def test_the_serving_parameters_are_validated_at_once():
    S = params.Setup("smoke", "cpu", 0, False, None)
    kw = dict(SERVE_MODEL=None, DRAFT_WIDTH=None, PROMPTS=None, PROMPT_LEN=None, NEW_TOKENS=None, GAMMA=None,
              REQUESTS=None, EVAL_BATCHES=None)
    p = serve_stack_lab.resolve_parameters(S, **kw)
    assert p["MAX_LEN"] == 32 + 32 + 4 + 2 and p["SERVE_MODEL"] == "tiny"
    with pytest.raises(ValueError, match="passes tiny's seq_len=128"):
        serve_stack_lab.resolve_parameters(S, **{**kw, "NEW_TOKENS": 100})
    with pytest.raises(ValueError, match="even"):
        serve_stack_lab.resolve_parameters(S, **{**kw, "DRAFT_WIDTH": 65})
    with pytest.raises(ValueError, match="GAMMA"):
        serve_stack_lab.resolve_parameters(S, **{**kw, "GAMMA": 0})


def test_a_technique_alone_stands_on_the_fp32_cache_and_keeps_the_tokens_only_if_it_must(models, prompts):
    r = serve_stack.alone("speculative")
    assert r.name == "speculative alone" and r.base == "kv_cache" and r.techniques == {"kv_cache", "speculative"}
    with pytest.raises(ValueError):
        serve_stack.alone("kv_cache")
    rungs = {x.name: x for x in serve_stack.ladder("cpu")[0]}
    assert serve_stack.must_keep_tokens(rungs["compile"], rungs["bf16"]) and serve_stack.must_keep_tokens(r, rungs["kv_cache"])
    assert not serve_stack.must_keep_tokens(rungs["int8"], rungs["compile"])
    assert not serve_stack.must_keep_tokens(rungs["bf16"], rungs["kv_cache"])
    built = serve_stack.build([rungs["baseline"], rungs["kv_cache"], r, serve_stack.alone("int4")], *models, max_len=40)
    assert next(built["speculative alone"].model.parameters()).dtype == torch.float32
    assert next(built["speculative alone"].draft.parameters()).dtype == torch.float32
    ex = serve_stack_lab.exactness(built, prompts, N)
    assert ex["speculative alone"]["exact_ok"] and ex["int4 alone"]["exact_ok"] is None


def test_alone_sentences_give_the_bound_each_rung_is_held_to():
    check = {"tokens": [torch.zeros(1)], "identical": 1, "exact_ok": None, "agreement": 1.0, "differences": [None]}
    stack_row = _row("int8", "compile", _t(0.5), _t(1.0), check)
    row = {"technique": "int8", "alone": protocol.ratio(_t(1.0), _t(0.9)), "bound_alone": 3.6, "bound_stack": 1.8}
    s = serve_stack_lab.alone_sentence(row, stack_row)
    assert "it did better in the stack (2.00x on compile) than alone (1.11x)" in s and "at most 3.60x and 1.80x" in s
    assert "it reached 31% and 111% of those bounds." in s
    spec = {"technique": "speculative", "alone": protocol.ratio(_t(1.0), _t(0.5)), "passes_alone": 3.2,
            "passes_stack": 2.9, "gamma": 4}
    s = serve_stack_lab.alone_sentence(spec, _row("speculative", "bf16", _t(0.9, 0.3), _t(1.0), check))
    assert "3.20 tokens alone" in s and "2.90 in the stack (on bf16)" in s and "it did better alone" in s


def test_the_alone_comparison_times_each_technique_against_the_fp32_cache(models, decoders, prompts):
    alone = serve_stack.build([serve_stack.alone(t) for t in serve_stack_lab.ALONE], *models, max_len=PROMPT_LEN + N + 6,
                              gamma=3)
    rows = {r["technique"]: r for r in serve_stack_lab.alone_comparison(decoders, alone, prompts[0], N, "cpu", gamma=3,
                                                                  budget_s=0.5)}
    assert set(rows) == {"int8", "int4", "speculative"}
    assert rows["int8"]["bound_alone"] == pytest.approx(decoders["kv_cache"].weight_bytes / alone["int8 alone"].weight_bytes)
    assert rows["int4"]["bound_stack"] == pytest.approx(decoders["bf16"].weight_bytes / decoders["int4"].weight_bytes)
    assert 1 <= rows["speculative"]["passes_alone"] <= 4 and rows["speculative"]["gamma"] == 3


def test_smoke_on_cuda_walks_the_leave_one_out_stacks_and_a_cpu_smoke_run_does_not():
    from helpers.capstone import stack_lab

    kw = dict(MODEL=None, BATCH=None, SEQ_LEN=None, STEPS=None, WARMUP=None, MICRO_BATCHES=None, LR=None, COMPILE=None,
              LEAVE_ONE_OUT=None, SERVE_MODEL=None, DRAFT_WIDTH=None, PROMPTS=None, PROMPT_LEN=None, NEW_TOKENS=None,
              GAMMA=None, REQUESTS=None, EVAL_BATCHES=None)
    on = {(profile, device): stack_lab.resolve_parameters(params.Setup(profile, device, 0, False, None), **kw)
          for profile in ("smoke", "full") for device in ("cpu", "cuda")}
    assert [on[k]["LEAVE_ONE_OUT"] for k in sorted(on)] == [True, True, False, True]  # full cpu/cuda, smoke cpu/cuda
    assert on[("smoke", "cuda")]["COMPILE"] and not on[("smoke", "cpu")]["COMPILE"]


def test_batching_serves_one_mix_under_both_policies_on_the_same_memory(models, capsys):
    from helpers.decode import serving

    res = serve_stack_lab.batching(models[0], n_requests=4, repeats=2, seed=0)
    runs = res["runs"]
    assert set(runs) == set(serving.POLICIES) and res["num_blocks"] > 0
    assert res["speedup"] == pytest.approx(runs["continuous"].tokens_per_s / runs["static"].tokens_per_s)
    lo, hi = res["speedup_range"]
    assert lo <= res["speedup"] <= hi and isinstance(res["separated"], bool)
    assert 0 <= res["same_tokens"] <= 4 and f"{res['same_tokens']} of 4 requests" in res["sentence"]
    out = capsys.readouterr().out
    assert "tokens/s" in out and res["sentence"] in out
