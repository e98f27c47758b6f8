"""Notebook 14's measurements: the ladder's bookkeeping, and sentences that rank only what the spread allows."""
import matplotlib
import pytest
import torch

from helpers.capstone import stack_composition_lab, stack_lab, stack
from helpers.gpt.model import GPTConfig
from helpers.measure import bench, claims, protocol
from helpers.measure.bench import Timing

matplotlib.use("Agg")
CFG = GPTConfig(n_layer=2, n_head=2, d_model=32, d_ff=64, vocab_size=64, seq_len=16)


def _t(median, spread=0.02):
    return Timing(median, median * (1 - spread), median * (1 + spread), [median] * 5)


def _row(name, timing, prev=None, base=None, gap=0.0, precision="fp32"):
    return {"rung": name, "title": stack.TITLES.get(name, "baseline"), "timing": timing, "tokens_per_s": 1000 / timing.median,
            "loss": 4.0, "loss_gap": gap, "precision": precision, "within": abs(gap) <= stack_lab.TOLERANCE[precision],
            "steady": True, "gain": None if prev is None else protocol.ratio(prev, timing),
            "cumulative": protocol.ratio(base or timing, timing), "mfu": None, "peak_bytes": None}


def test_a_rung_sentence_ranks_only_separated_step_times():
    base = _t(1.0)
    assert "1.43x (IQR-bounded" in stack_lab.rung_sentence(_row("sdpa", _t(0.7), base, base)) and \
        "faster than the rung before" in stack_lab.rung_sentence(_row("sdpa", _t(0.7), base, base))
    noisy = stack_lab.rung_sentence(_row("sdpa", _t(0.95, 0.3), base, base))
    assert "within the noise" in noisy and "faster" not in noisy
    slower = stack_lab.rung_sentence(_row("fused_adamw", _t(1.5), base, base))
    assert "slower than the rung before" in slower
    assert "OUTSIDE the 2e-02 allowed for bf16" in stack_lab.rung_sentence(
        _row("bf16", _t(0.5), base, base, gap=0.05, precision="bf16"))


def test_the_multiply_sentence_tells_apart_only_ranges_that_do_not_overlap():
    base = _t(1.0)
    table = [_row("baseline", base, base=base), _row("sdpa", _t(0.5), base, base), _row("checkpoint", _t(0.25), _t(0.5), base)]
    mult = [{"technique": "sdpa", "alone": protocol.ratio(base, _t(0.5))},
            {"technique": "checkpoint", "alone": protocol.ratio(base, _t(0.5))}]
    assert "cannot tell" in stack_composition_lab.multiply_sentence(mult, table)  # 2 x 2 = 4 = the stack's 4
    mult[1]["alone"] = protocol.ratio(base, _t(0.9))  # 2 x 1.1 = 2.2 < 4
    assert "the stack gave more than the product" in stack_composition_lab.multiply_sentence(mult, table)
    mult[1]["alone"] = protocol.ratio(base, _t(0.1))  # 2 x 10 = 20 > 4
    assert "the gains did not multiply" in stack_composition_lab.multiply_sentence(mult, table)


def test_the_ladder_runs_every_rung_on_the_same_batches_and_times_after_the_warm_up():
    g = torch.Generator().manual_seed(0)
    data = [(torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)) for _ in range(5)]
    rungs = [stack.Rung("baseline", frozenset()), stack.Rung("sdpa", frozenset({"sdpa"}))]
    res = stack_lab.run_ladder(CFG, rungs, data, "cpu", micro_batches=2, lr=1e-3, warmup=2)
    assert all(len(r["times"]) == 5 and len(r["timing"].samples) == 3 for r in res.values())
    assert all(r["timing"].clock == "thread" and len(r["timing"].wall) == 3 for r in res.values())  # the CPU's one clock
    assert res["sdpa"]["losses"] == pytest.approx(res["baseline"]["losses"], rel=1e-5)
    rows = stack_lab.rows(CFG, rungs, res, 4, 16, {"fp32": 1e12, "bf16": None})
    assert rows[0]["gain"] is None and rows[1]["within"] and 0 < rows[0]["mfu"] < 1
    assert rows[1]["cumulative"].value == pytest.approx(rows[1]["gain"].value)  # one rung on: cumulative is its gain
    fig = stack_lab.waterfall(rows)
    assert len(fig.axes[0].patches) == 2


