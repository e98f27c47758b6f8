"""ZeRO-1 and ZeRO-2 (`ShardedOptimizer`) against torch's DDP with ZeroRedundancyOptimizer on the module zoo of
tests/parallel_support.py (one start of 2 gloo ranks for every pair), and the ZeRO paper's formulas."""
import pytest
import torch

from helpers.parallel import ddp, launch
from helpers.parallel import zero as Z
from parallel_support import (LR, ZOO, batches, build, build_on_rank, check_agreement, run_matrix, snapshot,
                              torch_ddp, train)

ZERO_REFERENCE = "torch ddp find_unused + ZeroRedundancyOptimizer"


def ours_zero(kind, rank, world, stage):
    m = build_on_rank(kind, rank)
    if stage == 1:
        d = ddp.DDP(m, find_unused_parameters=True)
        opt = Z.ShardedOptimizer(m.parameters(), torch.optim.SGD, lr=LR, momentum=0.9)
        train(d, opt, batches(kind, world), rank, world, d.finish_gradient_synchronization)
    else:
        ddp.broadcast_module(m)
        opt = Z.ShardedOptimizer(m.parameters(), torch.optim.SGD, lr=LR, momentum=0.9)
        train(m, opt, batches(kind, world), rank, world, opt.reduce_gradients)
    out = snapshot(m.named_parameters())
    if stage == 2:  # a rank keeps only the gradients it owns: check_agreement compares those
        out["owned"] = sorted(n for n, p in m.named_parameters() if any(p is q for q in opt.owned))
    return out


REFERENCES = {ZERO_REFERENCE: lambda k, r, w: torch_ddp(k, r, w, True, zero=True)}
WRAPPERS = {"zero-1": (lambda k, r, w: ours_zero(k, r, w, 1), ZERO_REFERENCE),
            "zero-2": (lambda k, r, w: ours_zero(k, r, w, 2), ZERO_REFERENCE)}


def zero_matrix(rank: int, world: int) -> dict:
    """Every (ZeRO stage, zoo module) pair against torch's ZeroRedundancyOptimizer."""
    return run_matrix(rank, world, WRAPPERS, REFERENCES)


@pytest.fixture(scope="module")
def zoo():
    return launch.run_on_ranks(zero_matrix, 2, timeout=240)


@pytest.mark.ranks
@pytest.mark.parametrize("kind", list(ZOO))
@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_zero_agrees_with_torch(zoo, wrapper, kind):
    check_agreement(zoo, wrapper, kind, {})


def test_arguments_are_checked_before_any_communication():
    with pytest.raises(ValueError, match="not parameter groups: got a dict with keys \\['lr', 'params'\\]"):
        Z.ShardedOptimizer([{"params": build("plain").parameters(), "lr": 0.1}], torch.optim.SGD)
    with pytest.raises(ValueError, match="needs at least one parameter that requires a gradient"):
        Z.ShardedOptimizer(build("plain").requires_grad_(False).parameters(), torch.optim.SGD)


def test_zero_formulas_match_the_paper():
    psi, n = 7.5e9, 64  # the ZeRO paper's figure 1 example: 120 GB, 31.4, 16.6, 1.9 GB per device
    gb = [Z.zero_formula(s, psi, n, 2, 2, 12)["total"] / 1e9 for s in range(4)]
    assert gb == pytest.approx([120, 31.4, 16.6, 1.875], rel=0.01)
    with pytest.raises(ValueError):
        Z.zero_formula(4, 10, 2)
    assert [Z.zero_extra_comm(s, 10) for s in range(4)] == [80, 80, 80, 120]  # 2Ψ, 2Ψ, 2Ψ, 3Ψ fp32 bytes
    with pytest.raises(ValueError, match="stage=4"):  # a ValueError naming the stage, not a bare KeyError
        Z.zero_extra_comm(4, 10)


def test_zero_exercise_refuses_the_course_functions(capsys):
    """Passing the course's zero_formula or zero_lab.plan (or a lambda calling them) FAILs: write it yourself."""
    from helpers.course import check
    from helpers.parallel import zero_lab

    for answer in (lambda s, n, w: Z.zero_formula(s, n, w)["total"], lambda s, n, w: zero_lab.plan(w, n, s)["total"]):
        check.exercise("13.zero", answer)
        out = capsys.readouterr().out
        assert "FAIL" in out and "write it yourself" in out, out
    check.exercise("13.zero", lambda s, n, w: 4 * n / (w if s >= 3 else 1) + 4 * n / (w if s >= 2 else 1)
                   + 8 * n / (w if s >= 1 else 1))
    assert "PASS" in capsys.readouterr().out
