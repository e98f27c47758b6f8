"""Notebook 13's machinery on real gloo ranks: the launcher, the ring all-reduce, DDP, ZeRO, FSDP,
tensor and pipeline parallelism, and a two-"node" torchrun launch. Ranks are started once per check
group (a fork server makes every launch after the first cost a fraction of a second). The launcher's
failure tests plant each failure on a chosen rank with the rank functions below (this module is
importable by the ranks) and check that the error names that rank, at once, and that no process is left."""
import _thread
import ctypes
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from helpers.parallel import dist_lab as L
from helpers.parallel import distributed as D
from helpers.parallel import model_parallel as MP
from helpers.parallel import data_parallel as P

ROOT = Path(__file__).resolve().parents[2]


def _children() -> set[int]:
    """Our live descendants, except the fork server itself (it lives as long as this process, by design);
    ranks forked from it share its command line, so only our direct child is let off."""
    out = set()
    for c in psutil.Process().children(recursive=True):
        try:
            if c.status() == psutil.STATUS_ZOMBIE:
                continue
            if c.ppid() == os.getpid() and "forkserver" in " ".join(c.cmdline()):
                continue
        except psutil.NoSuchProcess:
            continue
        out.add(c.pid)
    return out


def _gone(procs: list[psutil.Process], within: float = 10.0) -> list[int]:
    """The PIDs among `procs` still running (zombies count as gone) after waiting up to `within` seconds."""
    end = time.monotonic() + within
    while True:
        alive = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p.pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.1)


# ---------------------------------------------------------------- rank functions that plant failures

def returns_tensors(rank: int, world: int) -> dict:
    return {"t": torch.arange(4) * rank, "p": torch.nn.Parameter(torch.full((2,), float(rank)))}


def returns_unpicklable_on(rank: int, world: int, bad: int, what: str):
    if rank != bad:
        return rank
    if what == "generator":
        return {"values": (i for i in range(3))}
    return threading.Lock()


def killed_on(rank: int, world: int, bad: int) -> int:
    """`bad` SIGKILLs itself after a barrier; the others enter an all-reduce that its death breaks."""
    dist.barrier()
    if rank == bad:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(4))
    return rank


def exits_on(rank: int, world: int, bad: int) -> int:
    dist.barrier()
    if rank == bad:
        os._exit(3)
    dist.all_reduce(torch.ones(4))
    return rank


def hangs_on(rank: int, world: int, bad: int) -> int:
    if rank == bad:
        while True:
            time.sleep(1)
    return rank


def pid_then_deadlock(rank: int, world: int, folder: str) -> None:
    """Writes its PID to `folder`/rank<k>, then deadlocks: rank 0 in a barrier that rank 1 never reaches,
    rank 1 in libc's pause() called with the GIL held (no Python thread of its own can run any more)."""
    Path(folder, f"rank{rank}.tmp").write_text(str(os.getpid()))
    os.replace(Path(folder, f"rank{rank}.tmp"), Path(folder, f"rank{rank}"))
    if rank == 0:
        dist.barrier()
    ctypes.PyDLL(None).pause()


@pytest.fixture(scope="module")
def two_ranks():
    """Every check that needs two ranks, run once: {section: rank 0's result}."""
    return {"collectives": D.run_on_ranks(L.check_collectives, 2)[0],
            "data": D.run_on_ranks(L.check_data_parallel, 2, 3)[0],
            "tensor": D.run_on_ranks(L.check_tensor_parallel, 2)[0],
            "memory": D.run_on_ranks(L.measure_memory, 2, dict(n_layer=2, n_head=4, d_model=64, d_ff=256, seq_len=16)),
            "pipeline": D.run_on_ranks(L.measure_pipeline, 2, [1, 4], 2.0, 2)[0],
            "ddp timing": D.run_on_ranks(L.section_ddp, 2, 64, 2, [4], 2, 0.01, 3, 2.0, [1.0, 4.0])[0]}


# ---------------------------------------------------------------- pure functions

@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_ring_schedule_sums_on_every_rank(n):
    g = torch.Generator().manual_seed(n)
    xs = [torch.randint(-50, 50, (11,), generator=g) for _ in range(n)]
    for out in D.simulate_ring(xs):
        assert torch.equal(out, sum(xs))


