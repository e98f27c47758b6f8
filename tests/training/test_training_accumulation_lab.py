"""helpers.training.accumulation_lab: measured rows and their memory, the sweep at one effective batch,
the panel and the sweep figure, the sweep's and the profile's sentences, and notebook 05's parameters."""
import json
import statistics
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import torch

from helpers.training import accumulation_lab, accumulation_profile_lab
from test_training_accumulation import model_and_batch


def test_measure_accumulation_memory_follows_micro_batch():
    m, _, _ = model_and_batch()
    opt = torch.optim.AdamW(m.parameters())
    small = accumulation_lab.measure_accumulation(m, opt, 1, 4, 16, reps=1, warmup=0, flops_per_token=1e6)
    large = accumulation_lab.measure_accumulation(m, opt, 4, 1, 16, reps=1, warmup=0)
    assert small["peak_bytes"] is None and large["peak_bytes"] is None  # no CUDA here
    assert large["saved_bytes"] == pytest.approx(4 * small["saved_bytes"], rel=0.05)
    assert small["tokens_per_s"] == pytest.approx(64 / small["seconds"])
    assert small["tflops"] == pytest.approx(1e6 * 64 / small["seconds"] / 1e12)
    assert accumulation_lab.memory_of(small) == (small["saved_bytes"] / 2**20, "activations saved per micro-batch (MiB)")
    assert accumulation_lab.memory_of({"peak_bytes": 2**21, "saved_bytes": 1})[0] == 2.0


def test_sweep_micro_batches_keeps_the_effective_batch():
    m, _, _ = model_and_batch()
    opt = torch.optim.AdamW(m.parameters())
    rows = accumulation_lab.sweep_micro_batches(m, opt, [1, 2, 4], 4, 16, reps=2, max_warmup=3, flops_per_token=1e6)
    assert [(r["micro_batch"], r["accum_steps"]) for r in rows] == [(1, 4), (2, 2), (4, 1)]
    assert all(r["tokens_per_s"] == pytest.approx(64 / r["seconds"]) for r in rows)
    assert rows[2]["saved_bytes"] == pytest.approx(4 * rows[0]["saved_bytes"], rel=0.05)
    with pytest.raises(ValueError, match="divide"):
        accumulation_lab.sweep_micro_batches(m, opt, [3], 4, 16)


