"""Ranks on one machine: `run_on_ranks` starts them, runs a function in each and cleans up after them.

`run_on_ranks(fn, world_size, *args)` starts `world_size` processes, joins them into one
`torch.distributed` process group (gloo on a CPU, NCCL when `backend="nccl"`), calls
`fn(rank, world_size, *args)` in each and returns the list of their results, rank by rank. The processes
are forked from a fork server that imported torch and the first launch's module once, so only the first
launch in a Python process pays for `import torch`. `fn` and `args` travel to the ranks pickled by value,
and each result comes back the same way (tensors as copies in CPU memory), so nothing a rank returns
depends on the rank still being alive (`helpers.parallel.payload`). `fn` must be importable by the ranks:
a function defined with `def` at the top level of a module (a notebook cell's function is sent by value
when cloudpickle is installed, and refused with a sentence saying where to define it when it is not).

What went wrong is said at once, about the rank it happened to, as a `RankError` naming that rank: a
rank that raised (with its traceback), a result that cannot be pickled (its type and why), a function
the rank could not load, a rank that died without returning (its signal or exit code). When several
ranks fail together, the one reported is the root cause: a rank that died (a signal other than SIGABRT,
or an exit without a word) before any rank that raised, since a peer's death makes the others raise
("Connection reset by peer") but never die; otherwise the earliest. On any failure, on `timeout`, on
Ctrl-C and on SIGTERM every rank is killed and reaped before `run_on_ranks` returns. If the launching
process itself dies (even by SIGKILL) its ranks die with it: each rank asks Linux for SIGKILL when its
parent (the fork server, which exits when the launcher does) dies, and watches a pipe held open by the
launcher. Launching on several (stand-in) machines is `helpers.parallel.torchrun`.
"""
from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import pickle
import select
import signal
import socket
import sys
import threading
import time
import traceback
from multiprocessing import forkserver
from multiprocessing.connection import wait
from typing import Any, Callable

import torch
import torch.distributed as dist

from helpers.measure import heap
from helpers.measure.params import positive
from helpers.parallel.payload import fn_name, rank_payload, result_bytes

GRACE_S = 1.0  # after a first failure, how long the other ranks' reports are awaited to find the root cause
_CTX = None
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_SERVER_ENV = "HELPERS_RANKS_LAUNCHER_PID"  # set only while `_context` starts the fork server


class RankError(RuntimeError):
    """A rank failed: `rank` is its number, `remote_traceback` its traceback or what happened to it, as text.

    `str(error)` is `message` when given (one sentence naming the rank), else "rank k failed:" and the text.
    """

    def __init__(self, rank: int, remote_traceback: str, message: str | None = None):
        super().__init__(message or f"rank {rank} failed:\n{remote_traceback}")
        self.rank, self.remote_traceback = rank, remote_traceback


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it, so parallel runs differ)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _context(module: str):
    """The fork-server context with its server running; the first call sets the server to import torch,
    FSDP2 and `module`. The server is (re)started with this process's PID in its environment, which this
    module, imported in the server, reads to end the server when this process ends."""
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")  # forks from a clean server: safe with threads and CUDA
        # imported once in the server, not in every rank: torch and FSDP2's modules are slow to import
        preload = ["torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.device_mesh", __name__]
        if module not in ("__main__", __name__):
            preload.append(module)
        _CTX.set_forkserver_preload(preload)
    os.environ[_SERVER_ENV] = str(os.getpid())
    try:
        forkserver.ensure_running()  # returns at once when the server is up
    finally:
        os.environ.pop(_SERVER_ENV, None)
    return _CTX


def _server_exits_with_launcher() -> None:
    """In a fork server started by `_context` (the launcher's PID is in its environment, and it is this
    process's parent): a thread that ends the server as soon as the launcher process ends, so that the
    ranks it forked get their parent-death SIGKILL, even a rank stuck in native code that holds the GIL.
    (multiprocessing's own server outlives the launcher while any of its children lives.) Elsewhere, nothing."""
    launcher = os.environ.pop(_SERVER_ENV, None)
    if launcher is None or launcher != str(os.getppid()):
        return

    def watch(pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)  # readable once the process has ended (Linux 5.3+)
        except (AttributeError, OSError):
            fd = None
        if fd is not None:
            select.select([fd], [], [])
        else:
            while os.getppid() == pid:
                time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, args=(int(launcher),), name="fork server: launcher watch", daemon=True).start()