def test_a_wrong_schedule_is_caught_by_the_simulation():
    wrong = lambda r, n, s, ph: ((r + s) % n, (r + s - 1) % n)  # noqa: E731  turns the wrong way
    xs = [torch.arange(6) * (r + 1) for r in range(3)]
    assert not all(torch.equal(o, sum(xs)) for o in D.simulate_ring(xs, wrong))
    with pytest.raises(ValueError, match="phase"):
        D.ring_schedule(0, 2, 0, "broadcast")


def test_alpha_beta_fit_recovers_a_known_model():
    sizes = [2 ** k for k in range(6, 24, 2)]
    alpha, beta = 20e-6, 1 / 5e9
    fit = D.alpha_beta_fit(sizes, [alpha + s * beta for s in sizes])
    assert fit[0] == pytest.approx(alpha, rel=1e-6) and fit[1] == pytest.approx(beta, rel=1e-6)
    with pytest.raises(ValueError):
        D.alpha_beta_fit([8, 8], [1.0, 1.0])


def test_bus_bandwidth_follows_nccl_tests():
    assert D.bus_bandwidth(1e9, 1.0, 8) == pytest.approx(1.75)  # algbw 1 GB/s x 2*7/8
    assert D.bus_bandwidth(1e9, 1.0, 2) == pytest.approx(1.0)
    assert D.bus_bandwidth(1e9, 1, 2) == pytest.approx(1.0)  # whole seconds are a number of seconds too
    with pytest.raises(ValueError, match="seconds=0.0 must be a positive float"):
        D.bus_bandwidth(1e9, 0.0, 2)
    with pytest.raises(ValueError, match="world_size=0 must be a positive int"):
        D.bus_bandwidth(1e9, 1.0, 0)


def test_pipeline_schedules_and_bubble_formula():
    for kind in ("gpipe", "1f1b"):
        sched = MP.pipeline_schedule(kind, 4, 6)
        for s, steps in enumerate(sched):
            assert sorted(steps) == sorted([("F", i) for i in range(6)] + [("B", i) for i in range(6)])
            assert all(steps.index(("F", i)) < steps.index(("B", i)) for i in range(6))
            held, peak = 0, 0
            for op, _ in steps:
                held += 1 if op == "F" else -1
                peak = max(peak, held)
            assert peak == (6 if kind == "gpipe" else 4 - s)
    assert MP.bubble_formula(4, 8) == pytest.approx(3 / 11)
    with pytest.raises(ValueError):
        MP.pipeline_schedule("zigzag", 2, 2)
    with pytest.raises(ValueError, match="stages=0 must be a positive int"):
        MP.pipeline_schedule("gpipe", 0, 2)
    with pytest.raises(ValueError, match="micro=1.0 must be a positive int"):
        MP.pipeline_schedule("1f1b", 2, 1.0)


def test_zero_formulas_match_the_paper():
    psi, n = 7.5e9, 64  # the ZeRO paper's figure 1 example: 120 GB, 31.4, 16.6, 1.9 GB per device
    gb = [P.zero_formula(s, psi, n, 2, 2, 12)["total"] / 1e9 for s in range(4)]
    assert gb == pytest.approx([120, 31.4, 16.6, 1.875], rel=0.01)
    with pytest.raises(ValueError):
        P.zero_formula(4, 10, 2)
    assert [P.zero_extra_comm(s, 10) for s in range(4)] == [80, 80, 80, 120]  # 2Ψ, 2Ψ, 2Ψ, 3Ψ fp32 bytes
    with pytest.raises(ValueError, match="stage=4"):  # a ValueError naming the stage, not a bare KeyError
        P.zero_extra_comm(4, 10)


def test_the_panel_plan_follows_the_formulas_and_draws_a_new_figure():
    import matplotlib.pyplot as plt

    p = L.plan(8, 1e9, 3)
    assert p["total"] == pytest.approx(16e9 / 8) and p["sent"] == pytest.approx(3 * 7 / 8 * 4e9)
    assert L.plan(8, 1e9, 0)["sent"] == pytest.approx(2 * 7 / 8 * 4e9)
    a, b = L.plan_figure(4, 1e8, 1), L.plan_figure(4, 1e8, 2)
    assert a is not b
    mib = L.plan_figure(4, 1e8, 1, unit="MiB")
    assert mib.axes[0].get_ylabel().startswith("MiB")
    with pytest.raises(ValueError, match="unit"):
        L.plan_figure(4, 1e8, 1, unit="GB")
    plt.close("all")


