"""DDP (per-parameter, bucketed, after backward, find_unused_parameters) against torch's DDP on the module zoo of
tests/parallel_support.py: every pair either matches torch after two steps (parameters, gradients, which
parameters train, replicas equal) or is refused with one sentence. All the pairs run in one start of 2 gloo
ranks. Also DDP's refusals, its bucket rule (torch's) and the overlap prediction."""
import gc
import re

import pytest
import torch
import torch.nn as nn

from helpers.parallel import ddp as P
from helpers.parallel import launch
from parallel_support import (BUCKET_MB, ZOO, batches, build, build_on_rank, check_agreement, refused,
                              run_matrix, sgd, snapshot, torch_ddp, train)


def ours_ddp(kind, rank, world, **kw):
    m = build_on_rank(kind, rank)
    d = P.DDP(m, **kw)
    train(d, sgd(m.parameters()), batches(kind, world), rank, world, d.finish_gradient_synchronization)
    return snapshot(m.named_parameters())


REFERENCES = {  # torch's counterpart, fn(kind, rank, world) -> snapshot
    "torch ddp": lambda k, r, w: torch_ddp(k, r, w, False),
    "torch ddp find_unused": lambda k, r, w: torch_ddp(k, r, w, True),
}
WRAPPERS = {  # name -> (ours, the name of torch's reference)
    "ddp": (lambda k, r, w: ours_ddp(k, r, w), "torch ddp"),
    "ddp bucketed": (lambda k, r, w: ours_ddp(k, r, w, bucket_mb=BUCKET_MB), "torch ddp"),
    "ddp after backward": (lambda k, r, w: ours_ddp(k, r, w, overlap=False), "torch ddp"),
    "ddp find_unused": (lambda k, r, w: ours_ddp(k, r, w, find_unused_parameters=True), "torch ddp find_unused"),
    "ddp bucketed find_unused": (lambda k, r, w: ours_ddp(k, r, w, bucket_mb=BUCKET_MB, find_unused_parameters=True),
                                 "torch ddp find_unused"),
}
DEFAULT_DDP = ("ddp", "ddp bucketed", "ddp after backward")
NOT_RUN = {(w, "sometimes"): "a parameter only some ranks use makes the ranks' buckets differ, which torch DDP's "
                             "default mode cannot pair up either; find_unused_parameters=True is the mode for it"
           for w in DEFAULT_DDP}
REFUSALS = {  # (wrapper, kind) -> what the sentence must say
    **{(w, "unused"): r"DDP: 'spare.weight', 'spare.bias' got no gradient.*find_unused_parameters=True"
       for w in DEFAULT_DDP},
}


def _misc(rank, world) -> dict:
    """The refusals that need ranks, each with its message (both ranks refuse at the same point)."""
    out = {}
    m = build("plain")
    P.DDP(m)
    out["wrapped twice"] = refused(lambda: P.DDP(m))
    frozen = build("plain").requires_grad_(False)
    out["nothing trainable"] = refused(lambda: P.DDP(frozen))

    def two_backwards():
        d = P.DDP(build("plain"), bucket_mb=BUCKET_MB)
        x = torch.randn(2, 3, 8)
        d(x).sum().backward()
        d.module(x).sum().backward()  # the same parameters get a second gradient before synchronising
        return {}

    out["second gradient"] = refused(two_backwards)

    def forgot_finish():
        d = P.DDP(build("plain"))
        x = torch.randn(2, 3, 8)
        d(x).sum().backward()
        d(x)
        return {}

    out["forgot finish"] = refused(forgot_finish)
    return out


def ddp_matrix(rank: int, world: int) -> dict:
    """Every (DDP mode, zoo module) pair against torch's DDP, and the refusals that need ranks."""
    return {**run_matrix(rank, world, WRAPPERS, REFERENCES, NOT_RUN), "misc": _misc(rank, world)}


@pytest.fixture(scope="module")
def zoo():
    """Both ranks' results of every pair (one start of the ranks for the whole file)."""
    return launch.run_on_ranks(ddp_matrix, 2, timeout=240)


@pytest.mark.ranks
@pytest.mark.parametrize("kind", list(ZOO))
@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_ddp_agrees_with_torch_or_refuses(zoo, wrapper, kind):
    if (wrapper, kind) in NOT_RUN:
        pytest.skip(NOT_RUN[(wrapper, kind)])
    check_agreement(zoo, wrapper, kind, REFUSALS)


@pytest.mark.ranks
def test_refusals_on_ranks_are_one_sentence(zoo):
    for misc in (r["misc"] for r in zoo):
        want = {"wrapped twice": r"ValueError: DDP: parameter 'up.weight' is already hooked by another DDP",
                "nothing trainable": r"ValueError: DDP: the MLP has no parameter that requires a gradient",
                "second gradient": r"RuntimeError: DDP: parameter '.*' got a second gradient before "
                                   r"finish_gradient_synchronization\(\)",
                "forgot finish": r"RuntimeError: DDP: the last backward's gradients were never averaged"}
        for key, pattern in want.items():
            assert re.match(pattern, misc[key]["refused"]), (key, misc[key])


