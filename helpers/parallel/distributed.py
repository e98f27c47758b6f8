"""Ranks on one machine, collectives built from point-to-point messages, and the models that price them.

Launch: `run_on_ranks(fn, world_size, *args)` starts `world_size` processes, joins them into one
`torch.distributed` process group (gloo on a CPU, NCCL when `backend="nccl"`), calls
`fn(rank, world_size, *args)` in each and returns the list of their results, rank by rank. `fn` must
be importable (a module-level function in `helpers`): the processes are forked from a fork server
that imported torch and the first launch's module once, so only the first launch in a Python process
pays for `import torch`. A rank that raises stops the launch: every other rank is killed and
`RankError` names the failed rank with its traceback. Ctrl-C kills every rank too. Nothing is left
behind. `torchrun_two_nodes` starts torchrun launchers that meet at a local rendezvous, one per
stand-in machine.

Collectives: `ring_all_reduce` is reduce-scatter then all-gather around a ring, from `isend`/`irecv`
only; `ring_schedule` is its index arithmetic as a pure function, and `simulate_ring` runs a schedule
in one process. `alpha_beta_fit` fits the latency-bandwidth model t = alpha + n * beta to measured
(bytes, seconds), `ring_model_time` prices a ring all-reduce with it, and `bus_bandwidth` follows the
nccl-tests convention (all-reduce algorithm bandwidth x 2(n-1)/n).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from helpers.measure.params import positive

ROOT = Path(__file__).resolve().parents[2]
_CTX = None


class RankError(RuntimeError):
    """A rank raised: `rank` is its number and `remote_traceback` its traceback as text."""

    def __init__(self, rank: int, remote_traceback: str):
        super().__init__(f"rank {rank} failed:\n{remote_traceback}")
        self.rank, self.remote_traceback = rank, remote_traceback


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it, so parallel runs differ)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _context(module: str):
    """The fork-server context; the first call starts it with torch, FSDP2 and `module` imported."""
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")  # forks from a clean server: safe with threads and CUDA
        # imported once in the server, not in every rank: torch and FSDP2's modules are slow to import
        preload = ["torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.device_mesh", __name__]
        if module not in ("__main__", __name__):
            preload.append(module)
        _CTX.set_forkserver_preload(preload)
    return _CTX


def all_gather_single(out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
    """`dist.all_gather_single` where the installed torch has it (2.10+), else `all_gather_into_tensor`."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, async_op=async_op)


def reduce_scatter_single(out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
    """`dist.reduce_scatter_single` (sum) where the installed torch has it, else `reduce_scatter_tensor`."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, async_op=async_op)


def _worker(rank: int, world_size: int, port: int, backend: str, threads: int, fn: Callable, args: tuple,
            results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(threads)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, rank=rank, world_size=world_size)
        out = fn(rank, world_size, *args)
    except BaseException:  # noqa: BLE001  every failure goes back to the parent with its traceback and time,
        # reported before the process group closes: closing it makes the other ranks fail too, later
        results.put((rank, False, (time.time(), traceback.format_exc())))
        return
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    results.put((rank, True, out))


def _first_failure(results, rank: int, value: tuple, grace: float = 1.0) -> RankError:
    """The failure that happened first among those reported within `grace` seconds: the root cause,
    not a rank that failed because its peer had gone (gloo's "Connection closed by peer")."""
    failures = {rank: value}
    end = time.monotonic() + grace
    while time.monotonic() < end:
        try:
            r, ok, v = results.get(timeout=max(0.01, end - time.monotonic()))
        except queue.Empty:
            break
        if not ok:
            failures[r] = v
    first = min(failures, key=lambda r: failures[r][0])
    others = sorted(r for r in failures if r != first)
    note = f"\n(ranks {others} failed after it)" if others else ""
    return RankError(first, failures[first][1] + note)


def run_on_ranks(fn: Callable, world_size: int, *args: Any, backend: str = "gloo", timeout: float = 300.0,
                 threads: int | None = None) -> list:
    """Run `fn(rank, world_size, *args)` on `world_size` new processes in one process group.

    Returns [result of rank 0, result of rank 1, ...] (results are pickled back). `threads`: intra-op
    threads per rank (None: the cores divided among the ranks, at least 1). Raises ValueError for a
    bad world_size/backend, RankError for the first rank that raised (with its traceback), TimeoutError
    when the ranks take longer than `timeout` seconds; in every case no rank is left running.
    """
    positive("world_size", world_size)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend={backend!r}; choose 'gloo' or 'nccl'")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"backend='nccl' needs a GPU per rank: {world_size} ranks, "
                         f"{torch.cuda.device_count()} GPU(s) visible")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = threads or max(1, cores // world_size)
    ctx = _context(getattr(fn, "__module__", None) or "__main__")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, backend, threads, fn, args, results),
                         daemon=True) for r in range(world_size)]
    out: dict[int, Any] = {}
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        while len(out) < world_size:
            try:
                rank, ok, value = results.get(timeout=0.2)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in out]
                if dead:
                    raise RankError(dead[0], f"process exited with code {procs[dead[0]].exitcode} "
                                             "before reporting (killed, or out of memory)") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world_size} ranks did not finish within {timeout:g} s") from None
                continue
            if not ok:
                raise _first_failure(results, rank, value)
            out[rank] = value
        for p in procs:
            p.join(timeout=10)
    finally:
        started = [p for p in procs if p.pid is not None]
        for p in started:
            if p.is_alive():
                p.kill()
        for p in started:
            p.join(timeout=5)
        results.close()
    return [out[r] for r in range(world_size)]


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
                       timeout: float = 180.0) -> list[dict[str, Any]]:
    """Start `nnodes` torchrun launchers (one process each) that meet at a c10d rendezvous on 127.0.0.1.

    Each stands in for one machine (`--node-rank` k). Returns one {"node", "returncode", "output"} per
    launcher. On timeout every launcher's process group is killed and TimeoutError raised.
    """
    torchrun = Path(sys.executable).with_name("torchrun")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    procs = []
    try:
        for k in range(nnodes):
            cmd = [str(torchrun), f"--nnodes={nnodes}", f"--node-rank={k}", "--nproc-per-node=1",
                   "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=course13",
                   "--max-restarts=0", str(script), *args]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          env=env, cwd=str(ROOT), start_new_session=True))
        deadline = time.monotonic() + timeout
        outs = []
        for k, p in enumerate(procs):
            text, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outs.append({"node": k, "returncode": p.returncode, "output": text})
        return outs
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"torchrun launch did not finish within {timeout:g} s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 9)
                except ProcessLookupError:
                    pass
                p.wait(timeout=10)