def test_run_on_ranks_validates():
    with pytest.raises(ValueError, match="world_size"):
        D.run_on_ranks(L.fail_on, 0, 0)
    with pytest.raises(ValueError, match="backend"):
        D.run_on_ranks(L.fail_on, 2, 0, backend="mpi")


# ---------------------------------------------------------------- on ranks

def test_ring_all_reduce_equals_dist_all_reduce(two_ranks):
    assert two_ranks["collectives"]["int exact"]
    assert two_ranks["collectives"]["float max err"] <= 1e-5


def test_ring_all_reduce_on_four_ranks():
    out = D.run_on_ranks(L.check_collectives, 4)[0]
    assert out["int exact"] and out["float max err"] <= 1e-5


def test_ddp_equals_single_process_and_torch_ddp(two_ranks):
    d = two_ranks["data"]
    for key in ("ddp per-parameter", "ddp bucketed", "ddp after backward", "torch ddp", "no_sync accumulation"):
        assert d[key] <= 1e-6, key  # SGD: only the order of fp32 additions differs
    assert d["ours vs torch ddp"] <= 1e-6
    assert d["buckets"] > 1


def test_zero_and_fsdp_equal_single_process(two_ranks):
    d = two_ranks["data"]
    for key in ("zero-1", "zero-2", "fsdp fp32"):
        assert d[key] <= 1e-4, key  # AdamW divides by sqrt(v): rounding-level gradient differences grow to ~1e-5
    assert 1e-4 < d["fsdp bf16 compute"] <= 0.1  # bf16 matmuls: visibly different, still close
    assert d["fsdp full shapes"]
    n = sum(p.numel() for p in P.unique_params(L.GPT(L.small_config())))
    assert d["fsdp shard elements"] <= n / 2 + 64  # a shard is half of each tensor (LayerNorms stay whole)
    assert isinstance(d["fsdp2"], str) or d["fsdp2"] <= 1e-4


def test_tensor_parallel_equals_dense(two_ranks):
    assert two_ranks["tensor"]["mlp"] <= 1e-5 and two_ranks["tensor"]["attention"] <= 1e-5


def test_memory_per_rank_follows_zero(two_ranks):
    ranks = two_ranks["memory"]
    for stage in range(4):
        rows = [r[stage] for r in ranks]
        n = rows[0]["n_params"]
        want = P.zero_formula(stage, n, 2)
        total = sum(r["total"] for r in rows) / 2
        assert total == pytest.approx(want["total"], rel=0.1), stage
    assert ranks[0][3]["params"] < 0.6 * ranks[0][0]["params"]


def test_pipeline_holds_what_the_schedule_says(two_ranks):
    rows = {(r["kind"], r["micro"]): r for r in two_ranks["pipeline"]}
    assert rows[("gpipe", 4)]["peak_in_flight"] == [4, 4]
    assert rows[("1f1b", 4)]["peak_in_flight"] == [2, 1]
    assert all(0 <= r["bubble"] < 1 and r["runs"] == 2 and len(r["bubbles"]) == 2 for r in rows.values())
    # the schedule's own waiting can never be less than a stage's idle slots at the measured step times
    for r in rows.values():
        assert r["idle_ms"]["schedule"] >= 0.9 * 2 * (r["forward_ms"] + r["backward_ms"])


def test_syncing_every_micro_step_sends_the_gradients_every_time(two_ranks):
    t = two_ranks["ddp timing"]["ddp"]
    acc = t["accumulation"]
    assert acc["bytes every"] == acc["micro"] * acc["bytes no_sync"] == acc["micro"] * 4 * t["params"]
    assert set(t[4]) == {"compute only", "after backward", "overlapped", "bucketed", "timings", "iqr"}
    # the protocol on ranks: every variant the same number of rounds, at least reps and at most 3x reps
    counts = {len(x.samples) for x in t[4]["timings"].values()}
    assert len(counts) == 1 and 2 <= counts.pop() <= 6
    assert t[4]["bucketed"] == t[4]["timings"]["bucketed"].median and len(t["copies"].samples) >= 2
    # 2 layers of a 64x64 weight (16 KiB, over the 0.01 MiB bucket) and a bias: a bucket per layer
    assert t["tensors"] == 4 and t["messages"] == {"after backward": 4, "overlapped": 4, "bucketed": 2}


