"""Ranks on one machine, collectives built from point-to-point messages, and the models that price them.

Launch: `run_on_ranks(fn, world_size, *args)` starts `world_size` processes, joins them into one
`torch.distributed` process group (gloo on a CPU, NCCL when `backend="nccl"`), calls
`fn(rank, world_size, *args)` in each and returns the list of their results, rank by rank. The processes
are forked from a fork server that imported torch and the first launch's module once, so only the first
launch in a Python process pays for `import torch`. `fn` and `args` travel to the ranks pickled by value,
and each result comes back the same way (tensors as copies in CPU memory), so nothing a rank returns
depends on the rank still being alive. `fn` must be importable by the ranks: a function defined with
`def` at the top level of a module (a notebook cell's function is sent by value when cloudpickle is
installed, and refused with a sentence saying where to define it when it is not).

What went wrong is said at once, about the rank it happened to, as a `RankError` naming that rank: a
rank that raised (with its traceback), a result that cannot be pickled (its type and why), a function
the rank could not load, a rank that died without returning (its signal or exit code). When several
ranks fail together, the one reported is the root cause: a rank that died (a signal other than SIGABRT,
or an exit without a word) before any rank that raised, since a peer's death makes the others raise
("Connection reset by peer") but never die; otherwise the earliest. On any failure, on `timeout`, on
Ctrl-C and on SIGTERM every rank is killed and reaped before `run_on_ranks` returns. If the launching
process itself dies (even by SIGKILL) its ranks die with it: each rank asks Linux for SIGKILL when its
parent (the fork server, which exits when the launcher does) dies, and watches a pipe held open by the
launcher. `torchrun_two_nodes` starts torchrun launchers that meet at a local rendezvous, one per
stand-in machine.

Collectives: `ring_all_reduce` is reduce-scatter then all-gather around a ring, from `isend`/`irecv`
only; `ring_schedule` is its index arithmetic as a pure function, and `simulate_ring` runs a schedule
in one process. `alpha_beta_fit` fits the latency-bandwidth model t = alpha + n * beta to measured
(bytes, seconds), `ring_model_time` prices a ring all-reduce with it, and `bus_bandwidth` follows the
nccl-tests convention (all-reduce algorithm bandwidth x 2(n-1)/n).
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import io
import multiprocessing as mp
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from multiprocessing import forkserver
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable, Sequence

import psutil
import torch
import torch.distributed as dist

from helpers.measure.params import positive

ROOT = Path(__file__).resolve().parents[2]
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


def all_gather_single(out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
    """`dist.all_gather_single` where the installed torch has it (2.10+), else `all_gather_into_tensor`."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, async_op=async_op)


