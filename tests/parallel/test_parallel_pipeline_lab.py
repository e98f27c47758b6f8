"""Notebook 13's model parallelism on real gloo ranks (tensor parallelism against the dense layers, the pipeline
executed by both schedules), where a pipeline's idle time went, and the sentences and verdict on the bubble."""
import pytest

from helpers.measure import claims
from helpers.parallel import launch
from helpers.parallel import pipeline_lab as L


@pytest.mark.ranks
def test_tensor_parallel_equals_dense():
    out = launch.run_on_ranks(L.check_tensor_parallel, 2)[0]
    assert out["mlp"] <= 1e-5 and out["attention"] <= 1e-5


@pytest.mark.ranks
def test_pipeline_holds_what_the_schedule_says():
    rows = {(r["kind"], r["micro"]): r for r in launch.run_on_ranks(L.measure_pipeline, 2, [1, 4], 2.0, 2)[0]}
    assert rows[("gpipe", 4)]["peak_in_flight"] == [4, 4]
    assert rows[("1f1b", 4)]["peak_in_flight"] == [2, 1]
    assert all(0 <= r["bubble"] < 1 and r["runs"] == 2 and len(r["bubbles"]) == 2 for r in rows.values())
    # the schedule's own waiting can never be less than a stage's idle slots at the measured step times
    for r in rows.values():
        assert r["idle_ms"]["schedule"] >= 0.9 * 2 * (r["forward_ms"] + r["backward_ms"])


def _stage(t0, end, busy, wait=0.0, delivery=0.0, messages=0, peak=1):
    return {"busy_s": busy, "t0": t0, "end": end, "forward_s": 0.01, "backward_s": 0.02, "schedule_wait_s": wait,
            "delivery_s": delivery, "messages": messages, "peak_in_flight": peak}


def test_pipeline_row_splits_the_idle_time_exactly():
    # 2 stages, wall 0.10 s, busy 0.06 each: idle 0.08 = schedule 0.03 + 0.01 tail + delivery 0.02 + own 0.02
    run = [_stage(0.0, 0.10, 0.06, wait=0.03, delivery=0.01, messages=2),
           _stage(0.0, 0.09, 0.06, wait=0.0, delivery=0.01, messages=2)]
    r = L.pipeline_row("gpipe", 2, 2, [run, run])
    assert r["bubble"] == pytest.approx(0.4) and r["runs"] == 2
    assert r["idle_ms"] == pytest.approx({"schedule": 40.0, "delivery": 20.0, "own": 20.0})
    assert r["schedule_bubble"] == pytest.approx(0.04 / 0.16) and r["delay_ms"] == pytest.approx(5.0)
    assert r["formula"] == pytest.approx(1 / 3)


def _row(kind, bubble, formula=0.1, schedule=None, replay=None, spread=0.01, delivery=10.0):
    return {"kind": kind, "micro": 8, "stages": 2, "bubble": bubble, "bubble_q25": bubble - spread,
            "bubble_q75": bubble + spread, "formula": formula, "schedule_bubble": schedule or formula,
            "schedule_bubble_q25": (schedule or formula) - 0.001, "schedule_bubble_q75": (schedule or formula) + 0.001,
            "replay": replay if replay is not None else bubble, "replay_no_overhead": formula,
            "idle_ms": {"schedule": 60.0, "delivery": delivery, "own": 5.0}, "forward_ms": 10.0, "backward_ms": 20.0,
            "delay_ms": delivery / 16, "overhead_ms": 0.3, "runs": 5}


def test_bubble_sentences_flip_with_the_numbers():
    double = L.bubble_sentences([_row("gpipe", 0.2)])[0]
    assert "2.00x the formula's 0.100" in double and "they account for it" in double
    assert "the formula's (p-1)(F+B) per stage, over the 2 stages at the measured step times: 60.0 ms" in double
    assert "no gap to explain" in L.bubble_sentences([_row("gpipe", 0.105)])[0]
    assert "account for it" in L.bubble_sentences([_row("gpipe", 0.2, replay=0.16)])[0]  # 0.06 of a 0.1 gap
    short = L.bubble_sentences([_row("gpipe", 0.2, replay=0.14)])[0]
    assert "the rest of the gap is not explained by this run" in short
    over = L.bubble_sentences([_row("gpipe", 0.2, replay=0.27)])[0]
    assert "not all of them lay on the critical path" in over
    same = L.bubble_sentences([_row("gpipe", 0.15), _row("1f1b", 0.152)])[2]
    assert "within each other's spread" in same and "the same bubble" in same
    apart = L.bubble_sentences([_row("gpipe", 0.2, delivery=30.0), _row("1f1b", 0.15)])[2]
    assert "differ beyond their spread" in apart and "idled 20.0 ms longer (schedule +0.0 ms, delivery +20.0 ms" in apart
    assert "this machine's costs" in apart
    sched = {**_row("gpipe", 0.2), "idle_ms": {"schedule": 90.0, "delivery": 10.0, "own": 5.0}}
    assert "does not explain the difference" in L.bubble_sentences([sched, _row("1f1b", 0.15)])[2]


def test_bubble_claim_is_judged_by_the_one_rule_on_the_schedules_part():
    ok = L.bubble_claim([_row("gpipe", 0.2, schedule=0.105), _row("1f1b", 0.15)])
    assert ok["ratio"] == pytest.approx(1.05) and ok["raw_ratio"] == pytest.approx(2.0)
    assert ok["spread"] == pytest.approx((1.04, 1.06)) and "1.05x (IQR 1.04-1.06x)" in ok["measured"]
    judge = lambda c: claims.judge_interval(c["ratio"], *c["spread"], *c["claimed"], above="contradicted")[0]  # noqa: E731
    assert judge(ok) == "supported"
    assert judge(L.bubble_claim([_row("gpipe", 0.2, schedule=0.2)])) == "contradicted"  # twice the formula
    assert judge(L.bubble_claim([_row("gpipe", 0.2, schedule=0.05)])) == "contradicted"  # half of it


def test_a_shared_machine_withholds_the_schedules_ranking():
    rows = [_row("gpipe", 0.2, delivery=30.0), _row("1f1b", 0.15)]
    assert "differ beyond their spread" in L.bubble_sentences(rows)[2]
    held = L.bubble_sentences(rows, withheld="the probes ran 40%")[2]
    assert "not ranked by this run: the probes ran 40%" in held and "differ" not in held and "0.200 vs 0.150" in held