def _timing(median, spread=0.02):
    """A planted bench.Timing: five samples around `median`, quartiles +-spread/2."""
    from helpers.measure import bench
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
    from helpers.measure import bench
    t = lambda xs: bench.Timing(*bench.quartiles(xs), xs)  # noqa: E731
    ov, bu = t([0.10, 0.10, 0.10, 0.10, 0.30]), t([0.05, 0.15, 0.15, 0.15, 0.15])
    split = L.bucketing_sentence({**base, 4: {"timings": {"overlapped": ov, "bucketed": bu}}}, 4, 2e-4)
    assert "apart by their medians' spreads" in split and "straddles 1" in split and "within" not in split
    assert "cannot rank them" in split and "slower" not in split
    said = L.rank_paired("bucketed", bu, "overlapped", ov)
    assert "apart by their spreads but not round by round" in said and "cannot rank them" in said


# ---------------------------------------------------------------- DDP overlap with timed waits

def test_overlap_prediction_hides_the_smaller_of_compute_and_comm():
    assert P.overlap_prediction([1.0] * 4, [1.0] * 4) == {"sequential": 8.0, "overlapped": 5.0}
    assert P.overlap_prediction([1.0] * 4, [2.0] * 4) == {"sequential": 12.0, "overlapped": 9.0}  # comm-bound
    assert P.overlap_prediction([2.0] * 4, [0.5] * 4) == {"sequential": 10.0, "overlapped": 8.5}  # compute-bound
    assert P.overlap_prediction([3.0, 1.0], [1.0, 4.0])["overlapped"] == 8.0  # 3 | max(4, 4) + 4
    with pytest.raises(ValueError, match="one time per layer"):
        P.overlap_prediction([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match=">= 0"):
        P.overlap_prediction([1.0], [-1.0])


def test_overlap_runs_on_ranks_and_predicts_from_its_own_times(two_ranks):
    rows = two_ranks["ddp timing"]["overlap"]
    assert [r["comm_ms"] for r in rows] == [1.0, 4.0]
    for r in rows:
        c, k = r["measured compute s"], r["measured comm s"]
        assert c >= 2e-3 and k >= r["comm_ms"] / 1e3  # a wait lasts at least its time
        assert r["predicted"] == P.overlap_prediction([c] * 3, [k] * 3)
        assert set(r["timings"]) == {"sequential", "overlapped"}


def test_overlap_sentences_follow_the_numbers():
    pred = P.overlap_prediction([0.01] * 4, [0.01] * 4)  # 80 ms vs 50 ms
    row = {"layers": 4, "measured compute s": 0.01, "measured comm s": 0.01, "predicted": pred,
           "timings": {"sequential": _timing(0.080), "overlapped": _timing(0.052)}}
    s = L.overlap_sentences([row])[0]
    assert "predicted 80.0 and 50.0 ms (both within 10%)" in s and "faster, the prediction says 1.60x" in s
    off = L.overlap_sentences([{**row, "timings": {"sequential": _timing(0.080), "overlapped": _timing(0.078)}}])[0]
    assert "off by +0% and +56%" in off
    noisy = L.overlap_sentences([{**row, "timings": {"sequential": _timing(0.080, 1.0), "overlapped": _timing(0.052, 1.0)}}])[0]
    assert "cannot rank" in noisy and "faster" not in noisy


# ---------------------------------------------------------------- the pipeline bubble

@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (2, 8), (3, 5), (4, 8)])
def test_replay_gives_the_formula_with_free_messages_and_more_with_delays(kind, p, m):
    assert MP.replay_schedule(kind, p, m, 0.01, 0.02)["bubble"] == pytest.approx(MP.bubble_formula(p, m))
    assert MP.replay_schedule(kind, p, m, 0.01, 0.02, delay_s=1e-3)["bubble"] > MP.bubble_formula(p, m)
    r = MP.replay_schedule(kind, p, m, 0.01, 0.02, overhead_s=1e-3)
    assert r["busy_s"] == [pytest.approx(m * 0.03)] * p and r["bubble"] > MP.bubble_formula(p, m)


def test_replay_refuses_negative_times():
    with pytest.raises(ValueError, match="delay_s=-1"):
        MP.replay_schedule("gpipe", 2, 2, 0.01, 0.02, delay_s=-1)


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