@pytest.mark.slow
def test_accumulation_panel_reflects_the_controls(capsys):
    m, _, _ = model_and_batch()
    opt = torch.optim.AdamW(m.parameters())
    background = [accumulation_lab.measure_accumulation(m, opt, b, 4 // b, 16, reps=1, warmup=0) for b in (1, 2, 4)]
    fig = accumulation_lab.accumulation_panel(2, 3, model=m, optimizer=opt, seq_len=16, background=background, reps=1)
    ax_t, ax_m = fig.axes
    star = ax_m.collections[-1].get_offsets()[0]
    assert star[0] == 2 and star[1] == pytest.approx(background[1]["saved_bytes"] / 2**20, rel=0.05)
    assert list(ax_t.containers[0].lines[0].get_xdata()) == [1, 2, 4]  # the background sweep, with error bars
    assert ax_m.get_xscale() == "linear" and ax_m.get_yscale() == "linear"
    assert "micro-batch 2 x 3 steps = 6 sequences (96 tokens)" in capsys.readouterr().out
    fig4 = accumulation_lab.accumulation_panel(4, 1, model=m, optimizer=opt, seq_len=16, reps=1)
    assert fig4.axes[1].collections[-1].get_offsets()[0][1] > star[1]  # more memory at a bigger micro-batch
    plt.close("all")


def test_plot_sweep_has_iqr_bars_and_linear_memory_axes():
    """Memory grows linearly with b, so it is drawn on linear axes from 0; tokens/s carry IQR bars."""
    rows = [{"micro_batch": b, "tokens_per_s": 100.0 * b, "tokens_per_s_q25": 90.0 * b, "tokens_per_s_q75": 120.0 * b,
             "peak_bytes": None, "saved_bytes": b * 2**20} for b in (1, 2, 4, 8)]
    fig = accumulation_lab.plot_sweep(rows, "t")
    ax_t, ax_m = fig.axes
    assert ax_t.get_xscale() == "log" and ax_t.get_ylim()[0] == 0
    assert ax_m.get_xscale() == "linear" and ax_m.get_yscale() == "linear"
    assert ax_m.get_xlim()[0] == 0 and ax_m.get_ylim()[0] == 0
    assert list(ax_m.lines[0].get_ydata()) == [1.0, 2.0, 4.0, 8.0]
    bars = ax_t.containers[0]
    segments = bars.lines[2][0].get_segments()  # one vertical bar per point, from q25 to q75 of tokens/s
    assert [tuple(s[:, 1]) for s in segments] == [(90.0 * b, 120.0 * b) for b in (1, 2, 4, 8)]
    with pytest.raises(ValueError, match="no rows"):
        accumulation_lab.plot_sweep([], "t")
    plt.close("all")


@pytest.mark.slow
def test_rows_carry_the_quartiles_of_tokens_per_s():
    m, _, _ = model_and_batch()
    opt = torch.optim.AdamW(m.parameters())
    r = accumulation_lab.measure_accumulation(m, opt, 2, 2, 16, reps=4, warmup=0)
    assert r["tokens_per_s_q25"] == pytest.approx(64 / r["seconds_q75"])
    assert r["tokens_per_s_q25"] <= r["tokens_per_s"] <= r["tokens_per_s_q75"]


@pytest.mark.slow
def test_sweep_micro_batches_leaves_out_a_size_that_runs_out_of_memory(monkeypatch):
    m, _, _ = model_and_batch()
    opt = torch.optim.AdamW(m.parameters())
    prepare = accumulation_lab.prepared_step

    def failing_at_4(model, optimizer, micro_batch, *args):
        step, mbs = prepare(model, optimizer, micro_batch, *args)
        if micro_batch < 4:
            return step, mbs

        def step_out_of_memory():
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return step_out_of_memory, mbs
    monkeypatch.setattr(accumulation_lab, "prepared_step", failing_at_4)
    rows = accumulation_lab.sweep_micro_batches(m, opt, [1, 2, 4], 4, 16, reps=1, max_warmup=3)
    assert [r["micro_batch"] for r in rows] == [1, 2]


def _row(b, k, median, q25, q75, saved, of_ceiling=0.1):
    return {"micro_batch": b, "accum_steps": k, "tokens_per_s": median, "tokens_per_s_q25": q25,
            "tokens_per_s_q75": q75, "peak_bytes": None, "saved_bytes": saved, "of_ceiling": of_ceiling}


def test_sweep_summary_recommends_only_a_size_whose_iqr_clears_the_others_and_flags_a_ceiling_above_100_percent():
    apart = [_row(1, 4, 100, 95, 105, 2**20), _row(2, 2, 150, 140, 160, 2 * 2**20), _row(4, 1, 200, 190, 210, 4 * 2**20)]
    out, lines = accumulation_lab.sweep_summary(apart[::-1], 4)  # any order: the smallest micro-batch is compared with the best
    assert out["recommended_micro_batch"] == 4 and out["tied_micro_batches"] == []
    assert out["fastest_median_micro_batch"] == 4 and out["first_fraction_of_best"] == pytest.approx(0.5)
    assert not out["first_vs_best_within_noise"] and "beyond this run's noise" in lines[1]
    assert lines[2].startswith("recommended: b=4")
    assert out["smallest_b_within_10pct"] == 4 and "in proportion to b" in lines[4]
    assert not any("100%" in line for line in lines)
    close = [_row(1, 4, 190, 150, 230, 2**20), _row(2, 2, 200, 160, 240, 3 * 2**20, of_ceiling=1.2)]
    out, lines = accumulation_lab.sweep_summary(close, 4)
    assert out["first_vs_best_within_noise"] and "cannot tell b=1 from b=2" in lines[1]
    assert out["recommended_micro_batch"] is None and out["tied_micro_batches"] == [1, 2]
    assert "no micro-batch is recommended" in lines[2] and "b=1, 2 are within the noise of each other" in lines[2]
    assert "(b=1's tokens/s IQR 150-230 against b=2's 160-240)" in lines[2]
    assert out["smallest_b_within_10pct"] == 1
    assert out["memory_ratio_last_first"] == pytest.approx(3.0) and "more than in proportion to b (x2)" in lines[4]
    assert "b=[2] ran above 100%" in lines[-1] and "under-measured" in lines[-1]
    # the fastest median is separated from the smallest size but not from its neighbour: still no recommendation
    out, lines = accumulation_lab.sweep_summary([_row(1, 4, 100, 95, 105, 2**20), _row(2, 2, 190, 170, 205, 2**20),
                                                 _row(4, 1, 200, 185, 215, 2**20)], 4)
    assert not out["first_vs_best_within_noise"] and out["recommended_micro_batch"] is None
    assert out["tied_micro_batches"] == [2, 4] and out["smallest_b_within_10pct"] == 2
    out, lines = accumulation_lab.sweep_summary([_row(1, 2, 300, 290, 310, 2**20), _row(2, 1, 200, 190, 210, 2**20)], 2)
    assert out["recommended_micro_batch"] == 1 and "smallest micro-batch had the fastest median" in lines[1]
    assert "less than in proportion" in lines[4]
    out, lines = accumulation_lab.sweep_summary([_row(4, 1, 300, 290, 310, 2**20)], 4)
    assert "only one micro-batch size" in lines[1] and out["recommended_micro_batch"] is None
    with pytest.raises(ValueError, match="no rows"):
        accumulation_lab.sweep_summary([], 4)


@pytest.mark.parametrize("b4_seconds, recommended, tied", [(0.52, None, [2, 4]), (0.3, 4, [])],
                         ids=["overlapping", "separated"])
def test_the_sweep_withholds_a_recommendation_when_planted_step_times_overlap(monkeypatch, b4_seconds, recommended, tied):
    """Planted step times through the sweep's timer (no clock read): b=2 and b=4 within each other's noise give no
    recommendation, a clearly faster b=4 is recommended."""
    m, _, _ = model_and_batch()
    opt = torch.optim.AdamW(m.parameters())
    prepare, size_of = accumulation_lab.prepared_step, {}

    def remember(model, optimizer, micro_batch, *args):
        step, mbs = prepare(model, optimizer, micro_batch, *args)
        size_of[step] = micro_batch
        return step, mbs
    monkeypatch.setattr(accumulation_lab, "prepared_step", remember)
    median = {1: 1.0, 2: 0.5, 4: b4_seconds}
    calls, phase = {b: 0 for b in median}, {1: 0, 2: 0, 4: 1}

    def planted(fn):  # each size cycles through -10%, 0, +10% of its median; b=4 a round out of step with b=2
        b = size_of[fn]
        calls[b] += 1
        return median[b] * (0.9, 1.0, 1.1)[(calls[b] + phase[b]) % 3]
    rows = [r | {"of_ceiling": 0.1} for r in accumulation_lab.sweep_micro_batches(m, opt, [1, 2, 4], 4, 16, reps=5, timer=planted)]
    assert [r["seconds"] for r in rows] == pytest.approx([1.0, 0.5, b4_seconds])
    out, lines = accumulation_lab.sweep_summary(rows, 4)
    assert out["recommended_micro_batch"] == recommended and out["tied_micro_batches"] == tied
    assert ("no micro-batch is recommended" in lines[2]) == (recommended is None)


def test_a_load_that_slows_every_size_of_a_round_alike_does_not_hide_the_fastest():
    """Rows timed in the same rounds are ranked round by round: b=8's IQR overlaps b=16's because some rounds ran
    on a loaded machine, yet b=16 was faster in every round, so it is recommended; the same medians and IQRs without
    the rounds' samples are not ranked."""
    load = [1.0, 1.3, 1.0, 1.6, 1.1, 1.0, 1.4]  # what other work did to each round, alike for both sizes
    rows = []
    for b, seconds in ((8, 0.105), (16, 0.100)):
        samples = [seconds * x for x in load]
        q = sorted(samples)
        tokens = 16 * 64
        rows.append({**_row(b, 16 // b, tokens / seconds, tokens / q[5], tokens / q[1], b * 2**20),
                     "seconds_samples": samples})
    assert rows[0]["tokens_per_s_q75"] > rows[1]["tokens_per_s_q25"]  # the IQRs overlap
    out, lines = accumulation_lab.sweep_summary(rows, 16)
    assert out["recommended_micro_batch"] == 16 and not out["first_vs_best_within_noise"]
    assert out["step_first_over_last"] == pytest.approx((1.05, 1.05, 1.05))  # the load cancels round by round
    assert "b=8's step took 1.05x b=16's round by round (quartiles 1.05-1.05 over 7 interleaved rounds)" in lines[1]
    assert lines[2].endswith("beyond the noise (the nearest: b=8's step took 1.05x b=16's round by round "
                             "(quartiles 1.05-1.05 over 7 interleaved rounds))")
    unpaired = [{k: v for k, v in r.items() if k != "seconds_samples"} for r in rows]
    out, lines = accumulation_lab.sweep_summary(unpaired, 16)
    assert out["recommended_micro_batch"] is None and "b=8's tokens/s IQR" in lines[2]


def test_the_fastest_median_is_not_recommended_when_the_other_size_won_most_rounds():
    """b=2 has the faster median step, yet b=1 was faster in four rounds of five (one slow round of b=1's moved the
    medians): the per-round ratio's quartiles lie below 1, on the wrong side for b=2, so nothing is recommended."""
    times = {2: [2.0, 3.0, 4.0, 5.0, 1.0], 1: [1.9, 2.9, 3.9, 4.9, 10.0]}
    rates = {b: 1024 / statistics.median(t) for b, t in times.items()}
    rows = [{**_row(b, 2 // b, rates[b], rates[b], rates[b], b * 2**20), "seconds_samples": t} for b, t in times.items()]
    out, _ = accumulation_lab.sweep_summary(rows, 2)
    assert out["fastest_median_micro_batch"] == 2 and out["recommended_micro_batch"] is None
    assert out["tied_micro_batches"] == [1, 2]


@pytest.mark.slow
def test_profile_splits_counts_k_times_the_matmul_calls(results_tmp):
    m, _, _ = model_and_batch()
    opt = torch.optim.AdamW(m.parameters())
    rows = accumulation_profile_lab.profile_splits(m, opt, [(1, 4), (4, 1)], 16)
    small, big = rows
    assert small["matmul_calls"] == 4 * big["matmul_calls"] > 0  # the same FLOPs in k times the calls
    assert 0 < small["matmul_share"] <= 1 and small["matmul_ms"] <= small["total_ms"]
    assert len(small["profile"].rows) == 8 and small["profile"].trace_path.exists()
    assert small["profile"].trace_path.parent == results_tmp / "traces" and 0 < small["ran_share"] <= 1
    with pytest.raises(ValueError, match="splits"):
        accumulation_profile_lab.profile_splits(m, opt, [], 16)


def test_split_profile_lines_follow_the_numbers():
    def row(b, k, calls, mm, total, ran=1.0):
        return {"micro_batch": b, "accum_steps": k, "matmul_calls": calls, "matmul_ms": mm, "total_ms": total,
                "matmul_share": mm / total, "ran_share": ran}
    lines = accumulation_profile_lab.split_profile_lines([row(1, 16, 320, 30.0, 60.0), row(16, 1, 20, 10.0, 30.0)])
    assert lines[0] == "b=1 (k=16): 320 matmul calls per step, 30.0 ms in them = 50% of the 60.0 ms of op self time"
    assert "x16.0 as many matmul calls: matmul time x3.00, the other ops' time x1.50" in lines[2]
    assert "the matmuls themselves" in lines[3]
    lines = accumulation_profile_lab.split_profile_lines([row(1, 16, 320, 11.0, 60.0), row(16, 1, 20, 10.0, 30.0)])
    assert "the ops around the matmuls" in lines[3]
    lines = accumulation_profile_lab.split_profile_lines([row(1, 16, 320, 10.5, 31.0), row(16, 1, 20, 10.0, 30.0)])
    assert "paid no visible price" in lines[3]
    assert len(accumulation_profile_lab.split_profile_lines([row(4, 4, 80, 10.0, 30.0)])) == 1  # one split: described, not compared
    lines = accumulation_profile_lab.split_profile_lines([row(1, 16, 320, 30.0, 60.0, ran=0.4), row(16, 1, 20, 10.0, 30.0)])
    assert "ran only 40%" in lines[3] and "not said" in lines[3] and "the matmuls themselves" not in "".join(lines)


def test_the_takeaways_follow_the_numbers():
    def split(b, k, calls, mm, total):
        return {"micro_batch": b, "accum_steps": k, "matmul_calls": calls, "matmul_ms": mm, "total_ms": total,
                "matmul_share": mm / total, "ran_share": 1.0}
    kwargs = dict(accum_steps=4, equal_error=3e-8, counts=[64, 20, 31, 9], wrong=0.123, wrong_cosine=0.98765,
                  token_error=4e-8, empty_error=5e-8, summary={"memory_ratio_last_first": 7.96},
                  sweep=[{"micro_batch": 1}, {"micro_batch": 8}], sweep_lines=["first", "second", "third"],
                  split_lines=accumulation_profile_lab.split_profile_lines([split(1, 16, 320, 30.0, 60.0),
                                                                             split(16, 1, 20, 10.0, 30.0)]))
    lines = accumulation_lab.takeaway_lines(**kwargs)
    assert lines[0].startswith("4 micro-batches scaled by 1/k gave the one-batch gradient to a relative error of "
                               "3.0e-08")
    assert "(counted tokens [64, 20, 31, 9]) the same 1/k scaling was off by 12.3% (cosine 0.9877)" in lines[1]
    assert "brought it to 4.0e-08, and to 5.0e-08 with an all-padding" in lines[1]
    assert "Memory followed b: x8.0 from b=1 to b=8" in lines[2]
    assert lines[3] == "Throughput: first; second; third."
    assert lines[4].startswith("Profile of one step each: the same FLOPs in x16.0 as many matmul calls")
    one = accumulation_lab.takeaway_lines(**{**kwargs, "sweep": [{"micro_batch": 4}], "split_lines": kwargs["split_lines"][:1]})
    assert one[3] == "Throughput: first; second." and len(one) == 4


# ---------------------------------------------------------------- notebook 05's parameters fail fast

def _validate(**overrides):
    """Run notebook 05's parameters cell, the overrides (as papermill would inject them), then its validation cell."""
    cells = json.loads((Path(__file__).resolve().parents[2] / "notebooks" / "05_grad_accumulation.ipynb").read_text())
    code = ["".join(c["source"]) for c in cells["cells"]
            if c["cell_type"] == "code" and c.get("id") != "course-start"]  # after the start cell
    assert code[0].startswith("PROFILE") and "S = params.setup" in code[1]
    scope = {}
    exec(code[0], scope)
    scope.update({"PROFILE": "smoke", "INTERACTIVE": False, **overrides})
    exec(code[1], scope)
    return scope


@pytest.mark.parametrize("name, value", [("REPS", 0), ("REPS", -2), ("SEQ_LEN", 0), ("EFFECTIVE_BATCH", 0),
                                         ("MICRO_BATCHES", []), ("MICRO_BATCHES", [0]), ("MICRO_BATCHES", [3]),
                                         ("CHECK_MICRO_BATCH", 0), ("CHECK_ACCUM_STEPS", 1), ("PRESET", "huge"),
                                         ("SEQ_LEN", 4096)])
def test_notebook_parameters_fail_at_once_naming_the_parameter(results_tmp, name, value):
    """None is the only 'use the default'; 0, [] or a bad value fails in the validation cell, by name."""
    with pytest.raises(ValueError, match=name):
        _validate(**{name: value})


def test_notebook_parameters_resolve_none_to_the_profile_default(results_tmp, capsys):
    scope = _validate()
    assert (scope["PRESET"], scope["SEQ_LEN"], scope["EFFECTIVE_BATCH"], scope["REPS"]) == ("tiny", 64, 16, 7)
    assert scope["MICRO_BATCHES"] == [1, 2, 4, 8, 16]
    assert (scope["CHECK_MICRO_BATCH"], scope["CHECK_ACCUM_STEPS"]) == (2, 4)
    assert _validate(REPS=7, MICRO_BATCHES=[8, 2])["MICRO_BATCHES"] == [2, 8]  # smallest first


def test_efficiency_claim_sets_the_most_accumulated_row_against_the_least_with_paired_quartiles():
    from helpers.measure import claims
    rows = [_row(4, 1, 200, 190, 210, 4), _row(1, 4, 100, 95, 105, 1), _row(2, 2, 150, 140, 160, 2)]
    row = accumulation_lab.efficiency_claim(rows)
    assert row["value"] == pytest.approx(0.5) and row["spread"] == pytest.approx((95 / 210, 105 / 190))
    assert "b=1 x k=4 over b=4 x k=1" in row["measured"] and "b=2: 0.75x" in row["measured"]
    assert "size of b=1" in row["reason"]
    assert claims.judge_interval(row["value"], *row["spread"], *row["claimed"])[0] == "contradicted"
    flat = accumulation_lab.efficiency_claim([_row(1, 4, 198, 190, 205, 1), _row(4, 1, 200, 190, 210, 4)])
    assert flat["reason"] == "" and claims.judge_interval(flat["value"], *flat["spread"], *flat["claimed"])[0] == "supported"
    with pytest.raises(ValueError, match="two micro-batch sizes"):
        accumulation_lab.efficiency_claim(rows[:1])


def test_efficiency_claim_pairs_the_rounds_when_both_rows_hold_them():
    most = _row(1, 4, 100, 95, 105, 1) | {"seconds_samples": [2.0, 4.0, 2.2]}  # a busy second round slows both
    least = _row(4, 1, 200, 190, 210, 4) | {"seconds_samples": [1.0, 2.0, 1.0]}
    row = accumulation_lab.efficiency_claim([most, least])
    assert row["value"] == pytest.approx(0.5) and row["spread"][1] == pytest.approx(0.5)
    assert row["spread"][0] == pytest.approx(0.5 - 0.5 * (0.5 - 1 / 2.2))  # numpy's linear quartile of the three ratios
    assert "3 paired rounds" in row["measured"]
