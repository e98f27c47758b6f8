"""torchrun launchers on one machine, each standing in for a machine of a cluster: `torchrun_two_nodes`.

The launchers meet at a c10d rendezvous on 127.0.0.1, as the launchers of a real multi-node job meet at
node 0's address; each runs one rank of the script (`scripts/ddp_torchrun.py` in notebook 13). Waiting
and cleanup are the point: once a launcher has failed, the others get a grace period, then they are
stopped, and every rank any of them started is killed, so no process outlives the call. `ROOT` is the
repository, the launchers' working directory and the first entry of their PYTHONPATH.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import psutil

from helpers.parallel.launch import free_port

ROOT = Path(__file__).resolve().parents[2]


def torchrun_two_nodes(script: str | os.PathLike, args: Sequence[str] = (), nnodes: int = 2,
                       timeout: float = 180.0, grace: float = 20.0) -> list[dict[str, Any]]:
    """Start `nnodes` torchrun launchers (one process each) that meet at a c10d rendezvous on 127.0.0.1.

    Each stands in for one machine (`--node-rank` k). Returns one {"node", "returncode", "output"} per
    launcher. Once a launcher has failed, the others get `grace` seconds to end on their own (a launcher
    whose ranks finished can wait up to 300 s at torchrun's exit barrier for the failed one, and a rank
    stuck in its own work keeps its launcher running), then they are stopped (SIGTERM, which torchrun
    passes to its ranks, then SIGKILL 5 s later), with a line in the output saying why. On timeout every
    launcher is stopped and TimeoutError raised. No rank outlives the call: torchrun starts each rank in
    a session of its own, out of reach of a signal to the launcher's, so each rank seen is killed too.
    """
    torchrun = Path(sys.executable).with_name("torchrun")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    procs, logs, seen = [], [], {}  # seen: pid -> psutil.Process of every rank a launcher started
    try:
        for k in range(nnodes):
            cmd = [str(torchrun), f"--nnodes={nnodes}", f"--node-rank={k}", "--nproc-per-node=1",
                   "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=course13",
                   "--max-restarts=0", str(script), *args]
            logs.append(tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace"))
            procs.append(subprocess.Popen(cmd, stdout=logs[-1], stderr=subprocess.STDOUT, text=True,
                                          env=env, cwd=str(ROOT), start_new_session=True))
        stopped = _wait_all(procs, seen, timeout, grace)
        outs = []
        for k, (p, log) in enumerate(zip(procs, logs)):
            log.seek(0)
            text = log.read()
            if k in stopped:
                text += (f"\n[stopped by the course: another node failed and this launcher had not ended "
                         f"{grace:g} s later]\n")
            outs.append({"node": k, "returncode": p.returncode, "output": text})
        return outs
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"torchrun launch did not finish within {timeout:g} s") from None
    finally:
        _note_descendants(procs, seen)
        for p in procs:
            if p.poll() is None:
                _stop(p)
        _kill_all(seen.values())
        for log in logs:
            log.close()


def _wait_all(procs: Sequence[subprocess.Popen], seen: dict, timeout: float, grace: float) -> set[int]:
    """Wait for every process; once one has failed, stop (`_stop`) those still running `grace` s later.

    Notes each process's descendants in `seen` as it goes. Returns the indices of the processes it
    stopped. Raises subprocess.TimeoutExpired when they are not all done within `timeout` s (the caller
    stops what is left).
    """
    deadline, stop_at, stopped = time.monotonic() + timeout, None, set()
    while [p.poll() for p in procs].count(None):  # polls every process, so each returncode is current
        _note_descendants(procs, seen)
        now = time.monotonic()
        if now > deadline:
            raise subprocess.TimeoutExpired([p.args for p in procs], timeout)
        if stop_at is None and any(p.returncode not in (None, 0) for p in procs):
            stop_at = now + grace
        if stop_at is not None and now > stop_at:
            for k, p in enumerate(procs):
                if p.poll() is None:
                    _stop(p)
                    stopped.add(k)
        time.sleep(0.1)
    return stopped


def _note_descendants(procs: Sequence[subprocess.Popen], seen: dict[int, psutil.Process]) -> None:
    """Add to `seen` every live descendant of the running launchers (pid -> psutil.Process)."""
    for p in procs:
        try:
            for child in psutil.Process(p.pid).children(recursive=True):
                seen.setdefault(child.pid, child)
        except psutil.Error:
            pass


def _stop(p: subprocess.Popen, patience: float = 5.0) -> None:
    """SIGTERM the process group `p` leads (its session); SIGKILL it `patience` s later; reap `p`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=patience)
            return
        except subprocess.TimeoutExpired:
            continue
    p.wait(timeout=10)


def _kill_all(procs) -> None:
    """SIGKILL every psutil.Process in `procs` still running (psutil tells a reused pid apart) and reap it."""
    alive = []
    for q in procs:
        try:
            if q.is_running():
                q.kill()
                alive.append(q)
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=10)