def test_bubble_verdict_judges_the_schedules_part_within_the_tolerance():
    ok = L.bubble_verdict([_row("gpipe", 0.2, schedule=0.105), _row("1f1b", 0.15)])
    assert ok["verdict"] == "supported" and ok["ratio"] == pytest.approx(1.05) and ok["raw_ratio"] == pytest.approx(2.0)
    assert "judged within 15%" in ok["measured"]
    bad = L.bubble_verdict([_row("gpipe", 0.2, schedule=0.2)])
    assert bad["verdict"] == "contradicted"


def test_tensor_results_come_back_after_their_ranks_exit():
    out = D.run_on_ranks(returns_tensors, 2)
    assert [o["t"].tolist() for o in out] == [[0, 0, 0, 0], [0, 1, 2, 3]]
    assert type(out[1]["p"]) is torch.nn.Parameter and out[1]["p"].tolist() == [1.0, 1.0]


def test_results_are_pickled_by_value_on_the_cpu():
    t = torch.arange(3.0)
    got = pickle.loads(D.result_bytes({"t": t, "p": torch.nn.Parameter(t.clone())}))
    assert torch.equal(got["t"], t) and got["t"].data_ptr() != t.data_ptr() and got["t"].device.type == "cpu"
    assert type(got["p"]) is torch.nn.Parameter and got["p"].requires_grad


FAILURES = {  # mode: (fn, args after rank and world with the bad rank first, what the error says)
    "raises": (L.fail_on, (), r"planted failure on rank {bad}"),
    "unpicklable": (returns_unpicklable_on, ("generator",),
                    r"^rank {bad} returned a dict that cannot be pickled: TypeError: cannot pickle 'generator'"),
    "lock": (returns_unpicklable_on, ("lock",),
             r"^rank {bad} returned a lock that cannot be pickled: TypeError: cannot pickle '_thread.lock'"),
    "sigkill": (killed_on, (), r"^rank {bad} was killed by SIGKILL \(out of memory, or killed from outside\)"),
    "exit": (exits_on, (), r"^rank {bad} exited with code 3 before it returned"),
}


@pytest.mark.parametrize("mode, bad", [(m, 1) for m in FAILURES] + [("sigkill", 0)])
def test_every_failure_names_the_rank_it_happened_to_at_once(mode, bad):
    """The planted rank is named (not a peer that failed because of it), with what happened, before the
    launch's 30 s timeout: an unpicklable result is reported, not waited for."""
    fn, extra, pattern = FAILURES[mode]
    D.run_on_ranks(returns_tensors, 2)  # the fork server is up before counting children
    before = _children()
    with pytest.raises(D.RankError) as info:
        D.run_on_ranks(fn, 2, bad, *extra, timeout=30)
    assert info.value.rank == bad
    assert re.search(pattern.format(bad=bad), str(info.value)), str(info.value)
    if mode == "raises":
        assert "Traceback" in info.value.remote_traceback
    time.sleep(0.5)
    assert _children() <= before


def test_a_sigkilled_rank_is_blamed_every_time():
    """Its peer's "Connection reset by peer" arrives first about half of the time: it must never win."""
    for _ in range(3):
        with pytest.raises(D.RankError) as info:
            D.run_on_ranks(killed_on, 2, 1, timeout=30)
        assert info.value.rank == 1 and "SIGKILL" in str(info.value)


def test_a_rank_that_hangs_is_named_by_the_timeout():
    with pytest.raises(TimeoutError, match=r"^ranks \[1\] of 2 did not finish within 1.5 s \(ranks \[0\] returned\)"):
        D.run_on_ranks(hangs_on, 2, 1, timeout=1.5)


def test_a_function_the_ranks_cannot_import_is_named(monkeypatch):
    ghost = types.ModuleType("ghost_module_of_the_launcher_test")  # importable here only, not by the ranks

    def f(rank, world):
        return rank

    f.__module__, f.__qualname__ = ghost.__name__, "f"
    ghost.f = f
    monkeypatch.setitem(sys.modules, ghost.__name__, ghost)
    with pytest.raises(D.RankError, match=r"^rank [01] could not load fn=f: ModuleNotFoundError: .*ghost_module"
                                          r".*define it at the top level of a module the ranks can import"):
        D.run_on_ranks(f, 2, timeout=30)


def _notebook_main(monkeypatch):
    """Makes `__main__` look like a notebook's (no file, no spec) and returns a function defined in it."""
    main = types.ModuleType("__main__")

    def cell_fn(rank, world):
        return rank * 10

    cell_fn.__module__, cell_fn.__qualname__ = "__main__", "cell_fn"
    main.cell_fn = cell_fn
    monkeypatch.setitem(sys.modules, "__main__", main)
    return cell_fn


