"""What every course command that starts processes shares: `helpers.course.run`, `helpers.course.strip`, and the
maintainers' `tools.capture` commands.

* `Stop`: SIGINT and SIGTERM set a flag the command's loop reads; the command ends what it started, writes
  what finished and exits 128 + the signal's number (130, 143);
* `Descendants`, `end_group`: every process seen below one, and a process group ended (SIGTERM, then SIGKILL
  after a grace period), so that none outlives the command;
* `OneLineParser`, `positive_argument`: a bad command-line value is one line and exit status 2;
* `folder_problem`, `write_problem`: an output folder that cannot be written (or has no room), and an output
  that could not be written after the work, in words.
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Callable

import psutil

from helpers.measure.params import positive


def quietly(action) -> None:
    """Run a psutil action on a process that may already be gone."""
    try:
        action()
    except psutil.Error:
        pass


class Stop:
    """SIGINT and SIGTERM handlers that set a flag the run loop reads, instead of raising mid-write.

    `what` names what the command stops (printed when the signal arrives); `why` is the signal's name
    once one came, `signum` its number, and `code(otherwise)` the exit status: 128 + signum after a
    signal (130 for SIGINT, 143 for SIGTERM), else `otherwise`.
    """

    def __init__(self, what: str = "the running notebooks and their kernels"):
        self.what, self.why, self.signum, self.old = what, "", 0, {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self.old[sig] = signal.signal(sig, self.handle)
            except ValueError:  # not the main thread: signals cannot be handled here
                pass
        return self

    def handle(self, signum, frame):
        if not self.why:
            self.why, self.signum = signal.Signals(signum).name, signum
            print(f"\n{self.why} received: stopping {self.what}...", flush=True)

    def code(self, otherwise: int) -> int:
        """The exit status: 128 + the signal's number if one stopped the command, else `otherwise`."""
        return 128 + self.signum if self.why else otherwise

    def __exit__(self, *exc):
        for sig, old in self.old.items():
            signal.signal(sig, old)


class Descendants:
    """Every process ever seen below process `pid` (those in sessions of their own, such as kernels and
    goal processes, included), so that none outlives it: `watch` remembers them, `kill` ends those still
    running (psutil checks each one's start time, so a reused PID is never hit)."""

    def __init__(self, pid: int):
        self.pid, self.known = pid, {}

    def watch(self) -> None:
        try:
            for child in psutil.Process(self.pid).children(recursive=True):
                self.known.setdefault(child.pid, child)
        except psutil.Error:  # the root has exited: what it started is remembered already
            pass

    def kill(self, timeout: float = 5.0) -> None:
        """SIGKILL every remembered process still running and wait up to `timeout` s for them to go."""
        alive = [p for p in self.known.values() if p.is_running()]
        for p in alive:
            quietly(p.kill)
        psutil.wait_procs(alive, timeout=timeout)


def end_group(pid: int, running: Callable[[], bool], grace: float) -> None:
    """End process group `pid` (a process started in a session of its own, and what it started there):
    SIGTERM, up to `grace` seconds while `running()` is true, then SIGKILL to whatever of the group is
    left, even once its leader has exited."""
    kill_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while running() and time.monotonic() < deadline:
        time.sleep(0.1)
    kill_group(pid, signal.SIGKILL)


def kill_group(pid: int, sig: int) -> None:
    """Send `sig` to the process group `pid` leads; nothing when it is gone or not ours."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr, "PROG: error: MESSAGE (see --help)", exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_argument(kind: type = float):
    """An argparse `type`: a finite number of `kind` (float or int) > 0, else one sentence naming the text
    (nan, inf, 0, a negative number and a word are all refused before anything runs)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if kind is int else ''}number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; give one above 0")
        try:
            return positive(text, value, kind)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text} must be above 0") from None
    parse.__name__ = f"positive {kind.__name__}"
    return parse


NEED_FREE = 64 * 1024 * 1024  # what a command's output folder must have free before the work starts


def folder_problem(path: Path, need_bytes: int = NEED_FREE) -> str:
    """'' if `path` is (or can be made) a folder this process can write `need_bytes` into, else why not, in words.

    It creates the folder, writes and syncs a small file in it and removes it (permission bits alone do not
    answer for root, a read-only mount or a path under a regular file), then asks the file system how much is
    free: a full disk lets an empty file be made and fails the first real write, after the work."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path) as probe:
            probe.write(b"\0" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
        free = shutil.disk_usage(path).free
    except OSError as err:
        return f"{err.filename or path}: {err.strerror or err}"
    if free < need_bytes:
        return f"{path}: only {free / 2**20:.1f} MiB free, and the output needs about {need_bytes / 2**20:.0f} MiB"
    return ""


def write_problem(err: OSError, what: Path, kept: Path | None = None) -> str:
    """One line for an output that could not be written after the work: what, why, and where the work is kept."""
    why = err.strerror or str(err)
    return f"could not write {what}: {why}" + (f"; the work is kept in {kept}" if kept is not None else "")


