"""Running a notebook cell's distributed code inside the notebook's own process, where no rank can run it.

The ranks of `helpers.parallel.launch.run_on_ranks` are other processes: they load their functions from
`helpers` modules, so a function defined in a notebook cell never runs there. Two stand-ins let the cell's
own definition run here instead:

- `on_threads(fn, per_rank_args)` runs `fn` on one thread per rank, with `dist` in its globals replaced by
  `ThreadRanks`: the point-to-point calls a ring makes (`isend`, `irecv`, `recv`, `get_rank`,
  `get_world_size`, `get_global_rank`), delivered through queues between the threads. The code object is
  `fn`'s own; only where the name `dist` leads changes.
- `one_rank()` opens a real gloo process group of one rank in this process (an in-memory store, no port),
  for code whose logic needs no second rank: with one rank an all-reduce returns its input unchanged.
"""
from __future__ import annotations

import contextlib
import queue
import threading
import types
from typing import Callable, Sequence

import torch
import torch.distributed as dist

WAIT_S = 30.0  # a receive that waits longer than this raises: a schedule whose messages do not pair up


class _Done:
    """The handle of a send that has been delivered already."""

    def wait(self) -> bool:
        return True


class _Receive:
    """The handle of a receive: `wait()` takes the next message from `src` and copies it into the tensor."""

    def __init__(self, box: queue.Queue, tensor: torch.Tensor, src: int):
        self.box, self.tensor, self.src = box, tensor, src

    def wait(self) -> bool:
        try:
            message = self.box.get(timeout=WAIT_S)
        except queue.Empty:
            raise TimeoutError(f"no message from rank {self.src} within {WAIT_S:g} s") from None
        if message.shape != self.tensor.shape:
            raise ValueError(f"a message of shape {tuple(message.shape)} from rank {self.src} into a tensor of "
                             f"shape {tuple(self.tensor.shape)}")
        self.tensor.copy_(message)
        return True


class ThreadRanks:
    """The point-to-point part of `torch.distributed` for `world_size` ranks that are threads of one process.

    Each ordered pair (src, dst) has its own queue, so messages between two ranks arrive in the order they
    were sent, as on a real link; a send copies its tensor at once (the sender may reuse it). Groups are the
    whole world: `get_global_rank(group, r)` is r.
    """

    def __init__(self, world_size: int):
        self.world_size = world_size
        self._local = threading.local()
        self._boxes = {(s, d): queue.Queue() for s in range(world_size) for d in range(world_size)}

    def get_world_size(self, group=None) -> int:
        return self.world_size

    def get_rank(self, group=None) -> int:
        return self._local.rank

    def get_global_rank(self, group, rank: int) -> int:
        return rank

    def isend(self, tensor: torch.Tensor, dst: int, group=None) -> _Done:
        self._boxes[(self.get_rank(), dst)].put(tensor.detach().clone())
        return _Done()

    def irecv(self, tensor: torch.Tensor, src: int, group=None) -> _Receive:
        return _Receive(self._boxes[(src, self.get_rank())], tensor, src)

    def recv(self, tensor: torch.Tensor, src: int, group=None) -> int:
        self.irecv(tensor, src).wait()
        return src


def on_threads(fn: Callable, per_rank_args: Sequence[tuple]) -> list:
    """[fn(*per_rank_args[r]) for every rank r], each call on its own thread, all at once, with the name
    `dist` in fn's globals leading to a `ThreadRanks` of len(per_rank_args) ranks.

    fn runs as written (its own code, its other globals); the threads stand in for processes. Raises the
    first rank's exception, naming the rank, if any rank raised.
    """
    ranks = ThreadRanks(len(per_rank_args))
    bound = types.FunctionType(fn.__code__, {**fn.__globals__, "dist": ranks}, fn.__name__, fn.__defaults__,
                               fn.__closure__)
    bound.__kwdefaults__ = fn.__kwdefaults__
    results: list = [None] * len(per_rank_args)
    errors: list = [None] * len(per_rank_args)

    def run(rank: int) -> None:
        ranks._local.rank = rank
        try:
            results[rank] = bound(*per_rank_args[rank])
        except BaseException as e:  # reported below, from the launching thread
            errors[rank] = e

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(len(per_rank_args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for rank, e in enumerate(errors):
        if e is not None:
            raise RuntimeError(f"rank {rank} (a thread) raised {type(e).__name__}: {e}") from e
    return results


@contextlib.contextmanager
def one_rank():
    """A gloo process group of one rank in this process, for the duration of the `with` block.

    Raises RuntimeError if this process is already in a process group (its code would run there instead).
    """
    if dist.is_initialized():
        raise RuntimeError("this process is already in a process group; one_rank() opens its own")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