def test_a_notebook_function_is_refused_at_once_saying_where_to_define_it(monkeypatch):
    cell_fn = _notebook_main(monkeypatch)
    monkeypatch.setattr(D, "by_value_pickler", lambda: None)  # as without cloudpickle
    started = []
    monkeypatch.setattr(D, "_context", lambda module: started.append(module))
    with pytest.raises(ValueError, match=r"fn=cell_fn is defined in __main__ \(a notebook cell .*\), which the "
                                         r"ranks cannot import: define it in a .py file .*install cloudpickle"):
        D.run_on_ranks(cell_fn, 2)
    with pytest.raises(ValueError, match=r"fn=.*<lambda> cannot be sent to the ranks .*top level of a module"):
        D.run_on_ranks(lambda r, w: r, 2)
    with pytest.raises(ValueError, match=r"args\[1\] \(a generator\) cannot be sent to the ranks"):
        D.run_on_ranks(L.fail_on, 2, 0, (i for i in range(2)))
    assert not started  # refused before any rank was started


@pytest.mark.skipif(D.by_value_pickler() is None, reason="cloudpickle is not installed")
def test_a_notebook_function_runs_by_value_with_cloudpickle(monkeypatch):
    cell_fn = _notebook_main(monkeypatch)
    assert D.run_on_ranks(cell_fn, 2) == [0, 10]