# ---------------------------------------------------------------- without ranks

def test_arguments_are_checked_before_any_communication():
    with pytest.raises(ValueError, match="bucket_mb=0.0 must be a positive float"):
        P.DDP(build("plain"), bucket_mb=0)
    with pytest.raises(ValueError, match="find_unused_parameters='yes' is not allowed"):
        P.DDP(build("plain"), find_unused_parameters="yes")
    with pytest.raises(ValueError, match="DDP wraps an nn.Module, got a list"):
        P.DDP([nn.Parameter(torch.ones(1))])
    assert [n for n, _ in build("tied").named_parameters()] == ["up.weight", "up.bias", "down.weight", "down.bias"]
    assert len(P.unique_params(build("tied"))) == 4 and len(P.unique_params(build("frozen"))) == 2


def test_overlap_prediction_hides_the_smaller_of_compute_and_comm():
    assert P.overlap_prediction([1.0] * 4, [1.0] * 4) == {"sequential": 8.0, "overlapped": 5.0}
    assert P.overlap_prediction([1.0] * 4, [2.0] * 4) == {"sequential": 12.0, "overlapped": 9.0}  # comm-bound
    assert P.overlap_prediction([2.0] * 4, [0.5] * 4) == {"sequential": 10.0, "overlapped": 8.5}  # compute-bound
    assert P.overlap_prediction([3.0, 1.0], [1.0, 4.0])["overlapped"] == 8.0  # 3 | max(4, 4) + 4
    with pytest.raises(ValueError, match="one time per layer"):
        P.overlap_prediction([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match=">= 0"):
        P.overlap_prediction([1.0], [-1.0])


def test_bucket_assignment_is_torch_ddps():
    g = torch.Generator().manual_seed(0)
    from helpers.course.exercises import nb13
    for _ in range(20):
        sizes = [4 * int(x) for x in torch.randint(1, 600, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g)]
        limit = 4 * int(torch.randint(1, 900, (1,), generator=g))
        assert P.bucket_assignment(sizes, limit) == nb13.torch_buckets(sizes, limit)
    with pytest.raises(ValueError, match="bucket_bytes=0"):
        P.bucket_assignment([4], 0)


def test_bucket_exercise_refuses_the_course_function_and_accepts_the_reference(capsys):
    """Passing the course's bucket_assignment (or a lambda calling it) FAILs; a planted wrong bucketing FAILs."""
    from helpers.course import check
    from helpers.course.exercises import nb13

    for answer in (P.bucket_assignment, lambda nb, b: P.bucket_assignment(nb, b)):
        check.exercise("13.bucket", answer)
        out = capsys.readouterr().out
        assert "FAIL" in out and "write it yourself" in out, out

    def mine(nbytes, bucket_bytes):
        out, cur, size = [], [], 0
        for i, n in enumerate(nbytes):
            cur.append(i)
            size += n
            if size >= bucket_bytes:
                out, cur, size = out + [cur], [], 0
        return out + [cur] if cur else out

    check.exercise("13.bucket", mine)
    assert "PASS  13.bucket: all 6 cases" in capsys.readouterr().out
    check.exercise("13.bucket", lambda nbytes, b: [list(range(len(nbytes)))])  # everything in one bucket
    out = capsys.readouterr().out
    assert "FAIL" in out and "differ from the ones torch DDP builds" in out
    check.exercise("13.bucket", nb13._bucket_close_late)
    assert "FAIL" in capsys.readouterr().out
    for case in nb13._bucket_cases():  # the reference is torch's rule
        assert nb13._bucket_reference(*case.args) == nb13.torch_buckets(*case.args) == P.bucket_assignment(*case.args)


def test_find_unused_parameters_sees_the_tensors_inside_a_dataclass_output():
    """A module returning a @dataclass (a model output object): torch's DDP finds the tensors in it and averages the
    gradients; ours must not take the parameters behind them for unused (which gave 'a second gradient')."""
    from dataclasses import dataclass

    from helpers.parallel.in_process import one_rank

    @dataclass
    class Out:
        y: torch.Tensor
        note: str = "x"

    class Lin(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin, self.spare = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return Out(self.lin(x))

    x = torch.randn(3, 4)
    lin = Lin()
    assert P._grad_nodes(Out(lin(x).y)) == P._grad_nodes((lin(x).y,)) == {id(lin.lin.weight), id(lin.lin.bias)}
    with one_rank():
        ours, theirs = Lin(), Lin()
        wrapped = P.DDP(ours, find_unused_parameters=True)
        wrapped(x).y.sum().backward()
        wrapped.finish_gradient_synchronization()
        reference = torch.nn.parallel.DistributedDataParallel(theirs, find_unused_parameters=True)
        reference(x).y.sum().backward()
        # Both wrappers go while their group is alive: torch's Reducer holds the gloo group, and destroying that
        # group after one_rank() closed it can hang in its destructor, which joins gloo's threads.
        del wrapped, reference
        gc.collect()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        assert (a.grad is None) == (b.grad is None) or name.startswith("spare"), name
        if b.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