def test_a_learning_rate_that_diverges_stops_the_ladder_at_once_naming_lr():
    g = torch.Generator().manual_seed(0)
    data = [(torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)) for _ in range(6)]
    rungs = [stack.Rung("baseline", frozenset()), stack.Rung("sdpa", frozenset({"sdpa"}))]
    with pytest.raises(ValueError, match=r"LR=1e\+30: the baseline's loss is (nan|inf) after [1-6] step"):
        stack_lab.run_ladder(CFG, rungs, data, "cpu", micro_batches=2, lr=1e30, warmup=2)


def test_the_panel_trains_the_ticked_stack_beside_the_baseline_and_leaves_out_what_cannot_run(capsys):
    g = torch.Generator().manual_seed(0)
    data = [(torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)) for _ in range(4)]
    update = stack_lab.stack_panel(CFG, data, "cpu", micro_batches=2, lr=1e-3, warmup=1)
    out = update(sdpa=True, fp8=True, bf16=False)
    text = capsys.readouterr().out
    assert "fp8: left out." in text and "your stack (sdpa):" in text and set(out) == {"baseline", "stack"}


def test_compile_is_left_out_with_its_reason_when_asked():
    rungs, left = stack_lab.rungs_for("cpu", compile=False)
    assert "compile" not in [r.name for r in rungs] and "COMPILE=False" in left["compile"]


def test_leave_one_out_takes_each_technique_out_of_the_whole_stack_once():
    rungs = stack.ladder("cpu")
    loo = stack_lab.leave_one_out(rungs)
    assert loo[0].name == "whole stack" and loo[0].techniques == rungs[-1].techniques
    assert [r.name for r in loo[1:]] == [f"without {t}" for t in stack.TECHNIQUES if rungs[-1].has(t)]
    assert all(r.techniques == rungs[-1].techniques - {r.name.removeprefix("without ")} for r in loo[1:])
    res = {"whole stack": {"timing": _t(1.0)}, "without sdpa": {"timing": _t(1.5)},
           "without bf16": {"timing": _t(1.0, 0.3)}, "without data_path": {"timing": _t(0.8)}}
    rows = {r["technique"]: r for r in stack_lab.leave_one_out_rows(res)}
    assert rows["sdpa"]["cost"].value == pytest.approx(1.5) and "1.50x (IQR-bounded" in rows["sdpa"]["sentence"]
    assert "within the noise" in rows["bf16"]["sentence"]
    assert "costs more than it saves" in rows["data_path"]["sentence"]


def _judged(row):
    """The verdict `claims.verdict` would record for one of stack_claims' rows (the one rule, or "not testable")."""
    if "verdict" in row:
        return row["verdict"]
    return claims.judge_interval(row["value"], *row["spread"], *row["claimed"])[0]


def test_stack_claims_judge_the_rung_in_the_stack_beside_the_isolated_verdict():
    base = _t(1.0)
    training = [_row("baseline", base, base=base), _row("bf16", _t(0.55), base, base), _row("sdpa", _t(0.5), _t(0.55), base)]
    serving = [_row("baseline", base, base=base), {"rung": "speculative", "gain": protocol.ratio(base, _t(0.4))}]
    iso = {"mixed-precision-speed": {"verdict": "supported", "measured": "bf16: step x1.8"}}
    left = {"training": {"fp8": "FP8 needs FP8 tensor cores", "compile": "left out by COMPILE=False"},
            "serving": {"compile": "a serving reason"}}
    on_gpu = {r["claim_id"]: r for r in stack_lab.stack_claims({"training": training, "serving": serving}, iso,
                                                                   "cuda", left)}
    assert set(on_gpu) == {c[0] for c in stack_lab.STACK_CLAIMS}
    assert all(r["claimed"] for r in on_gpu.values())  # recorded even where not testable: the report re-judges GPUs
    assert _judged(on_gpu["stack-mixed-precision-1-5-2x"]) == "supported"  # 1.82x, IQR-bounded 1.75-1.89x
    assert "alone (notebook 03): supported, measured bf16: step x1.8" in on_gpu["stack-mixed-precision-1-5-2x"]["measured"]
    assert _judged(on_gpu["stack-flash-2-4x"]) == "contradicted" and "notebook 06 has not" in on_gpu["stack-flash-2-4x"]["measured"]
    assert _judged(on_gpu["stack-speculative-2-3x"]) == "supported"
    assert on_gpu["stack-fp8-2x"]["verdict"] == "not testable" and "FP8 needs FP8 tensor cores" in on_gpu["stack-fp8-2x"]["reason"]
    assert "COMPILE=False" in on_gpu["stack-compile-1-5-2x"]["reason"]  # the training ladder's reason, not the serving one
    on_cpu = {r["claim_id"]: r for r in stack_lab.stack_claims({"training": training, "serving": serving}, iso,
                                                                   "cpu", left)}
    assert on_cpu["stack-mixed-precision-1-5-2x"]["verdict"] == "not testable"
    # as notebook 11 rules: on a CPU the small models' steps are per-call overhead, so the claim is not judged
    assert _judged(on_cpu["stack-speculative-2-3x"]) == "not testable"
    assert "notebook 11" in on_cpu["stack-speculative-2-3x"]["reason"]
    noisy = [_row("baseline", base, base=base), _row("bf16", _t(0.6, 0.3), base, base)]
    wide = stack_lab.stack_claims({"training": noisy, "serving": []}, {}, "cuda", left)[0]
    assert "verdict" not in wide and _judged(wide) == "not testable"  # the rule decides: a spread too wide to judge
    emulated = [_row("baseline", base, base=base), {**_row("bf16", _t(5.0), base, base), "gain": None,
                                                    "emulated": "bf16 is emulated on this CPU"}]
    row = stack_lab.stack_claims({"training": emulated, "serving": []}, {}, "cuda", left)[0]
    assert row["verdict"] == "not testable" and "bf16 is emulated" in row["reason"]