PARENT = """
import sys
sys.path[:0] = [{root!r}, {tests!r}]
from helpers.parallel import distributed as D
import test_parallel_distributed as T
D.run_on_ranks(T.pid_then_deadlock, 2, {folder!r}, timeout=600)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=lambda s: s.name)
def test_ranks_and_fork_server_die_with_the_launching_process(sig, tmp_path):
    """A process that launched deadlocked ranks is killed: its fork server and every rank go with it, the
    rank that holds the GIL too (SIGKILL: the server ends, the kernel kills its ranks; SIGTERM: the
    launcher kills them itself, then ends by SIGTERM)."""
    script = PARENT.format(root=str(ROOT), tests=str(ROOT / "tests"), folder=str(tmp_path))
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=str(ROOT), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    watched: list[psutil.Process] = []
    try:
        end = time.monotonic() + 240
        while not all((tmp_path / f"rank{r}").exists() for r in range(2)):
            assert parent.poll() is None, parent.communicate()[0]
            assert time.monotonic() < end, "the ranks never started"
            time.sleep(0.1)
        ranks = [psutil.Process(int((tmp_path / f"rank{r}").read_text())) for r in range(2)]
        server = [c for c in psutil.Process(parent.pid).children() if "forkserver" in " ".join(c.cmdline())]
        assert len(server) == 1 and all(r.ppid() == server[0].pid for r in ranks)
        watched = ranks + server
        time.sleep(0.3)  # rank 0 is inside its barrier
        os.kill(parent.pid, sig)
        assert parent.wait(timeout=30) == -sig
        assert _gone(watched) == []
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for p in watched:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


def test_timeout_and_interrupt_leave_nothing():
    D.run_on_ranks(L.check_collectives, 2)
    before = _children()
    with pytest.raises(TimeoutError):
        D.run_on_ranks(L.sleep_forever, 2, timeout=1.5)
    # A learner's Ctrl-C reaches run_on_ranks through Python's default SIGINT handler. An earlier test in
    # the same pytest session can leave another handler in place (an asyncio runner's, say) that swallows
    # the signal: install the default for this test, and deliver the interrupt to the main thread
    # (interrupt_main), as a terminal's Ctrl-C would be.
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, _thread.interrupt_main)
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            D.run_on_ranks(L.sleep_forever, 2, timeout=60)
    finally:
        timer.join()
        signal.signal(signal.SIGINT, old)
    time.sleep(0.5)
    assert _children() <= before


# ---------------------------------------------------------------- torchrun

def _script_processes():
    return [p for p in psutil.process_iter(["cmdline"]) if "ddp_torchrun.py" in " ".join(p.info["cmdline"] or [])]


def test_torchrun_two_nodes_completes():
    out = D.torchrun_two_nodes(ROOT / "scripts" / "ddp_torchrun.py", ["--steps", "2", "--backend", "gloo"])
    assert [o["returncode"] for o in out] == [0, 0], out
    assert "parameters identical on every rank: True" in "".join(o["output"] for o in out)


def test_torchrun_failing_rank_fails_the_launch_and_leaves_nothing():
    out = D.torchrun_two_nodes(ROOT / "scripts" / "ddp_torchrun.py", ["--steps", "2", "--fail-rank", "1", "--backend", "gloo"])
    assert all(o["returncode"] != 0 for o in out)
    text = "".join(o["output"] for o in out)
    assert "planted failure on rank 1" in text and "rank      : 1" in text
    time.sleep(0.5)
    assert not _script_processes()


def test_torchrun_launch_where_a_rank_dies_and_another_hangs_ends_and_leaves_nothing():
    """Rank 1 dies after its work while rank 0 hangs. Rank 0's launcher either ends on its own (when
    the dead node's launcher hosted the rendezvous store) or is stopped `grace` s after the other
    failed; either way the call returns long before the hang would end, and no rank is left."""
    script = ROOT / "tests" / "fixtures" / "torchrun" / "one_rank_dies.py"
    t0 = time.monotonic()
    out = D.torchrun_two_nodes(script, grace=3.0, timeout=120.0)
    assert time.monotonic() - t0 < 100
    text = "".join(o["output"] for o in out)
    assert "rank 0 finished its work" in text and "rank 1 finished its work" in text
    assert all(o["returncode"] != 0 for o in out)
    time.sleep(0.5)
    assert not [p for p in psutil.process_iter(["cmdline"]) if "one_rank_dies.py" in " ".join(p.info["cmdline"] or [])]


def test_wait_all_stops_the_survivors_after_the_grace_period_and_kills_what_they_started(tmp_path):
    """One process fails at once; the other hangs, with a child in a session of its own (as torchrun
    starts its ranks). The hanging one is stopped `grace` s later and reported; the child is killed."""
    marker = f"course-wait-all-{os.getpid()}"
    hang = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', "
            f"'{marker}'], start_new_session=True); time.sleep(300)")
    procs = [subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(0.5); sys.exit(1)"]),
             subprocess.Popen([sys.executable, "-c", hang], start_new_session=True)]
    seen, t0 = {}, time.monotonic()
    try:
        stopped = D._wait_all(procs, seen, timeout=60.0, grace=2.0)
        took = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        D._kill_all(seen.values())
    assert stopped == {1} and procs[0].returncode == 1 and procs[1].returncode == -signal.SIGTERM
    assert 2.0 <= took < 30
    assert len(seen) == 1
    assert not [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


def test_wait_all_raises_on_its_timeout():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            D._wait_all([p], {}, timeout=0.5, grace=1.0)
    finally:
        p.kill()
        p.wait()


# ---------------------------------------------------------------- exercises refuse the course's own answer

def test_exercises_refuse_the_course_functions(capsys):
    """Passing the course's ring_schedule / zero_formula (or a lambda calling them) FAILs: write it yourself."""
    from helpers.course import check

    def own_ring(rank, world_size, step, phase):
        n = world_size
        if phase == "reduce-scatter":
            return (rank - step) % n, (rank - step - 1) % n
        return (rank + 1 - step) % n, (rank - step) % n

    for answer in (D.ring_schedule, lambda r, n, s, p: D.ring_schedule(r, n, s, p)):
        check.exercise("13.ring", answer)
        out = capsys.readouterr().out
        assert "FAIL" in out and "write it yourself" in out, out
    check.exercise("13.ring", own_ring)
    assert "PASS" in capsys.readouterr().out
    for answer in (lambda s, n, w: P.zero_formula(s, n, w)["total"], lambda s, n, w: L.plan(w, n, s)["total"]):
        check.exercise("13.zero", answer)
        out = capsys.readouterr().out
        assert "FAIL" in out and "write it yourself" in out, out
    check.exercise("13.zero", lambda s, n, w: 4 * n / (w if s >= 3 else 1) + 4 * n / (w if s >= 2 else 1)
                   + 8 * n / (w if s >= 1 else 1))
    assert "PASS" in capsys.readouterr().out
    check.exercise("13.bubble", 0.23)  # two digits are enough
    assert "PASS" in capsys.readouterr().out
    for answer in (P.bucket_assignment, lambda nb, b: P.bucket_assignment(nb, b)):
        check.exercise("13.bucket", answer)
        out = capsys.readouterr().out
        assert "FAIL" in out and "write it yourself" in out, out


