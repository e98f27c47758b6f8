"""helpers.course.processes: what the commands that start processes share: signals, descendants, one-line errors
for bad values and unwritable folders."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from helpers.course import processes


def test_a_bad_number_on_the_command_line_is_one_line(capsys):
    parser = processes.OneLineParser(prog="prog")
    parser.add_argument("--budget-s", type=processes.positive_argument(float))
    parser.add_argument("--jobs", type=processes.positive_argument(int))
    assert parser.parse_args(["--budget-s", "2.5", "--jobs", "3"]).budget_s == 2.5
    for argv in (["--budget-s", "nan"], ["--budget-s", "inf"], ["--budget-s=-1e999"], ["--budget-s", "0"],
                 ["--budget-s", "-3"], ["--budget-s", "soon"], ["--jobs", "1.5"], ["--jobs", "0"]):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("prog: error: argument"), (argv, err)
        assert argv[-1].split("=")[-1] in err


def test_folder_problem_says_why_a_folder_cannot_be_written(tmp_path):
    assert processes.folder_problem(tmp_path / "new" / "deeper") == "" and (tmp_path / "new" / "deeper").is_dir()
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a path under a regular file: not writable even for root
    problem = processes.folder_problem(blocker / "out")
    assert str(blocker) in problem and ("Not a directory" in problem or "File exists" in problem)


@pytest.mark.slow
def test_descendants_and_end_group_leave_nothing_running(tmp_path):
    """A group leader with a child that ignores SIGTERM and a grandchild in a session of its own: end_group
    kills the group (SIGKILL after the leader is gone), Descendants.kill the one that left the session."""
    code = ("import os, signal, subprocess, sys, time\n"
            "ignore = 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'\n"
            "a = subprocess.Popen([sys.executable, '-c', ignore])\n"
            "b = subprocess.Popen([sys.executable, '-c', ignore], start_new_session=True)\n"
            f"open({str(tmp_path / 'pids')!r}, 'w').write(f'{{a.pid}} {{b.pid}}')\n"
            "time.sleep(600)\n")
    leader = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "pids").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        seen = processes.Descendants(leader.pid)
        seen.watch()
        assert len(seen.known) == 2
        procs = list(seen.known.values())
        processes.end_group(leader.pid, lambda: leader.poll() is None, 5.0)
        leader.wait(timeout=10)
        seen.kill()
        gone, alive = psutil.wait_procs(procs, timeout=10)
        assert not alive
    finally:  # whatever happened above, nothing this test started stays
        if leader.poll() is None:
            leader.kill()
            leader.wait()
        if (tmp_path / "pids").exists():
            for pid in map(int, (tmp_path / "pids").read_text().split()):
                try:
                    psutil.Process(pid).kill()
                except psutil.Error:
                    pass


def test_stop_sets_a_flag_and_the_exit_status(capsys):
    with processes.Stop("the test's processes") as stop:
        assert stop.code(1) == 1
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not stop.why and time.monotonic() < deadline:
            time.sleep(0.01)
    assert stop.why == "SIGTERM" and stop.code(1) == 143
    assert "SIGTERM received: stopping the test's processes" in capsys.readouterr().out
