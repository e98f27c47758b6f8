"""The in-process stand-ins a notebook runs its cells' distributed code on: threads as ranks, one real rank."""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.parallel import collectives, ddp, in_process


@pytest.mark.parametrize("n, size", [(2, 6), (3, 7), (4, 10), (5, 3)])
def test_the_ring_on_threads_sums_exactly(n, size):
    xs = [torch.randint(-50, 50, (size,)) for _ in range(n)]
    outs = in_process.on_threads(collectives.ring_all_reduce, [(x.clone(),) for x in xs])
    assert all(torch.equal(o, sum(xs)) for o in outs)


def test_a_wrong_schedule_on_threads_gives_a_wrong_sum():
    def gathers_too_early(rank, world_size, step, phase):  # the all-gather reuses the reduce-scatter's chunks
        return collectives.ring_schedule(rank, world_size, step, "reduce-scatter")

    xs = [torch.arange(8) * (r + 1) for r in range(4)]
    outs = in_process.on_threads(collectives.ring_all_reduce, [(x.clone(), None, gathers_too_early) for x in xs])
    assert not all(torch.equal(o, sum(xs)) for o in outs)


def test_a_rank_that_raises_is_named():
    def fails_on_one(x):
        if dist.get_rank() == 1:
            raise ValueError("planted")
        return x

    with pytest.raises(RuntimeError, match="rank 1 .*ValueError: planted"):
        in_process.on_threads(fails_on_one, [(0,), (1,)])


def test_one_rank_runs_ddp_and_closes_its_group():
    model = nn.Linear(4, 3)
    with in_process.one_rank():
        wrapped = ddp.DDP(model, bucket_mb=1)
        wrapped(torch.ones(2, 4)).sum().backward()
        assert len(wrapped._handles) == 1  # the hook started the bucket during backward
        wrapped.finish_gradient_synchronization()
        with pytest.raises(RuntimeError, match="already in a process group"):
            with in_process.one_rank():
                pass
    assert not dist.is_initialized()
    torch.testing.assert_close(model.weight.grad, torch.full((3, 4), 2.0))