def test_a_planted_emulated_bf16_leaves_the_ladder_and_keeps_later_rungs_ranked(monkeypatch):
    from helpers.capstone import serve_stack
    from helpers.measure import hardware

    planted = "bf16 is emulated on this CPU (planted)"
    monkeypatch.setattr(hardware, "emulated", lambda dtype, device="cpu": planted if dtype == "bf16" else None)
    rungs, left = stack_lab.rungs_for("cpu", False)
    assert "bf16" not in [r.name for r in rungs] and planted in left["bf16"]
    assert not any(r.has("bf16") for r in rungs)  # every later rung trains in fp32: rankable
    serve, serve_left = serve_stack.ladder("cpu")
    by = {r.name: r for r in serve}
    assert "bf16" not in by and planted in serve_left["bf16"]
    assert by["compile"].base == "kv_cache" and by["speculative"].base == "kv_cache"
    assert not any(r.has("bf16") for r in serve)
    # a bf16 rung that does run (a hand-made ladder) gets no MFU and no gain; the next is ranked against the one before it
    base, emul, after = _t(1.0), _t(7.0), _t(0.5)
    res = {n: {"timing": t, "losses": [4.0] * 3, "steady": True, "peak_bytes": None}
           for n, t in (("baseline", base), ("bf16", emul), ("sdpa", after))}
    ladder = [stack.Rung("baseline", frozenset()), stack.Rung("bf16", frozenset({"bf16"})),
              stack.Rung("sdpa", frozenset({"sdpa"}))]
    rows = stack_lab.rows(CFG, ladder, res, 4, 16, {"fp32": 1e12, "bf16": 1e12})
    assert rows[1]["emulated"] == planted and rows[1]["mfu"] is None and rows[1]["gain"] is None
    assert rows[2]["mfu"] is not None and not rows[2]["emulated"]
    assert rows[2]["gain"].value == pytest.approx(2.0)  # against the baseline, not against the emulated rung's 7x
    held = stack_lab.rows(CFG, [*ladder[:2], stack.Rung("sdpa", frozenset({"bf16", "sdpa"}))], res, 4, 16, None)
    assert held[2]["emulated"] and held[2]["gain"] is None  # a rung that holds the emulated format is not ranked either
    assert "not ranked and no MFU" in stack_lab.rung_sentence(rows[1])
    assert stack_lab.target_rows(rows, [], None)[0]["why"] == "no bf16 rung"


