"""Notebook 13's data parallelism on real gloo ranks (DDP, ZeRO and FSDP against single-process training, DDP's
step times and overlap by the protocol), and the sentences generated from those numbers."""
import pytest

from helpers.gpt.model import GPT
from helpers.measure import bench, clock as clocks, protocol
from helpers.parallel import ddp
from helpers.parallel import collectives_lab as CL
from helpers.parallel import ddp_lab as L
from helpers.parallel import launch


@pytest.fixture(scope="module")
def on_ranks():
    """The checks and the timing section on two ranks, run once: {section: rank 0's result}."""
    return {"data": launch.run_on_ranks(L.check_data_parallel, 2, 3)[0],
            "ddp timing": launch.run_on_ranks(L.section_ddp, 2, 64, 2, [4], 2, 0.01, 3, 2.0, [1.0, 4.0])[0]}


@pytest.mark.ranks
def test_ddp_equals_single_process_and_torch_ddp(on_ranks):
    d = on_ranks["data"]
    for key in ("ddp per-parameter", "ddp bucketed", "ddp after backward", "torch ddp", "no_sync accumulation"):
        assert d[key] <= 1e-6, key  # SGD: only the order of fp32 additions differs
    assert d["ours vs torch ddp"] <= 1e-6
    assert d["buckets"] > 1


@pytest.mark.ranks
def test_zero_and_fsdp_equal_single_process(on_ranks):
    d = on_ranks["data"]
    for key in ("zero-1", "zero-2", "fsdp fp32"):
        assert d[key] <= 1e-4, key  # AdamW divides by sqrt(v): rounding-level gradient differences grow to ~1e-5
    assert 1e-4 < d["fsdp bf16 compute"] <= 0.1  # bf16 matmuls: visibly different, still close
    assert d["fsdp full shapes"]
    n = sum(p.numel() for p in ddp.unique_params(GPT(L.small_config())))
    assert d["fsdp shard elements"] <= n / 2 + 64  # a shard is half of each tensor (LayerNorms stay whole)
    assert isinstance(d["fsdp2"], str) or d["fsdp2"] <= 1e-4


@pytest.mark.ranks
def test_syncing_every_micro_step_sends_the_gradients_every_time(on_ranks):
    t = on_ranks["ddp timing"]["ddp"]
    acc = t["accumulation"]
    assert acc["bytes every"] == acc["micro"] * acc["bytes no_sync"] == acc["micro"] * 4 * t["params"]
    assert set(t[4]) == {"compute only", "after backward", "overlapped", "bucketed", "timings", "iqr"}
    # the protocol on ranks: every variant the same number of rounds, at least reps and at most 3x reps
    counts = {len(x.samples) for x in t[4]["timings"].values()}
    assert len(counts) == 1 and 2 <= counts.pop() <= 6
    assert t[4]["bucketed"] == t[4]["timings"]["bucketed"].median and len(t["copies"].samples) >= 2
    # 2 layers of a 64x64 weight (16 KiB, over the 0.01 MiB bucket) and a bias: a bucket per layer
    assert t["tensors"] == 4 and t["messages"] == {"after backward": 4, "overlapped": 4, "bucketed": 2}


@pytest.mark.ranks
def test_overlap_runs_on_ranks_and_predicts_from_its_own_times(on_ranks):
    rows = on_ranks["ddp timing"]["overlap"]
    assert [r["comm_ms"] for r in rows] == [1.0, 4.0]
    for r in rows:
        c, k = r["measured compute s"], r["measured comm s"]
        assert c >= 2e-3 and k >= r["comm_ms"] / 1e3  # a wait lasts at least its time
        assert r["predicted"] == ddp.overlap_prediction([c] * 3, [k] * 3)
        assert set(r["timings"]) == {"sequential", "overlapped"}


def _timing(median, spread=0.02):
    """A planted bench.Timing: five samples around `median`, quartiles +-spread/2."""
    xs = [median * (1 + spread * k / 4) for k in (-2, -1, 0, 1, 2)]
    return bench.Timing(*bench.quartiles(xs), xs)


def test_bucketing_sentence_ranks_only_separated_timings_and_weighs_the_measured_parts():
    base = {"messages": {"after backward": 8, "overlapped": 8, "bucketed": 4}, "bucket_mb": 1.0,
            "largest tensor bytes": 4 * 2 ** 20, "copies": _timing(0.040)}
    row = lambda ov, bu, sp=0.02: {4: {"timings": {"overlapped": _timing(ov, sp), "bucketed": _timing(bu, sp)}}}  # noqa: E731
    slow = L.bucketing_sentence({**base, **row(0.10, 0.15)}, 4, 2e-4)
    assert "bucketed was slower, 1.50x the time" in slow and "from 8 (one per tensor) to 4" in slow
    assert "4 MiB weight already fills a 1 MiB bucket" in slow  # DDP's bucket_mb counts 2^20 bytes: MiB, not MB
    assert "80% of the 50.0 ms gap; they account for it" in slow  # copies 40 ms of a 50 ms gap
    small = L.bucketing_sentence({**base, "copies": _timing(0.005), **row(0.10, 0.15)}, 4, 2e-4)
    assert "10% of the 50.0 ms gap" in small and "not explained by this run" in small
    noisy = L.bucketing_sentence({**base, **row(0.10, 0.15, sp=1.0)}, 4, 2e-4)
    assert "cannot rank them" in noisy and "slower" not in noisy and "timed alone: 40.000 ms" in noisy
    fast = L.bucketing_sentence({**base, "largest tensor bytes": 1000, **row(0.15, 0.10)}, 4, 2e-4)
    assert "bucketed was faster, 1.50x" in fast and "already fills" not in fast
    assert "2% of the 50.0 ms, the rest is not explained" in fast  # 4 saved messages x 0.2 ms of a 50 ms gain
    medians_only = L.bucketing_sentence({**base, 4: {"overlapped": 0.1, "bucketed": 0.2}}, 4, 2e-4)
    assert "cannot rank them" in medians_only
    # spreads apart, yet two rounds of five had the bucketed step faster: not ranked, and not called "within"
    t = lambda xs: bench.Timing(*bench.quartiles(xs), xs)  # noqa: E731
    ov, bu = t([0.10, 0.10, 0.10, 0.10, 0.30]), t([0.05, 0.15, 0.15, 0.15, 0.15])
    split = L.bucketing_sentence({**base, 4: {"timings": {"overlapped": ov, "bucketed": bu}}}, 4, 2e-4)
    assert "apart by their medians' spreads" in split and "straddles 1" in split and "within" not in split
    assert "cannot rank them" in split and "slower" not in split
    said = L.rank_paired("bucketed", bu, "overlapped", ov)
    assert "apart by their spreads but not round by round" in said and "cannot rank them" in said


