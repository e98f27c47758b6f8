"""`torchrun_two_nodes`: two torchrun launchers at a local rendezvous complete a DDP run, a failing or dying
rank fails the launch, and no process is left; its wait stops the survivors after the grace period."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers.parallel import torchrun as TR

ROOT = Path(__file__).resolve().parents[2]


def _script_processes():
    return [p for p in psutil.process_iter(["cmdline"]) if "ddp_torchrun.py" in " ".join(p.info["cmdline"] or [])]


@pytest.mark.ranks
def test_torchrun_two_nodes_completes():
    out = TR.torchrun_two_nodes(ROOT / "scripts" / "ddp_torchrun.py", ["--steps", "2", "--backend", "gloo"])
    assert [o["returncode"] for o in out] == [0, 0], out
    assert "parameters identical on every rank: True" in "".join(o["output"] for o in out)


@pytest.mark.ranks
def test_torchrun_failing_rank_fails_the_launch_and_leaves_nothing():
    out = TR.torchrun_two_nodes(ROOT / "scripts" / "ddp_torchrun.py", ["--steps", "2", "--fail-rank", "1", "--backend", "gloo"])
    assert all(o["returncode"] != 0 for o in out)
    text = "".join(o["output"] for o in out)
    assert "planted failure on rank 1" in text and "rank      : 1" in text
    time.sleep(0.5)
    assert not _script_processes()


@pytest.mark.ranks
def test_torchrun_launch_where_a_rank_dies_and_another_hangs_ends_and_leaves_nothing():
    """Rank 1 dies after its work while rank 0 hangs. Rank 0's launcher either ends on its own (when
    the dead node's launcher hosted the rendezvous store) or is stopped `grace` s after the other
    failed; either way the call returns long before the hang would end, and no rank is left."""
    script = ROOT / "tests" / "fixtures" / "torchrun" / "one_rank_dies.py"
    t0 = time.monotonic()
    out = TR.torchrun_two_nodes(script, grace=3.0, timeout=120.0)
    assert time.monotonic() - t0 < 100
    text = "".join(o["output"] for o in out)
    assert "rank 0 finished its work" in text and "rank 1 finished its work" in text
    assert all(o["returncode"] != 0 for o in out)
    time.sleep(0.5)
    assert not [p for p in psutil.process_iter(["cmdline"]) if "one_rank_dies.py" in " ".join(p.info["cmdline"] or [])]


@pytest.mark.ranks
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
        stopped = TR._wait_all(procs, seen, timeout=60.0, grace=2.0)
        took = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        TR._kill_all(seen.values())
    assert stopped == {1} and procs[0].returncode == 1 and procs[1].returncode == -signal.SIGTERM
    assert 2.0 <= took < 30
    assert len(seen) == 1
    assert not [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


@pytest.mark.ranks
def test_wait_all_raises_on_its_timeout():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            TR._wait_all([p], {}, timeout=0.5, grace=1.0)
    finally:
        p.kill()
        p.wait()
