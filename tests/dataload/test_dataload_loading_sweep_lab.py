"""helpers.dataload.loading_sweep_lab: the protocol over loaders and its generated sentences: a planted cold step is
discarded by the warm-up, the sweep interleaves whole blocks and pools their steps, and the packing and idle
sentences follow the planted ratio and its spread."""
import itertools
import time

import pytest
import torch

from helpers.dataload import packing, loading_sweep_lab
from helpers.gpt.model import GPT, GPTConfig
from helpers.measure import protocol
from helpers.measure.bench import Timing


def _batches(n_rows=2, T=16, cold_s=0.0):
    """An endless batch source whose first batch takes `cold_s` seconds to arrive (a loader's start-up)."""
    x = torch.randint(1, 256, (n_rows, T), generator=torch.Generator().manual_seed(0))
    b = packing.Batch(x, x.roll(-1, 1), torch.arange(T).expand(n_rows, T), torch.zeros(n_rows, T, dtype=torch.long),
                      n_rows * T)
    first = [True]

    def gen():
        for _ in itertools.count():
            if first[0] and cold_s:
                time.sleep(cold_s)
            first[0] = False
            yield b
    return gen


@pytest.mark.slow
def test_timed_block_discards_a_planted_cold_step():
    model = GPT(GPTConfig.preset("tiny", seq_len=16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    closed = []
    src = loading_sweep_lab.Source(_batches(cold_s=0.5), close=closed.append)
    got, warm = loading_sweep_lab.timed_block(model, opt, src, steps=3)
    assert len(got) == 3 and 2 <= warm <= loading_sweep_lab.MAX_WARMUP_STEPS
    assert max(w for w, *_ in got) < 0.25  # the 0.5 s first batch was a warm-up step, not a timed one
    assert all(st.tokens == 32 for st in got) and len(closed) == 1  # the loader was closed after the block
    with pytest.raises(ValueError, match="steps"):
        loading_sweep_lab.timed_block(model, opt, src, steps=0)


def _prefetched(ready: int, wait_s: float, n_rows=2, T=16):
    """An endless batch source with `ready` batches at hand (what workers prefetched), then `wait_s` a batch."""
    x = torch.randint(1, 256, (n_rows, T), generator=torch.Generator().manual_seed(0))
    b = packing.Batch(x, x.roll(-1, 1), torch.arange(T).expand(n_rows, T), torch.zeros(n_rows, T, dtype=torch.long),
                      n_rows * T)

    def gen():
        for k in itertools.count():
            if k >= ready:
                time.sleep(wait_s)
            yield b
    return gen


def test_timed_block_drains_what_the_workers_prefetched_before_it_times():
    model = GPT(GPTConfig.preset("tiny", seq_len=16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    src = loading_sweep_lab.Source(_prefetched(6, 0.03), ahead=6)
    got, warm = loading_sweep_lab.timed_block(model, opt, src, steps=3)
    assert warm >= 6 and min(w for w, *_ in got) >= 0.025  # every timed step waited for its batch
    assert loading_sweep_lab.loader_source(None, batch_size=4, row_len=16, num_workers=3).ahead == 6  # PyTorch's 2 a worker
    assert loading_sweep_lab.loader_source(None, batch_size=4, row_len=16, num_workers=2, prefetch_factor=4).ahead == 8
    assert loading_sweep_lab.loader_source(None, batch_size=4, row_len=16).ahead == 0


def test_cycle_restarts_a_loader_that_runs_out_and_refuses_an_empty_one():
    it = loading_sweep_lab.cycle(lambda: [1, 2])
    assert [next(it) for _ in range(5)] == [1, 2, 1, 2, 1]
    with pytest.raises(ValueError, match="no batch"):
        next(loading_sweep_lab.cycle(lambda: []))


def test_loader_timing_pools_steps_into_medians_with_quartiles():
    steps = [(0.01, 0.0, 0.03, 40), (0.03, 0.0, 0.03, 40), (0.02, 0.0, 0.03, 40), (0.0, 0.0, 0.04, 40)]
    t = loading_sweep_lab.loader_timing(steps, [3])
    assert t.step.median == pytest.approx(0.045)  # 40, 60, 50, 40 ms
    assert t.tokens_per_s == pytest.approx(160 / 0.19)  # one block: its tokens over its time
    assert t.idle[0] == pytest.approx((0.25 + 0.4) / 2)  # the median of the per-step shares 0.25, 0.5, 0.4, 0
    row = t.row()
    assert row["steps"] == 4 and row["warmup_steps"] == [3] and row["wait_ms"][0] == pytest.approx(15.0)
    assert row["tokens_per_s_iqr"][0] <= row["tokens_per_s"] <= row["tokens_per_s_iqr"][1]


def test_tokens_per_s_is_each_blocks_total_not_a_median_of_bursty_steps():
    burst = [(0.0, 0.0, 0.001, 10)] * 3 + [(0.097, 0.0, 0.001, 10)]  # three batches at hand, then a long wait
    t = loading_sweep_lab.loader_timing(burst * 3, [0, 0, 0], block=4)
    assert t.step.median == pytest.approx(0.001)  # a median over steps sees only the bursts: 10,000 tokens/s
    assert t.tokens_per_s == pytest.approx(40 / 0.101) and len(t.per_token.samples) == 3  # the rate, once a round
    assert t.row()["tokens_per_s_iqr"] == pytest.approx((40 / 0.101, 40 / 0.101))
    with pytest.raises(ValueError, match="block=5"):
        loading_sweep_lab.loader_timing(burst * 3, [0], block=5)


def test_sweep_protocol_rotates_whole_blocks_and_stops_when_separated(monkeypatch):
    order = []
    per_step = {"fast": 0.01, "slow": 0.05}

    def fake_block(model, opt, source, *, steps, device):
        order.append(source.mask)  # the name travels in `mask` for this fake
        return [(0.0, 0.0, per_step[source.mask] * (1 + 0.01 * i), 10) for i in range(steps)], 2

    monkeypatch.setattr(loading_sweep_lab, "timed_block", fake_block)
    model = torch.nn.Linear(2, 2)
    sw = loading_sweep_lab.sweep_protocol(model, {"fast": loading_sweep_lab.Source(None, mask="fast"),
                                            "slow": loading_sweep_lab.Source(None, mask="slow")}, steps=3, min_rounds=3)
    assert order == ["fast", "slow", "slow", "fast", "fast", "slow"]  # rotated each round
    assert sw.rounds == 3 and sw.stopped == "separated" and sw.fastest() == "fast"
    assert len(sw["fast"].step.samples) == 9 and sw["fast"].warmup_steps == [2, 2, 2]
    assert "3 timed steps x 3 interleaved rounds" in sw.note() and "stopped: separated" in sw.note()
    assert sw.withheld() is None and "was" in sw.rank_sentence("fast", "slow")  # 4-tuples: wall compute, no contention
    with pytest.raises(ValueError):
        loading_sweep_lab.sweep_protocol(model, {}, steps=1)
    with pytest.raises(ValueError, match="max_rounds"):
        loading_sweep_lab.sweep_protocol(model, {"a": None}, steps=1, min_rounds=3, max_rounds=2)


def _timing(median, spread):
    return Timing(median, median * (1 - spread), median * (1 + spread), [median])


VERDICTS = ("above the course", "below the course", "straddle", "cannot rank")


@pytest.mark.parametrize("padded, packed, cuda, expect, verdict", [
    (2.0, 1.0, False, "packed trained faster; above the course's 1.5x target", "above the course"),
    (1.2, 1.0, True, "packed trained faster; below the course's 1.5x target", "below the course"),
    (1.5, 1.0, True, "straddle the course's 1.5x target", "straddle"),
    (0.6, 1.0, True, "padded trained faster; below the course's 1.5x target", "below the course"),
    (1.02, 1.0, False, "cannot rank packing against padding", "cannot rank"),
])
def test_packing_sentence_flips_with_the_planted_ratio_and_spread(padded, packed, cuda, expect, verdict):
    r = protocol.ratio(_timing(padded, 0.05), _timing(packed, 0.05))  # padded time / packed time
    text = loading_sweep_lab.packing_sentence(r, cuda=cuda)
    assert expect in text and f"{r.value:.2f}x" in text
    assert ("set for a GPU" in text) == (not cuda)
    assert [v for v in VERDICTS if v in text] == [verdict]


def test_idle_sentence_and_the_target_rule():
    assert loading_sweep_lab.against_target(1.6, 2.0, 1.5) == "met"
    assert loading_sweep_lab.against_target(1.0, 1.4, 1.5) == "not met"
    assert loading_sweep_lab.against_target(1.4, 1.6, 1.5) == "undecided"
    assert loading_sweep_lab.against_target(0.0, 0.01, 0.02, higher_is_better=False) == "met"
    with pytest.raises(ValueError):
        loading_sweep_lab.against_target(2.0, 1.0, 1.5)
    assert "within the course's target of at most 2%" in loading_sweep_lab.idle_sentence("w=2", (0.01, 0.005, 0.015), cuda=True)
    text = loading_sweep_lab.idle_sentence("w=0", (0.4, 0.3, 0.5), cuda=False)
    assert "40.0%" in text and "above the course's target" in text and "CPU" in text


def _planted_sweep(monkeypatch, ran_no_workers, ran_workers=1.0, *, budget_s=30.0, round_cost=0.0, min_rounds=3):
    """A sweep over a source without workers ("fast") and one with two ("slow") whose compute the main thread ran
    the planted share of; each block advances a fake wall clock by `round_cost` / 2."""
    now = [0.0]
    per_step = {"fast": (0.01, ran_no_workers), "slow": (0.05, ran_workers)}

    def fake_block(model, opt, source, *, steps, device):
        now[0] += round_cost / 2
        t, ran = per_step[source.mask]
        return [(0.0, 0.0, t * (1 + 0.01 * i), 10, ran * t * (1 + 0.01 * i)) for i in range(steps)], 1

    monkeypatch.setattr(loading_sweep_lab, "timed_block", fake_block)
    return loading_sweep_lab.sweep_protocol(
        torch.nn.Linear(2, 2), {"fast": loading_sweep_lab.Source(None, mask="fast"),
                                "slow": loading_sweep_lab.Source(None, mask="slow", workers=2)},
        steps=3, min_rounds=min_rounds, max_rounds=8, budget_s=budget_s, clock=lambda: now[0])


def test_a_ranking_the_contention_could_make_is_withheld(monkeypatch):
    quiet = _planted_sweep(monkeypatch, ran_no_workers=0.98, ran_workers=0.6)
    assert quiet.contention() == pytest.approx(0.98) and quiet.withheld() is None  # its own workers do not count
    assert "fast was" in quiet.rank_sentence("fast", "slow") and "faster" in quiet.rank_sentence("fast", "slow")
    assert "60%" in quiet.contention_sentence() and "98%" in quiet.contention_sentence()
    busy = _planted_sweep(monkeypatch, ran_no_workers=0.45)  # the same separated timings on a shared machine
    assert busy["fast"].compute.clock == "thread" and busy["fast"].ran == pytest.approx(0.45)
    assert busy["fast"].compute.median == pytest.approx(0.45 * busy["fast"].compute_wall.median)
    why = busy.withheld()
    assert why is not None and "45%" in why
    text = busy.rank_sentence("fast", "slow")
    assert "not ranked" in text and "faster" not in text and why in text
    idle = loading_sweep_lab.idle_sentence("w=0", (0.4, 0.3, 0.5), cuda=False, withheld=why)
    assert "not judged" in idle and "above the course" not in idle


def test_the_sweep_stops_at_its_seconds_budget_first_rounds_included(monkeypatch):
    sw = _planted_sweep(monkeypatch, 1.0, budget_s=25.0, round_cost=10.0)  # a round costs 10 s of the fake clock
    assert sw.rounds == 2 and sw.stopped == "budget" and sw.round_s == [10.0, 10.0]  # a third would end at 30 s
    why = sw.withheld()
    assert why is not None and "2 round(s)" in why and "fewer than the 3" in why
    assert "not ranked" in sw.rank_sentence("fast", "slow")
    one = _planted_sweep(monkeypatch, 1.0, budget_s=5.0, round_cost=10.0)
    assert one.rounds == 1 and one.stopped == "budget"  # the first round always runs, then nothing more
    enough = _planted_sweep(monkeypatch, 1.0, budget_s=100.0, round_cost=10.0)
    assert enough.rounds == 3 and enough.stopped == "separated" and enough.withheld() is None
