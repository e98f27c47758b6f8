"""`run_on_ranks` on real gloo ranks: results come back, and every failure is named at once, about the rank it
happened to, with no process left behind (a timeout, Ctrl-C, SIGTERM or SIGKILL of the launching process
included). The failures are planted on a chosen rank by the rank functions of tests/parallel_support.py,
which the ranks can import."""
import _thread
import os
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

from helpers.parallel import launch as D
from parallel_support import (exits_on, fail_on, hangs_on, killed_on, returns_tensors, returns_unpicklable_on,
                              sleep_forever)

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


def test_run_on_ranks_validates():
    with pytest.raises(ValueError, match="world_size"):
        D.run_on_ranks(fail_on, 0, 0)
    with pytest.raises(ValueError, match="backend"):
        D.run_on_ranks(fail_on, 2, 0, backend="mpi")
    for bad in (float("nan"), float("inf"), 0, -1.0, "5", True):
        with pytest.raises(ValueError, match="timeout="):
            D.run_on_ranks(fail_on, 2, 0, timeout=bad)
    for bad in (-1, 0, 1.5):
        with pytest.raises(ValueError, match="threads="):
            D.run_on_ranks(fail_on, 2, 0, threads=bad)


@pytest.mark.ranks
def test_tensor_results_come_back_after_their_ranks_exit():
    out = D.run_on_ranks(returns_tensors, 2)
    assert [o["t"].tolist() for o in out] == [[0, 0, 0, 0], [0, 1, 2, 3]]
    assert type(out[1]["p"]) is torch.nn.Parameter and out[1]["p"].tolist() == [1.0, 1.0]


FAILURES = {  # mode: (fn, args after rank and world with the bad rank first, what the error says)
    "raises": (fail_on, (), r"planted failure on rank {bad}"),
    "unpicklable": (returns_unpicklable_on, ("generator",),
                    r"^rank {bad} returned a dict that cannot be pickled: TypeError: cannot pickle 'generator'"),
    "lock": (returns_unpicklable_on, ("lock",),
             r"^rank {bad} returned a lock that cannot be pickled: TypeError: cannot pickle '_thread.lock'"),
    "sigkill": (killed_on, (), r"^rank {bad} was killed by SIGKILL \(out of memory, or killed from outside\)"),
    "exit": (exits_on, (), r"^rank {bad} exited with code 3 before it returned"),
}


@pytest.mark.ranks
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


@pytest.mark.ranks
def test_a_sigkilled_rank_is_blamed_every_time():
    """Its peer's "Connection reset by peer" arrives first about half of the time: it must never win."""
    for _ in range(3):
        with pytest.raises(D.RankError) as info:
            D.run_on_ranks(killed_on, 2, 1, timeout=30)
        assert info.value.rank == 1 and "SIGKILL" in str(info.value)


@pytest.mark.ranks
def test_a_rank_that_hangs_is_named_by_the_timeout():
    with pytest.raises(TimeoutError, match=r"^ranks \[1\] of 2 did not finish within 1.5 s \(ranks \[0\] returned\)"):
        D.run_on_ranks(hangs_on, 2, 1, timeout=1.5)


@pytest.mark.ranks
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


PARENT = """
import sys
sys.path[:0] = [{root!r}, {tests!r}]
from helpers.parallel import launch
import parallel_support
launch.run_on_ranks(parallel_support.pid_then_deadlock, 2, {folder!r}, timeout=600)
"""


@pytest.mark.ranks
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


@pytest.mark.ranks
def test_timeout_and_interrupt_leave_nothing():
    D.run_on_ranks(returns_tensors, 2)
    before = _children()
    with pytest.raises(TimeoutError):
        D.run_on_ranks(sleep_forever, 2, timeout=1.5)
    # A learner's Ctrl-C reaches run_on_ranks through Python's default SIGINT handler. An earlier test in
    # the same pytest session can leave another handler in place (an asyncio runner's, say) that swallows
    # the signal: install the default for this test, and deliver the interrupt to the main thread
    # (interrupt_main), as a terminal's Ctrl-C would be.
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, _thread.interrupt_main)
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            D.run_on_ranks(sleep_forever, 2, timeout=60)
    finally:
        timer.join()
        signal.signal(signal.SIGINT, old)
    time.sleep(0.5)
    assert _children() <= before