_server_exits_with_launcher()



# ---------------------------------------------------------------- a rank

def _die_with_launcher(lifeline) -> None:
    """Make this rank die when the launcher does: Linux's parent-death signal (SIGKILL when the fork
    server, this rank's parent, exits; it exits when the launcher does), and a thread that kills the rank
    when `lifeline` (a pipe the launcher holds open and never writes) reads end-of-file, on any system."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no prctl in this libc: the lifeline still works
            pass
        if os.getppid() != parent:  # the server died before the signal was armed
            os._exit(1)

    def watch():
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv_bytes()
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="run_on_ranks lifeline", daemon=True).start()


def _worker(rank: int, world_size: int, port: int, backend: str, threads: int, payload: bytes, conn,
            lifeline) -> None:
    """One rank: load (fn, args), join the group, run, send one report: ("ok", time, result bytes),
    ("raised", time, traceback), ("unpicklable", time, (type name, error)) or ("unloadable", time, error)."""
    _die_with_launcher(lifeline)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(threads)
    heap.keep_freed_memory()  # as in a notebook's process: a rank's timed steps pay no page faults for freed tensors
    try:
        fn, args = pickle.loads(payload)
    except BaseException as e:  # noqa: BLE001  a module or name the ranks cannot import
        conn.send(("unloadable", time.time(), f"{type(e).__name__}: {e}"))
        return
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, rank=rank, world_size=world_size)
        out = fn(rank, world_size, *args)
        try:
            report = ("ok", time.time(), result_bytes(out))
        except Exception as e:  # noqa: BLE001  pickle raises PicklingError, TypeError, RuntimeError (torch), ...
            report = ("unpicklable", time.time(), (type(out).__name__, f"{type(e).__name__}: {e}"))
        # sent before the process group closes: closing it makes the other ranks fail too, later
        conn.send(report)
    except BaseException:  # noqa: BLE001  every failure goes back to the parent with its traceback and time
        conn.send(("raised", time.time(), traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# ---------------------------------------------------------------- the launcher

def _death(rank: int, exitcode: int | None) -> str:
    """What happened to a rank that ended without a report, in words."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        why = " (out of memory, or killed from outside)" if -exitcode == signal.SIGKILL else ""
        return f"rank {rank} was killed by {name}{why} before it returned"
    return f"rank {rank} exited with code {exitcode} before it returned (os._exit, or a native library's exit)"


class _Terminated(BaseException):
    """SIGTERM reached the launcher: unwinds it so that its ranks are killed, then SIGTERM is delivered again."""


