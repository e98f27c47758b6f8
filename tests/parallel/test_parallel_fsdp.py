"""FSDP (ZeRO-3) against torch's FSDP2 on the module zoo of tests/parallel_support.py (torch's DDP with
find_unused_parameters where FSDP2 has no reference), with FSDP's refusals; one start of 2 gloo ranks."""
import math
import re

import pytest
import torch
import torch.nn as nn

from helpers.parallel import fsdp as P
from helpers.parallel import launch
from parallel_support import (SEED, TOL, ZOO, batches, build, build_on_rank, check_agreement, diff, full, gather_grad,
                              refused, run_matrix, sgd, torch_ddp, train)


def torch_fsdp2(kind, rank, world):
    from torch.distributed.device_mesh import init_device_mesh  # optional: FSDP2 is not in every torch build
    from torch.distributed.fsdp import fully_shard

    m = build(kind)
    fully_shard(m, mesh=init_device_mesh("cpu", (world,)))
    train(m, sgd(m.parameters()), batches(kind, world), rank, world)
    named = [(n, p) for n, p in m.named_parameters()]
    return {"params": {n: full(p).detach().clone() for n, p in named},
            "grads": {n: None if p.grad is None else full(p.grad).clone() for n, p in named},
            "trainable": sorted(n for n, p in named if p.requires_grad)}


def ours_fsdp(kind, rank, world):
    m = build_on_rank(kind, rank)
    f = P.FSDP(m)
    train(f, sgd(f.parameters()), batches(kind, world), rank, world, f.finish_gradient_synchronization)
    rest = dict(m.named_parameters(remove_duplicate=False))
    return {"params": f.gather_full_params(),
            "grads": {**{n: gather_grad(s) for n, s in f.names.items()},
                      **{n: None if p.grad is None else p.grad.clone() for n, p in rest.items()}},
            "trainable": sorted([n for n, s in f.names.items() if s.param.requires_grad]
                                + [n for n, p in rest.items() if p.requires_grad]),
            "trainable elements": sum(p.numel() for p in f.parameters() if p.requires_grad),
            "sharded": sorted(f.names)}


REFERENCES = {"torch fsdp2": torch_fsdp2, "torch ddp find_unused": lambda k, r, w: torch_ddp(k, r, w, True)}
WRAPPERS = {"fsdp": (ours_fsdp, "torch fsdp2")}
# FSDP2 reduce-scatters only the gradients a rank has, so a rank-dependently used parameter has no FSDP2
# reference; torch DDP with find_unused_parameters gives the same numbers FSDP must
REFERENCE_FOR = {("fsdp", "sometimes"): "torch ddp find_unused"}


def _misc(rank, world) -> dict:
    """The refusals that need ranks, each with its message, and the embedding's gradient against nn.Embedding's."""
    out = {"max_norm": refused(lambda: P.FSDP(nn.Sequential(nn.Embedding(5, 4, max_norm=1.0)))),
           "sparse": refused(lambda: P.FSDP(nn.Sequential(nn.Embedding(5, 4, sparse=True))))}
    f = P.FSDP(build("plain"))
    out["weight outside forward"] = refused(lambda: f.module.up.weight)
    out["fsdp twice"] = refused(lambda: P.FSDP(f.module))
    out["repr"] = repr(f.module)
    idx = torch.tensor([[0, 1, 1, 3], [3, 3, 0, 2]])
    torch.manual_seed(SEED)
    dense = nn.Embedding(5, 4, padding_idx=0, scale_grad_by_freq=True)
    e = P.FSDP(nn.Sequential(nn.Embedding(5, 4, padding_idx=0, scale_grad_by_freq=True)))
    for m in (dense, e):
        (m(idx) * torch.arange(4.0)).sum().backward()
    out["embedding grads"] = (gather_grad(e.names["0.weight"]), dense.weight.grad)  # the same idx on every rank
    return out


def fsdp_matrix(rank: int, world: int) -> dict:
    """Every zoo module under FSDP against its torch reference, and the refusals that need ranks."""
    return {**run_matrix(rank, world, WRAPPERS, REFERENCES, reference_for=REFERENCE_FOR), "misc": _misc(rank, world)}


@pytest.fixture(scope="module")
def zoo():
    return launch.run_on_ranks(fsdp_matrix, 2, timeout=240)


@pytest.mark.ranks
@pytest.mark.parametrize("kind", list(ZOO))
def test_fsdp_agrees_with_torch(zoo, kind):
    check_agreement(zoo, "fsdp", kind, {})


@pytest.mark.ranks
def test_fsdp_shards_keep_requires_grad_and_count_only_trainable_elements(zoo):
    for kind in ("frozen", "plain"):
        c = zoo[0][f"fsdp|{kind}"]["ours"]
        m = build(kind)
        trainable = [p for n, p in m.named_parameters() if p.requires_grad]
        assert c["trainable elements"] == sum(math.ceil(p.numel() / 2) for p in trainable), kind
    assert zoo[0]["fsdp|frozen"]["ours"]["trainable"] == ["down.bias", "down.weight"]


@pytest.mark.ranks
def test_fsdp_keeps_layers_whole_that_define_their_own_gradient(zoo):
    assert "up.weight" not in zoo[0]["fsdp|custom"]["ours"]["sharded"]  # STELinear: its own forward
    assert {"down.weight", "down2.weight", "up.weight"} <= set(zoo[0]["fsdp|tied"]["ours"]["sharded"])
    assert {"emb.weight", "head.weight"} <= set(zoo[0]["fsdp|embedding"]["ours"]["sharded"])
    ours, dense = zoo[0]["misc"]["embedding grads"]
    assert torch.count_nonzero(ours[0]) == 0 and torch.count_nonzero(ours[1:]) > 0  # padding_idx's row: none
    assert diff(ours, dense) <= TOL  # and scale_grad_by_freq divides each row by its count, as nn.Embedding's


@pytest.mark.ranks
def test_refusals_on_ranks_are_one_sentence(zoo):
    for misc in (r["misc"] for r in zoo):
        want = {"max_norm": r"ValueError: FSDP: Embedding '0' has max_norm=1.0: it rescales rows",
                "sparse": r"ValueError: FSDP: Embedding '0' has sparse=True: its gradient is sparse.*sparse=False",
                "weight outside forward": r"RuntimeError: FSDP shards this Linear's weight over 2 ranks.*"
                                          r"gather_full_params",
                "fsdp twice": r"ValueError: FSDP: this module is already wrapped"}
        for key, pattern in want.items():
            assert re.match(pattern, misc[key]["refused"]), (key, misc[key])
        assert "sharded over 2 ranks" in misc["repr"]  # printing on one rank gathers nothing
