"""The course's CPU clock: the thread's own CPU time, tallied, and chosen by bench on one torch thread."""
import os
import subprocess
import sys
import time

import pytest
import torch

from helpers.measure import bench, clock, protocol
from helpers.measure.results import load_results, summary


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    clock.reset()
    yield
    torch.set_num_threads(before)
    clock.reset()


def _spin(seconds: float) -> None:
    """Busy work on this thread for about `seconds` of its own CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_stopwatch_leaves_out_the_time_the_thread_waits(one_thread):
    with clock.Stopwatch() as sw:
        time.sleep(0.05)
        _spin(0.02)
    assert sw.wall >= 0.07 and 0.015 <= sw.cpu < 0.05
    assert sw.reading.share < 0.7
    assert clock.tally()["timings"] == 1 and clock.share() == pytest.approx(sw.cpu / sw.wall, rel=1e-3)
    with clock.Stopwatch(tally=False):
        time.sleep(0.01)
    assert clock.tally()["timings"] == 1


def test_a_stopwatch_can_count_reaped_child_processes(one_thread):
    with clock.Stopwatch(children=True) as kids, clock.Stopwatch() as alone:
        subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.2\n"
                                              "while time.process_time() < end: pass"], check=True)
    assert kids.cpu >= 0.15 > alone.cpu


def test_bench_reads_the_thread_clock_on_one_thread_and_the_wall_clock_on_more(one_thread):
    t = bench.benchmark(lambda: time.sleep(0.01), warmup=0, reps=3, device="cpu")
    assert t.clock == clock.THREAD and t.median < 0.005 and len(t.wall) == 3 and min(t.wall) >= 0.009
    assert t.ran_share is not None and t.ran_share < 0.5
    assert clock.tally()["timings"] == 3  # the timer's own calibration is not tallied
    torch.set_num_threads(2)
    assert bench.benchmark(lambda: time.sleep(0.01), warmup=0, reps=2, device="cpu").clock == clock.WALL
    with pytest.raises(ValueError, match="one thread"):
        bench.benchmark(lambda: None, reps=1, device="cpu", clock="thread")
    with pytest.raises(ValueError, match="choose"):
        bench.resolve_clock("cpu", "sundial")
    assert bench.resolve_clock("cuda", "wall") == clock.EVENTS


def test_a_resolved_clock_passed_back_resolves_to_itself(one_thread):
    # protocol.device_timer resolves its clock once and hands the name to bench.benchmark, which resolves it
    # again: on CUDA that name is "cuda events", so every name resolve_clock returns must be accepted back
    for device in ("cpu", "cuda"):
        for asked in ("auto", "wall", "thread"):
            read = bench.resolve_clock(device, asked)
            assert bench.resolve_clock(device, read) == read, (device, asked, read)
    assert bench.resolve_clock("cuda", clock.EVENTS) == clock.EVENTS
    with pytest.raises(ValueError, match="CUDA GPU only"):
        bench.resolve_clock("cpu", clock.EVENTS)


def test_interleaved_and_protocol_timings_say_which_clock_they_read(one_thread):
    fns = {"a": lambda: _spin(0.001), "b": lambda: _spin(0.002)}
    assert {t.clock for t in bench.benchmark_interleaved(fns, reps=3, device="cpu").values()} == {clock.THREAD}
    c = protocol.compare(fns, device="cpu", min_reps=3, max_reps=3)
    assert {t.clock for t in c.timings.values()} == {clock.THREAD}
    w = protocol.compare(fns, device="cpu", min_reps=3, max_reps=3, timing_clock="wall")
    assert {t.clock for t in w.timings.values()} == {clock.WALL}


def test_the_summary_records_the_share_and_prints_the_clock_sentence(one_thread, tmp_path, capsys):
    from helpers.measure import results

    results.configure(tmp_path, "smoke")
    clock.add(0.46, 1.0)
    assert summary("00", "what it measured", {"x": (1.0, "")}) is None  # a cell ending with it shows no dict
    rec = load_results(tmp_path)["summary-00"]["metrics"]
    assert rec["clock"]["share"] == pytest.approx(0.46) and rec["clock"]["timings"] == 1
    out = capsys.readouterr().out
    assert "it ran 46% of the wall time: the machine was shared" in out
    assert "seldom interrupted" in clock.describe_share(0.95)
    assert clock.describe_share(None).startswith("no CPU timing")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity to share one core")
def test_the_thread_clock_holds_while_another_process_steals_the_core(one_thread):
    """Quiet, then with a busy process pinned to the same core: the wall median must rise (the core really was
    shared), and the thread-clock median must stay within 1.3x of the quiet one."""
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    a, b = torch.randn(192, 192), torch.randn(192, 192)

    def work():
        for _ in range(20):
            a @ b

    os.sched_setaffinity(0, {core})
    hog = None
    try:
        quiet = bench.benchmark(work, warmup=3, reps=15, device="cpu")
        hog = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"])
        time.sleep(0.3)  # let it start spinning
        busy = bench.benchmark(work, warmup=3, reps=15, device="cpu")
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        os.sched_setaffinity(0, before)
    assert quiet.clock == busy.clock == clock.THREAD
    quiet_wall, busy_wall = sorted(quiet.wall)[7], sorted(busy.wall)[7]
    assert busy_wall > 1.4 * quiet_wall, "the busy process did not take the core: the test proves nothing"
    assert busy.median < 1.3 * quiet.median, f"thread clock moved {busy.median / quiet.median:.2f}x under load"


def test_a_probe_reads_the_contention_without_joining_the_tally(one_thread):
    reading = clock.probe(50_000)
    assert reading.cpu > 0 and reading.wall >= reading.cpu * 0.99 and 0 < reading.share <= 1.0
    assert clock.tally()["timings"] == 0
    with pytest.raises(ValueError, match="positive int"):
        clock.probe(0)