def reduce_scatter_single(out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
    """`dist.reduce_scatter_single` (sum) where the installed torch has it, else `reduce_scatter_tensor`."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, async_op=async_op)


# ---------------------------------------------------------------- what travels between launcher and ranks

def by_value_pickler():
    """The cloudpickle module when it is installed (it pickles a notebook's functions by value), else None."""
    if importlib.util.find_spec("cloudpickle") is None:
        return None
    import cloudpickle  # optional: only a function defined in a notebook cell needs it
    return cloudpickle


def _main_is_importable() -> bool:
    """Whether a fork-server child re-imports `__main__` (a script run by path or with -m: multiprocessing's
    own rule), so that the ranks can load its functions by name; a notebook's or a prompt's cannot be."""
    main = sys.modules.get("__main__")
    return bool(getattr(getattr(main, "__spec__", None), "name", None) or getattr(main, "__file__", None))


class _Scan(pickle.Pickler):
    """A pickler that notes every function and class from `__main__` it pickles by reference."""

    def __init__(self, file):
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.from_main: list = []

    def reducer_override(self, obj):
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
            self.from_main.append(obj)
        return NotImplemented


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def rank_payload(fn: Callable, args: tuple) -> bytes:
    """`(fn, args)` pickled for the ranks; ValueError (one sentence naming the culprit) when they can't load it.

    By reference (plain pickle) when the ranks can import everything in it; by value with cloudpickle,
    when installed, for a function or class defined in a notebook cell or a lambda; refused otherwise.
    """
    buf = io.BytesIO()
    scan = _Scan(buf)
    try:
        scan.dump((fn, args))
        err = None
    except Exception as e:  # noqa: BLE001  PicklingError, TypeError, AttributeError ("local object"), ...
        err = e
    stranded = [] if _main_is_importable() else scan.from_main
    if err is None and not stranded:
        return buf.getvalue()
    cp = by_value_pickler()
    if cp is not None:
        try:
            return cp.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001
            err, stranded = e, []
    where = ("define it in a .py file (beside the notebook) and import it from there"
             + ("" if cp is not None else ", or install cloudpickle, which sends it by value"))
    if stranded:
        obj = stranded[0]
        what = f"fn={_name(fn)}" if obj is fn else f"{_name(obj)} (used by the arguments)"
        raise ValueError(f"run_on_ranks: {what} is defined in __main__ (a notebook cell or the interactive "
                         f"prompt), which the ranks cannot import: {where}")
    dumps = (cp or pickle).dumps
    try:
        dumps(fn, pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"run_on_ranks: fn={_name(fn)} cannot be sent to the ranks ({type(e).__name__}: {e}): "
                         f"use a function defined with def at the top level of a module; {where}") from None
    for i, a in enumerate(args):
        try:
            dumps(a, pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"run_on_ranks: args[{i}] (a {type(a).__name__}) cannot be sent to the ranks "
                             f"({type(e).__name__}: {e}): pass numbers, strings, lists, dicts or tensors") from None
    raise ValueError(f"run_on_ranks: the arguments cannot be sent to the ranks ({type(err).__name__}: {err})")


class _ResultPickler(pickle.Pickler):
    """Plain pickle (by value, no shared memory) that moves GPU tensors to CPU memory first."""

    def reducer_override(self, obj):
        if (type(obj) in (torch.Tensor, torch.nn.Parameter) and obj.device.type not in ("cpu", "meta")
                and (obj.is_leaf or not obj.requires_grad)):
            with torch.no_grad():
                moved = obj.detach().cpu()
            moved = torch.nn.Parameter(moved, obj.requires_grad) if type(obj) is torch.nn.Parameter \
                else moved.requires_grad_(obj.requires_grad)
            return moved.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        return NotImplemented


def result_bytes(value: Any) -> bytes:
    """`value` pickled by value as a rank sends it back: tensors become copies in CPU memory, so the bytes
    stay loadable after the rank exits. Raises what pickle raises for what cannot be pickled."""
    buf = io.BytesIO()
    _ResultPickler(buf, pickle.HIGHEST_PROTOCOL).dump(value)
    return buf.getvalue()


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
            out = _collect(procs, [r for r, _ in pipes], timeout, terminated, _name(fn))
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


# ---------------------------------------------------------------- the ring all-reduce

def ring_schedule(rank: int, world_size: int, step: int, phase: str) -> tuple[int, int]:
    """(chunk this rank sends to rank+1, chunk it receives from rank-1) at `step` of `phase`.

    phase "reduce-scatter" (steps 0..n-2): the received chunk is added to the local one; afterwards
    rank r holds the full sum of chunk (r+1) mod n. phase "all-gather" (steps 0..n-2): the received
    chunk replaces the local one, passing the finished sums around. Raises ValueError for a bad phase.
    """
    n = world_size
    if phase == "reduce-scatter":
        return (rank - step) % n, (rank - step - 1) % n
    if phase == "all-gather":
        return (rank + 1 - step) % n, (rank - step) % n
    raise ValueError(f"phase={phase!r}; choose 'reduce-scatter' or 'all-gather'")


def simulate_ring(inputs: Sequence[torch.Tensor], schedule: Callable = ring_schedule) -> list[torch.Tensor]:
    """Every rank's result of a ring all-reduce of `inputs` (one 1-D tensor per rank), in one process.

    Runs `schedule` step by step with each step's messages taken before any is applied, as on a real
    ring. Used to check a schedule without processes; equals `sum(inputs)` on every rank when right.
    """
    n = len(inputs)
    bufs = [list(torch.tensor_split(x.clone(), n)) for x in inputs]
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(n - 1):
            plan = [schedule(r, n, step, phase) for r in range(n)]
            sent = [bufs[r][plan[r][0]].clone() for r in range(n)]
            for r in range(n):
                recv = plan[r][1]
                incoming = sent[(r - 1) % n]
                bufs[r][recv] = bufs[r][recv] + incoming if phase == "reduce-scatter" else incoming
    return [torch.cat(b) for b in bufs]


def ring_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum `tensor` over all ranks in place with a ring: reduce-scatter, then all-gather.

    Each rank sends and receives 2(n-1) chunks of numel/n elements, the bandwidth-optimal volume
    2(n-1)/n x the tensor's bytes. Works on any shape and dtype (exact for integers; for floats the
    order of additions differs from `dist.all_reduce`'s, so results agree to rounding). Returns `tensor`.
    """
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    if n == 1:
        return tensor
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1)
    chunks = list(torch.tensor_split(flat, n))
    right, left = (rank + 1) % n, (rank - 1) % n
    if group is not None:
        right, left = dist.get_global_rank(group, right), dist.get_global_rank(group, left)
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(n - 1):
            send_i, recv_i = ring_schedule(rank, n, step, phase)
            incoming = torch.empty_like(chunks[recv_i])
            reqs = [dist.isend(chunks[send_i].contiguous(), right, group=group),
                    dist.irecv(incoming, left, group=group)]
            for r in reqs:
                r.wait()
            if phase == "reduce-scatter":
                chunks[recv_i].add_(incoming)
            else:
                chunks[recv_i].copy_(incoming)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return tensor


# ---------------------------------------------------------------- the alpha-beta model

def alpha_beta_fit(nbytes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """Least-squares (alpha s, beta s/byte) of t = alpha + n * beta, weighting each point by 1/t.

    Relative weighting keeps the small messages (which fix alpha) from being drowned by the large
    ones. Raises ValueError with fewer than two distinct sizes.
    """
    if len(set(nbytes)) < 2 or len(nbytes) != len(seconds):
        raise ValueError("alpha_beta_fit needs at least two distinct sizes, one time each")
    n = torch.tensor(nbytes, dtype=torch.float64)
    t = torch.tensor(seconds, dtype=torch.float64)
    A = torch.stack([torch.ones_like(n), n], 1) / t[:, None]
    sol = torch.linalg.lstsq(A, torch.ones_like(t)[:, None]).solution.flatten()
    return max(float(sol[0]), 0.0), max(float(sol[1]), 0.0)


def ring_model_time(nbytes: float, world_size: int, alpha: float, beta: float) -> float:
    """Predicted ring all-reduce seconds: 2(n-1) messages of nbytes/n, each alpha + size*beta."""
    n = world_size
    return 2 * (n - 1) * (alpha + nbytes / n * beta)


def bus_bandwidth(nbytes: float, seconds: float, world_size: int) -> float:
    """All-reduce bus bandwidth in GB/s, nccl-tests' convention: (nbytes / seconds) x 2(n-1)/n.

    It is comparable with a link's bandwidth: a ring all-reduce moves 2(n-1)/n of the buffer per rank.
    Raises ValueError unless seconds is a positive number and world_size a positive int.
    """
    positive("seconds", float(seconds) if type(seconds) is int else seconds, float)
    positive("world_size", world_size)
    return nbytes / seconds * 2 * (world_size - 1) / world_size / 1e9


# ---------------------------------------------------------------- torchrun

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
