"""Notebook 13's takeaways, generated from the run's numbers by the labs: each says what the numbers say."""
from helpers.measure import protocol
from helpers.measure.bench import Timing
from helpers.parallel import collectives_lab, ddp_lab, pipeline_lab, zero_lab


def _t(median, spread=0.01):
    return Timing(median, median * (1 - spread), median * (1 + spread), [median * (1 - spread), median, median * (1 + spread)])


def test_the_collectives_takeaway_quotes_the_fit_and_says_when_it_may_not_rank():
    ring = protocol.ratio(_t(2e-3), _t(1e-3))
    args = ({"sizes": [1024, 4 * 2 ** 20]}, 3e-5, 1e-9, 4, 1.23, (1.1, 1.3), ring)
    said = collectives_lab.takeaway(*args, None)
    assert "α = 30 µs" in said and "1/β = 1.00 GB/s" in said and "a 4 MiB all-reduce on 4 ranks" in said
    assert "(IQR 1.10-1.30)" in said and "not ranked" not in said
    assert said.endswith("dist.all_reduce's time.")
    assert "(not ranked: a shared machine)" in collectives_lab.takeaway(*args, "a shared machine")
    close = protocol.ratio(_t(1.05e-3, 0.5), _t(1e-3, 0.5))
    assert "(within the noise)" in collectives_lab.takeaway(*args[:-1], close, None)


def _overlap_rows(sequential, overlapped, spread):
    return [{"comm_ms": c, "timings": {"sequential": _t(sequential, spread), "overlapped": _t(overlapped, spread)},
             "measured compute s": 0.01, "measured comm s": c / 1e3,
             "predicted": {"sequential": 0.08, "overlapped": 0.05}} for c in (5.0, 10.0, 20.0)]


def test_the_ddp_takeaway_ranks_overlap_only_when_the_run_separates_it():
    near = {"bucketed": _t(0.01), "after backward": _t(0.02)}
    said = ddp_lab.takeaway(_overlap_rows(0.08, 0.05, 0.01), 10.0, 32, near, None)
    assert "At 32 rows, bucketed overlap" in said and "with a known compute (10.0 ms) and all-reduce (10.0 ms)" in said
    assert "faster than sequential, the prediction 1.60x" in said
    assert "could not be ranked" in ddp_lab.takeaway(_overlap_rows(0.08, 0.075, 0.5), 10.0, 32, near, None)
    assert "the machine was shared" in ddp_lab.takeaway(_overlap_rows(0.08, 0.05, 0.01), 10.0, 32, near, "shared")


def test_the_zero_takeaway_reads_the_largest_world_size():
    rows = [[n, name, 1, 2, 3, total, 9.0, 0.01] for n, scale in ((2, 1), (4, 10))
            for name, total in (("DDP", 40.0 * scale), ("ZeRO-3 (FSDP)", 11.5 * scale))]
    said = zero_lab.takeaway(rows, 0.0123, "supported")
    assert "at most 1.2%" in said and "(ledger: supported)" in said
    assert "on 4 ranks FSDP held 115.0 MiB against DDP's 400.0 MiB" in said


def _pipe(kind, micro, bubble, lo, hi):
    return {"kind": kind, "micro": micro, "bubble": bubble, "bubble_q25": lo, "bubble_q75": hi, "formula": 0.2,
            "schedule_bubble": 0.21, "idle_ms": {"schedule": 3.0, "delivery": 1.5, "own": 2.25},
            "peak_in_flight": 8 if kind == "gpipe" else 2}


def test_the_pipeline_takeaway_compares_the_schedules_at_the_largest_m():
    within = [_pipe("gpipe", m, 0.3, 0.28, 0.32) for m in (1, 8)] + [_pipe("1f1b", m, 0.31, 0.29, 0.33) for m in (1, 8)]
    said = pipeline_lab.takeaway(within, 4, {"ratio": 1.05}, "supported", None)
    assert said.startswith("Pipeline: at m = 8 on 4 stages GPipe's bubble was 0.300 (IQR 0.280-0.320), 1.50x")
    assert "within GPipe's spread" in said and "held 2 micro-batches' activations per stage against GPipe's 8" in said
    apart = within[:2] + [_pipe("1f1b", m, 0.5, 0.45, 0.55) for m in (1, 8)]
    assert "apart from GPipe's beyond the spread" in pipeline_lab.takeaway(apart, 4, {"ratio": 1.05}, "supported", None)
    assert "not ranked against GPipe's" in pipeline_lab.takeaway(apart, 4, {"ratio": 1.05}, "supported", "shared")