@contextlib.contextmanager
def _sigterm_unwinds(flag: list):
    """While inside, SIGTERM only appends to `flag` (the launcher's loop turns it into `_Terminated`); on the
    way out, once the ranks are killed and reaped, SIGTERM is raised again under the default handler, which
    ends the process as SIGTERM would have. Only in the main thread, and only when SIGTERM has its default
    handler (a program's own handler is left alone)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, lambda signum, frame: flag.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if flag:
            signal.raise_signal(signal.SIGTERM)


def _root_cause(failures: dict[int, tuple], name: str) -> RankError:
    """The RankError for the root cause among `failures` {rank: (kind, time, detail)} (see the module doc)."""
    def order(r):
        kind, t, detail = failures[r]
        killed = kind == "died" and detail != -signal.SIGABRT  # NCCL's watchdog aborts a rank whose peer failed
        return (not killed, t, r)

    first = min(failures, key=order)
    kind, _, detail = failures[first]
    others = sorted(r for r in failures if r != first)
    note = f" (ranks {others} failed too)" if others else ""
    if kind == "raised":
        return RankError(first, detail + (f"\n{note.strip()}" if note else ""))
    if kind == "unpicklable":
        type_name, error = detail
        text = (f"rank {first} returned a {type_name} that cannot be pickled: {error}; return plain data "
                f"(numbers, strings, lists, dicts, tensors){note}")
    elif kind == "unloadable":
        text = (f"rank {first} could not load fn={name}: {detail}; define it at the top level of a module "
                f"the ranks can import{note}")
    elif kind == "unreadable":
        text = f"the result of rank {first} could not be loaded in this process: {detail}{note}"
    else:
        text = _death(first, detail) + note
    return RankError(first, text, text)


def run_on_ranks(fn: Callable, world_size: int, *args: Any, backend: str = "gloo", timeout: float = 300.0,
                 threads: int | None = None) -> list:
    """Run `fn(rank, world_size, *args)` on `world_size` new processes in one process group.

    Returns [result of rank 0, result of rank 1, ...]: pickled back by value, tensors as CPU copies.
    `threads`: intra-op threads per rank (None: the cores divided among the ranks, at least 1).
    Raises ValueError at once for a bad world_size or backend, or for an `fn`/`args` the ranks could not
    load (a lambda, a notebook cell's function without cloudpickle, an open file); RankError naming the
    rank for a rank that raised, returned what cannot be pickled, could not load `fn`, or died (see the
    module doc for which rank is named when several fail); TimeoutError naming the unfinished ranks after
    `timeout` seconds. In every case, and on Ctrl-C or SIGTERM, no rank is left running.
    """
    positive("world_size", world_size)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise ValueError(f"timeout={timeout!r} must be a positive, finite number of seconds")  # NaN fails `0 <` too
    if threads is not None:
        positive("threads", threads)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend={backend!r}; choose 'gloo' or 'nccl'")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"backend='nccl' needs a GPU per rank: {world_size} ranks, "
                         f"{torch.cuda.device_count()} GPU(s) visible")
    payload = rank_payload(fn, args)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = threads or max(1, cores // world_size)
    ctx = _context(getattr(fn, "__module__", None) or "__main__")
    port = free_port()
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]
    lifeline_r, lifeline_w = ctx.Pipe(duplex=False)
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, backend, threads, payload, pipes[r][1],
                                               lifeline_r), daemon=True) for r in range(world_size)]
    terminated: list = []
    with _sigterm_unwinds(terminated):
        try:
            for p in procs:
                p.start()
            for _, w in pipes:  # the ranks hold the write ends now: a rank's death reads as end-of-file
                w.close()
            lifeline_r.close()
            out = _collect(procs, [r for r, _ in pipes], timeout, terminated, fn_name(fn))
            for p in procs:
                p.join(timeout=10)
        finally:
            started = [p for p in procs if p.pid is not None]
            for p in started:
                if p.is_alive():
                    p.kill()
            for p in started:
                p.join(timeout=5)
            for conn in [lifeline_w, lifeline_r] + [c for pair in pipes for c in pair]:
                conn.close()
    return out


def _collect(procs: list, readers: list, timeout: float, terminated: list, name: str) -> list:
    """Every rank's result, or the RankError of the root cause, reading reports and deaths as they happen."""
    n = len(procs)
    results: dict[int, Any] = {}
    failures: dict[int, tuple] = {}
    pending = set(range(n))
    deadline = time.monotonic() + timeout
    until = deadline
    while pending:
        if terminated:
            raise _Terminated
        now = time.monotonic()
        if now >= until:
            break
        waiting = {readers[r]: r for r in pending} | {procs[r].sentinel: r for r in pending}
        ready = {waiting[obj] for obj in wait(list(waiting), timeout=min(0.2, until - now))}
        for r in sorted(ready):
            report = None
            if readers[r].poll():
                with contextlib.suppress(EOFError, OSError):
                    report = readers[r].recv()
            if report is None:  # ended without a report; its exit status follows its pipe's end-of-file
                seen = time.time()
                procs[r].join(timeout=5)
                failures[r] = ("died", seen, procs[r].exitcode)
            elif report[0] == "ok":
                try:
                    results[r] = pickle.loads(report[2])
                except Exception as e:  # noqa: BLE001  a class the launcher cannot import, say
                    failures[r] = ("unreadable", report[1], f"{type(e).__name__}: {e}")
            else:
                failures[r] = report
            pending.discard(r)
        if failures and until == deadline:
            until = min(deadline, time.monotonic() + GRACE_S)
    if failures:
        raise _root_cause(failures, name)
    if pending:
        raise TimeoutError(f"ranks {sorted(pending)} of {n} did not finish within {timeout:g} s"
                           + (f" (ranks {sorted(results)} returned)" if results else ""))
    return [results[r] for r in range(n)]