def test_overlap_sentences_follow_the_numbers():
    pred = ddp.overlap_prediction([0.01] * 4, [0.01] * 4)  # 80 ms vs 50 ms
    row = {"layers": 4, "measured compute s": 0.01, "measured comm s": 0.01, "predicted": pred,
           "timings": {"sequential": _timing(0.080), "overlapped": _timing(0.052)}}
    s = L.overlap_sentences([row])[0]
    assert "predicted 80.0 and 50.0 ms (both within 10%)" in s and "faster, the prediction says 1.60x" in s
    off = L.overlap_sentences([{**row, "timings": {"sequential": _timing(0.080), "overlapped": _timing(0.078)}}])[0]
    assert "off by +0% and +56%" in off
    noisy = L.overlap_sentences([{**row, "timings": {"sequential": _timing(0.080, 1.0), "overlapped": _timing(0.052, 1.0)}}])[0]
    assert "cannot rank" in noisy and "faster" not in noisy


def test_rank_paired_needs_the_round_by_round_ratio_on_one_side_of_1():
    def timing(xs):
        return bench.Timing(*bench.quartiles(xs), xs)

    fast, slow = timing([1.0, 1.1, 1.2, 1.3, 1.4]), timing([1.5, 1.6, 1.7, 1.8, 1.9])
    s = L.rank_paired("A", fast, "B", slow)
    assert s.startswith("A was") and "round by round B / A 1.42x" in s
    r = protocol.paired_ratio(slow, fast)
    assert (r.value, r.lo, r.hi) == bench.quartiles([1.5, 1.6 / 1.1, 1.7 / 1.2, 1.8 / 1.3, 1.9 / 1.4])
    # separated IQRs, but in 4 of 9 rounds B was the faster: slow rounds, not a ranking
    a, b = timing([3, 3, 1, 1, 1, 1, 1, 1, 1]), timing([1.5, 1.5, 0.5, 0.5, 1.5, 1.5, 1.5, 1.5, 1.5])
    assert protocol.separated(a, b)
    d = L.rank_paired("A", a, "B", b)
    assert "cannot rank them" in d and "round by round" in d


def test_a_shared_machine_withholds_every_ddp_ranking(monkeypatch):
    fast, slow = _timing(0.10), _timing(0.15)
    busy = CL.Load(clocks.Reading(0.02, 0.05), clocks.Reading(0.03, 0.05))  # the probes ran 40% and 60% of the wall time
    why = busy.withheld()
    assert busy.share == pytest.approx(0.5) and "40% and 60%" in why and "shared" in why
    assert CL.Load(clocks.Reading(0.049, 0.05), clocks.Reading(0.05, 0.05)).withheld() is None  # 99%: close to idle
    said = L.rank_paired("A", fast, "B", slow, withheld=why)
    assert "not ranked by this run" in said and "faster" not in said and why in said
    assert L.rank_paired("A", fast, "B", slow).startswith("A was")  # the same timings, ranked on a quiet machine
    pred = ddp.overlap_prediction([0.01] * 4, [0.01] * 4)
    row = {"layers": 4, "measured compute s": 0.01, "measured comm s": 0.01, "predicted": pred,
           "timings": {"sequential": _timing(0.080), "overlapped": _timing(0.052)}}
    ov = L.overlap_sentences([row], withheld=why)[0]
    assert "not ranked by this run" in ov and "faster" not in ov
    base = {"messages": {"after backward": 8, "overlapped": 8, "bucketed": 4}, "bucket_mb": 1.0,
            "largest tensor bytes": 1000, "copies": _timing(0.040), 4: {"timings": {"overlapped": slow, "bucketed": fast}}}
    bu = L.bucketing_sentence(base, 4, 2e-4, withheld=why)
    assert "not ranked by this run" in bu and "faster" not in bu
    assert CL.ranked("A was faster", "A 1 ms, B 2 ms", why).startswith("A 1 ms, B 2 ms: not ranked")
    assert CL.ranked("A was faster", "A 1 ms, B 2 ms", None) == "A was faster"
    readings = iter([clocks.Reading(0.02, 0.05), clocks.Reading(0.03, 0.05)])
    monkeypatch.setattr(clocks, "probe", lambda: next(readings))
    monkeypatch.setattr(CL.launch, "run_on_ranks", lambda fn, world, *a, **k: [fn(0, world, *a, **k)])
    out, load = CL.on_ranks(lambda rank, world, x: x + world, 2, 1)
    assert out == [3] and load.withheld() == why  # the probes around the section, in order