def test_target_rows_measure_each_ratio_from_its_rungs_and_judge_only_beyond_its_range():
    base = _t(1.0)
    train = [_row("baseline", base, base=base), _row("bf16", _t(0.2), base, base, precision="bf16"),
             _row("fp8", _t(0.15), _t(0.2), base, precision="fp8")]
    train[1]["mfu"] = 0.55
    serve = [{"rung": "compile", "base": "bf16", "copy_share": 0.8, "gain": protocol.ratio(base, _t(0.5))},
             {"rung": "int4", "base": "compile", "copy_share": 0.6, "gain": protocol.ratio(base, _t(0.5, 0.1))}]
    rows = {r["target"]: r for r in stack_lab.target_rows(train, serve, {"speedup": 1.9, "speedup_range": (1.5, 2.3)})}
    assert len(rows) == len(stack_lab.TARGETS)
    mfu, fp8, ladder, bw, int4, spec, cb = rows.values()
    assert mfu["value"] == 0.55 and mfu["range"] is None and mfu["met"] is True
    assert fp8["value"] == pytest.approx(0.2 / 0.15) and fp8["met"] is True  # 1.33x, IQR-bounded 1.28-1.39x
    assert ladder["value"] == pytest.approx(1 / 0.15) and ladder["met"] is False
    assert bw["value"] == 0.8 and int4["value"] == pytest.approx(2.0) and int4["met"] is None  # 1.90-2.11x straddles 2
    assert spec["value"] is None and spec["met"] is None and spec["why"] == "no speculative rung"
    assert cb["range"] == (1.5, 2.3) and cb["met"] is None
    unjudged = stack_lab.target_rows(train, serve, None, judged=False)
    assert all(r["met"] is None for r in unjudged) and unjudged[0]["value"] == 0.55 and unjudged[-1]["value"] is None


def test_a_rung_above_its_ceiling_gets_no_mfu_and_a_spread_rung_says_so():
    base = _t(1.0)
    res = {"baseline": {"timing": base, "losses": [4.0] * 3, "steady": True, "peak_bytes": None},
           "sdpa": {"timing": _t(0.5, 0.8), "losses": [4.0] * 3, "steady": False, "peak_bytes": None}}
    rungs = [stack.Rung("baseline", frozenset()), stack.Rung("sdpa", frozenset({"sdpa"}))]
    rows = stack_lab.rows(CFG, rungs, res, 4, 16, {"fp32": 1.0, "bf16": 1.0})  # 1 FLOP/s: every MFU passes 100%
    assert all(r["mfu"] is None and r["mfu_above_ceiling"] for r in rows)
    assert "widely spread or still drifting" in stack_lab.rung_sentence(rows[1])
    assert "widely spread" not in stack_lab.rung_sentence(rows[0])

def test_the_attention_row_is_left_out_on_a_cpu_with_its_reason():
    rows, sentence = stack_lab.attention_rows(CFG, stack.ladder("cpu"), [], "cpu", micro_batches=2, lr=1e-3, warmup=1)
    assert rows is None and "not run" in sentence and "interpreter" in sentence


def test_multiply_rows_set_each_gain_alone_beside_its_gain_on_the_rung_it_joined():
    from helpers.measure.profiling import Shares

    rungs = [stack.Rung("baseline", frozenset()), stack.Rung("sdpa", frozenset({"sdpa"})),
             stack.Rung("fused_adamw", frozenset({"sdpa", "fused_adamw"}))]
    base = _t(1.0)
    table = [_row("baseline", base, base=base), _row("sdpa", _t(0.9), base, base), _row("fused_adamw", _t(0.8), _t(0.9), base)]
    alone = {"baseline": {"timing": base}, "sdpa alone": {"timing": _t(0.5)}, "fused_adamw alone": {"timing": _t(0.9)}}
    comp = {n: Shares({"attention": 0.4, "optimizer": 0.1, "rest": 0.5}, 10.0, "cpu") for n in ("baseline", "sdpa")}
    rows = stack_composition_lab.multiply_rows(rungs, table, alone, comp)
    assert [r["technique"] for r in rows] == ["sdpa", "fused_adamw"]
    assert rows[0]["alone"].value == pytest.approx(2.0) and rows[0]["in_stack"].value == pytest.approx(1 / 0.9)
    assert "bought less in the stack" in rows[0]["sentence"] and "the rung it joined (baseline)" in rows[0]["sentence"]
    assert "the rung it joined (sdpa)" in rows[1]["sentence"]


def test_interleaved_rungs_are_compared_step_by_step():
    slow = [1.0, 2.0, 1.0, 2.0, 1.0]  # a load that comes and goes slows step i of both rungs alike
    base = {"timing": Timing(*bench.quartiles(slow), slow), "interleaved": True}
    fast = {"timing": Timing(*bench.quartiles([x / 2 for x in slow]), [x / 2 for x in slow]), "interleaved": True}
    paired = stack_lab.step_ratio(base, fast)
    assert (paired.lo, paired.value, paired.hi) == pytest.approx((2.0, 2.0, 2.0)) and paired.separated
    apart = stack_lab.step_ratio({**base, "interleaved": False}, fast)  # rung after rung: quartiles against quartiles
    assert apart.lo < 1.5 and apart.hi > 3
