"""Collectives built from point-to-point messages, and the models that price them.

`ring_all_reduce` is reduce-scatter then all-gather around a ring, from `isend`/`irecv` only;
`ring_schedule` is its index arithmetic as a pure function, and `simulate_ring` runs a schedule in one
process. `alpha_beta_fit` fits the latency-bandwidth model t = alpha + n * beta to measured (bytes,
seconds), `ring_model_time` prices a ring all-reduce with it, and `bus_bandwidth` follows the nccl-tests
convention (all-reduce algorithm bandwidth x 2(n-1)/n). `all_gather_single` and `reduce_scatter_single`
are torch's single-tensor collectives under the name the installed torch has.

Everything that takes a group runs inside a process group (`helpers.parallel.launch.run_on_ranks`, or torchrun).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist

from helpers.measure.params import positive


def all_gather_single(out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
    """`dist.all_gather_single` where the installed torch has it (2.10+), else `all_gather_into_tensor`."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, async_op=async_op)


def reduce_scatter_single(out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
    """`dist.reduce_scatter_single` (sum) where the installed torch has it, else `reduce_scatter_tensor`."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, async_op=async_op)


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


def ring_all_reduce(tensor: torch.Tensor, group=None, schedule: Callable = ring_schedule) -> torch.Tensor:
    """Sum `tensor` over all ranks in place with a ring: reduce-scatter, then all-gather.

    Each rank sends and receives 2(n-1) chunks of numel/n elements, the bandwidth-optimal volume
    2(n-1)/n x the tensor's bytes. Works on any shape and dtype (exact for integers; for floats the
    order of additions differs from `dist.all_reduce`'s, so results agree to rounding). `schedule` says
    which chunk goes right and which arrives from the left at each step (`ring_schedule`). Returns `tensor`.
    """
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    if n == 1:
        return tensor  # alone, the sum is already here
    # the buffer as n chunks: views, so adding into a chunk writes into `tensor` itself
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1)
    chunks = list(torch.tensor_split(flat, n))
    # every rank talks to two neighbours only: it sends right and receives from the left
    right, left = (rank + 1) % n, (rank - 1) % n
    if group is not None:  # send and recv want ranks in the whole world, not in the group
        right, left = dist.get_global_rank(group, right), dist.get_global_rank(group, left)
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(n - 1):
            # one chunk out, one chunk in: every link of the ring carries numel/n elements at once
            send_i, recv_i = schedule(rank, n, step, phase)
            incoming = torch.empty_like(chunks[recv_i])
            # both at once, asynchronous: a blocking send would wait for the right neighbour's receive,
            # which waits for its own send, all the way round the ring
            reqs = [dist.isend(chunks[send_i].contiguous(), right, group=group),
                    dist.irecv(incoming, left, group=group)]
            for r in reqs:
                r.wait()
            if phase == "reduce-scatter":
                chunks[recv_i].add_(incoming)  # one more rank's share added into this partial sum
            else:
                chunks[recv_i].copy_(incoming)  # a finished sum, passed on unchanged
    if flat.data_ptr() != tensor.data_ptr():  # a non-contiguous tensor was reduced in a copy
        tensor.copy_(flat.view_as(tensor))
    return tensor


def recursive_doubling_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum `tensor` over all ranks in place by recursive doubling: at step k every rank swaps its whole buffer
    with the rank whose number differs in bit k, and adds what it receives.

    log2(n) messages of the whole tensor: fewer latencies than the ring's 2(n-1), more bytes (log2(n) x the
    tensor against the ring's 2(n-1)/n x), so it wins on small messages and the ring on large ones. A world
    that is not a power of two first folds each extra rank into a partner (one message before, one after).
    Exact for integers; floats agree with `dist.all_reduce` to rounding, the same bits on every rank. Returns
    `tensor`.
    """
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    if n == 1:
        return tensor  # alone, the sum is already here

    def world_rank(r: int) -> int:  # send and recv want ranks in the whole world, not in the group
        return r if group is None else dist.get_global_rank(group, r)

    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1)
    incoming = torch.empty_like(flat)
    p2 = 1 << (n.bit_length() - 1)  # the largest power of two <= n: the ranks that do the doubling
    if rank >= p2:  # an extra rank: hands its buffer to rank - p2, then receives the finished sum from it
        dist.isend(flat, world_rank(rank - p2), group=group).wait()
        dist.recv(flat, world_rank(rank - p2), group=group)
    else:
        if rank + p2 < n:  # first fold in the extra rank's share
            dist.recv(incoming, world_rank(rank + p2), group=group)
            flat.add_(incoming)
        mask = 1
        while mask < p2:
            partner = world_rank(rank ^ mask)
            # swap whole buffers, both at once: a blocking send would wait for the partner's receive,
            # which waits for the partner's own send
            reqs = [dist.isend(flat, partner, group=group), dist.irecv(incoming, partner, group=group)]
            for r in reqs:
                r.wait()
            flat.add_(incoming)  # now the sum over 2 * mask ranks: this rank's group and the partner's
            mask <<= 1
        if rank + p2 < n:  # hand the finished sum back to the extra rank
            dist.isend(flat, world_rank(rank + p2), group=group).wait()
    if flat.data_ptr() != tensor.data_ptr():  # a non-contiguous tensor was reduced in a copy
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


def doubling_steps(world_size: int) -> int:
    """Messages one rank's recursive doubling sends in sequence: log2 of the largest power of two <= n, plus
    the fold before and after when n is not a power of two."""
    p2 = 1 << (world_size.bit_length() - 1)
    return p2.bit_length() - 1 + (2 if p2 != world_size else 0)


def doubling_model_time(nbytes: float, world_size: int, alpha: float, beta: float) -> float:
    """Predicted recursive-doubling all-reduce seconds: `doubling_steps` messages of the whole nbytes."""
    return doubling_steps(world_size) * (alpha + nbytes * beta)


def ring_doubling_crossover(world_size: int, alpha: float, beta: float) -> float:
    """The message size in bytes above which the α-β model prices the ring below recursive doubling: where
    2(n-1)(α + Nβ/n) = s(α + Nβ), s = `doubling_steps`. inf where doubling is never dearer (n = 2: one message
    of N against two of N/2), 0 where it never is cheaper."""
    n, s = world_size, doubling_steps(world_size)
    fewer_latencies, extra_bytes = (2 * (n - 1) - s) * alpha, (s - 2 * (n - 1) / n) * beta
    if extra_bytes <= 0:
        return float("inf")
    return max(0.0, fewer_latencies / extra_bytes)


def bus_bandwidth(nbytes: float, seconds: float, world_size: int) -> float:
    """All-reduce bus bandwidth in GB/s, nccl-tests' convention: (nbytes / seconds) x 2(n-1)/n.

    It is comparable with a link's bandwidth: a ring all-reduce moves 2(n-1)/n of the buffer per rank.
    Raises ValueError unless seconds is a positive number and world_size a positive int.
    """
    positive("seconds", float(seconds) if type(seconds) is int else seconds, float)
    positive("world_size", world_size)
    return nbytes / seconds * 2 * (world_size - 1) / world_size / 1e9