def test_bucket_exercise_accepts_the_reference_and_refuses_a_planted_wrong_bucketing(capsys):
    from helpers.course import check
    from helpers.course.exercises import nb13

    def mine(nbytes, bucket_bytes):
        out, cur, size = [], [], 0
        for i, n in enumerate(nbytes):
            cur.append(i)
            size += n
            if size >= bucket_bytes:
                out, cur, size = out + [cur], [], 0
        return out + [cur] if cur else out

    check.exercise("13.bucket", mine)
    assert "PASS  13.bucket: all 6 cases" in capsys.readouterr().out
    check.exercise("13.bucket", lambda nbytes, b: [list(range(len(nbytes)))])  # everything in one bucket
    out = capsys.readouterr().out
    assert "FAIL" in out and "differ from the ones torch DDP builds" in out
    check.exercise("13.bucket", nb13._bucket_close_late)
    assert "FAIL" in capsys.readouterr().out
    for case in nb13._bucket_cases():  # the reference is torch's rule
        assert nb13._bucket_reference(*case.args) == nb13.torch_buckets(*case.args) == P.bucket_assignment(*case.args)


def test_bucket_assignment_is_torch_ddps():
    g = torch.Generator().manual_seed(0)
    from helpers.course.exercises import nb13
    for _ in range(20):
        sizes = [4 * int(x) for x in torch.randint(1, 600, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g)]
        limit = 4 * int(torch.randint(1, 900, (1,), generator=g))
        assert P.bucket_assignment(sizes, limit) == nb13.torch_buckets(sizes, limit)
    with pytest.raises(ValueError, match="bucket_bytes=0"):
        P.bucket_assignment([4], 0)


def test_list_parameters_accept_papermill_strings():
    assert L.positive_ints("MICROS", "[1, 2]") == [1, 2] and L.positive_ints("MICROS", (4,)) == [4]
    with pytest.raises(ValueError, match="MICROS='1 2' is a string.*-y"):
        L.positive_ints("MICROS", "1 2")
    with pytest.raises(ValueError, match="MICROS"):
        L.positive_ints("MICROS", "[0, 2]")
    with pytest.raises(ValueError, match="MICROS"):
        L.positive_ints("MICROS", [])


def test_collectives_notes_follow_the_numbers():
    sw = {"sizes": [1024, 2 ** 20], "ping": [1e-4, 1e-3], "ring": [4e-3, 8e-3], "torch": [7e-4, 4e-3],
          "torch_iqr": [0.1, 1.84]}
    notes = L.collectives_notes(sw, 2, 2e-4, 6e-10)
    assert "184%: noisy" in notes[0] and "likely" in notes[1] and "x the prediction" in notes[1]
    assert "likely pays Python overhead" in notes[2]
    calm = L.collectives_notes({**sw, "torch_iqr": [0.1, 0.2], "ring": [4.1e-4, 8e-3]}, 2, 2e-4, 6e-10)
    assert "steady enough" in calm[0] and "within 2x of its floor" in calm[2]


def test_rank_paired_needs_the_round_by_round_ratio_on_one_side_of_1():
    from helpers.measure import bench

    def timing(xs):
        return bench.Timing(*bench.quartiles(xs), xs)

    fast, slow = timing([1.0, 1.1, 1.2, 1.3, 1.4]), timing([1.5, 1.6, 1.7, 1.8, 1.9])
    s = L.rank_paired("A", fast, "B", slow)
    assert s.startswith("A was") and "round by round B / A 1.42x" in s
    from helpers.measure import protocol as P
    r = P.paired_ratio(slow, fast)
    assert (r.value, r.lo, r.hi) == bench.quartiles([1.5, 1.6 / 1.1, 1.7 / 1.2, 1.8 / 1.3, 1.9 / 1.4])
    # separated IQRs, but in 4 of 9 rounds B was the faster: slow rounds, not a ranking
    a, b = timing([3, 3, 1, 1, 1, 1, 1, 1, 1]), timing([1.5, 1.5, 0.5, 0.5, 1.5, 1.5, 1.5, 1.5, 1.5])
    from helpers.measure import protocol
    assert protocol.separated(a, b)
    d = L.rank_paired("A", a, "B", b)
    assert "cannot rank them" in d and "round by round" in d
