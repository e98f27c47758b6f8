"""Tensor parallelism (TPMLP, TPAttention) against torch's `parallelize_module` (ColwiseParallel /
RowwiseParallel) and the dense layers, on the module zoo of tests/parallel_support.py and an attention zoo:
every pair either matches torch after two steps (parameters, gradients, which parameters train) or is refused
with one sentence. All of it runs in one start of 2 gloo ranks."""
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from helpers.gpt.model import CausalSelfAttention, GPTConfig, sdpa_attention
from helpers.parallel import launch
from helpers.parallel import tensor_parallel as TP
from parallel_support import SEED, ZOO, STELinear, build, io_batches, refused, same_as_torch, sgd, snapshot

SHARD = {"up_w": ("up.weight", 0), "up_b": ("up.bias", 0), "down_w": ("down.weight", 1), "down_b": ("down.bias", None)}


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


# ---------------------------------------------------------------- on ranks

def ours_tp(kind, rank, world):
    tp = TP.TPMLP(build(kind))
    opt = sgd(tp.parameters())
    for x, _ in io_batches(world):
        opt.zero_grad()
        tp(x).pow(2).mean().backward()
        opt.step()
    return snapshot((SHARD[n][0], p) for n, p in tp.named_parameters())


def torch_tp(kind, rank, world):
    from torch.distributed.device_mesh import init_device_mesh  # optional: DTensor's tensor parallelism
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    m = build(kind)
    parallelize_module(m, init_device_mesh("cpu", (world,)), {"up": ColwiseParallel(), "down": RowwiseParallel()})
    opt = sgd(m.parameters())
    for x, _ in io_batches(world):
        opt.zero_grad()
        m(x).pow(2).mean().backward()
        opt.step()
    named = list(m.named_parameters())
    return {"params": {n: _local(p).detach().clone() for n, p in named},
            "grads": {n: None if p.grad is None else _local(p.grad).clone() for n, p in named},
            "trainable": sorted(n for n, p in named if p.requires_grad)}


class DoubledGradAttention(torch.autograd.Function):
    """Causal SDPA whose backward returns twice the true gradient: a kernel with its own gradient rule."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return sdpa_attention(q, k, v, True)

    @staticmethod
    def backward(ctx, g):
        q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        with torch.enable_grad():
            out = sdpa_attention(q, k, v, True)
        return tuple(2 * t for t in torch.autograd.grad(out, (q, k, v), g))


def doubled_grad_attention(q, k, v, is_causal):
    return DoubledGradAttention.apply(q, k, v)


def attention_zoo(kind: str) -> CausalSelfAttention:
    torch.manual_seed(SEED)
    cfg = GPTConfig(n_layer=1, n_head=4, n_kv_head=2, d_model=16, d_ff=32, seq_len=4, vocab_size=16,
                    dropout=0.1 if kind == "dropout" else 0.0)
    a = CausalSelfAttention(cfg)
    if kind == "frozen":
        a.q_proj.requires_grad_(False)
    if kind == "own kernel":
        a.attn_fn = doubled_grad_attention
    if kind == "subclassed projection":
        a.q_proj = STELinear(16, 16)
    return a


ATTENTION_ZOO = ("plain", "frozen", "own kernel", "dropout", "subclassed projection")


def attention_cell(kind, rank, world):
    """TPAttention's outputs and gradients against the dense layer's, sliced to this rank's heads."""
    dense = attention_zoo(kind)
    tp = TP.TPAttention(dense)
    x = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(SEED + 3))
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = dense(xa), tp(xb)
    ya.pow(2).sum().backward()
    yb.pow(2).sum().backward()

    def kv_rows(t):
        return t.view(2, dense.n_kv_head, dense.head_dim, -1).chunk(world, dim=1)[rank].reshape(-1, t.shape[-1])

    pairs = {"q_w": (dense.q_proj.weight, lambda t: t.chunk(world, 0)[rank]),
             "kv_w": (dense.kv_proj.weight, kv_rows),
             "out_w": (dense.out_proj.weight, lambda t: t.chunk(world, 1)[rank]),
             "out_b": (dense.out_proj.bias, lambda t: t)}
    grads = {}
    for name, (p, cut) in pairs.items():
        mine = getattr(tp, name)
        grads[name] = (None if mine.grad is None else float((mine.grad - cut(p.grad)).abs().max()),
                       mine.requires_grad, p.requires_grad, p.grad is None)
    return {"out": float((ya - yb).detach().abs().max()), "x grad": float((xa.grad - xb.grad).abs().max()),
            "grads": grads}


def tp_matrix(rank: int, world: int) -> dict:
    """Every zoo module under TPMLP against torch's tensor parallelism, and every attention-zoo layer."""
    out = {}
    for kind in ZOO:
        cell = out[f"tp|{kind}"] = {"ours": refused(lambda: ours_tp(kind, rank, world))}
        if "refused" not in cell["ours"]:  # torch's run is the reference for ours, nothing to compare otherwise
            cell["torch"] = refused(lambda: torch_tp(kind, rank, world))
        dist.barrier()
    for kind in ATTENTION_ZOO:
        out[f"attention|{kind}"] = refused(lambda: attention_cell(kind, rank, world))
    dist.barrier()
    return out


# ---------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def ranks():
    return launch.run_on_ranks(tp_matrix, 2, timeout=240)


TP_REFUSALS = {
    "unused": r"TPMLP: dense has parameters \['spare.bias', 'spare.weight'\] besides those of up, down",
    "tied": r"TPMLP splits a helpers.gpt.model.MLP, got Tied whose forward is its own",
    "custom": r"TPMLP: dense.up is a STELinear whose own forward .* defines its output and gradient",
    "sometimes": r"TPMLP splits a helpers.gpt.model.MLP, got Sometimes whose forward is its own",
    "embedding": r"TPMLP splits a helpers.gpt.model.MLP, got Embedded:",
}


@pytest.mark.ranks
@pytest.mark.parametrize("kind", list(ZOO))
def test_tp_agrees_with_torch_or_refuses(ranks, kind):
    cells = [r[f"tp|{kind}"] for r in ranks]
    if kind in TP_REFUSALS:
        for c in cells:
            msg = c["ours"].get("refused", "")
            assert msg.startswith("ValueError: ") and re.search(TP_REFUSALS[kind], msg), msg
            assert len(msg.split(". ")) == 1  # one sentence
        return
    for c in cells:
        same_as_torch(c["ours"], c["torch"])


@pytest.mark.ranks
def test_tp_keeps_requires_grad(ranks):
    assert ranks[0]["tp|frozen"]["ours"]["trainable"] == ["down.bias", "down.weight"]  # up was frozen


@pytest.mark.ranks
@pytest.mark.parametrize("kind", ATTENTION_ZOO)
def test_tp_attention_equals_the_dense_layer_or_refuses(ranks, kind):
    for r in ranks:
        c = r[f"attention|{kind}"]
        if kind == "dropout":
            assert re.match(r"ValueError: TPAttention: dense.resid_drop has p=0.1; .*dropout=0", c["refused"]), c
            continue
        if kind == "subclassed projection":
            assert re.match(r"ValueError: TPAttention: dense.q_proj is a STELinear whose own forward", c["refused"]), c
            continue
        assert "refused" not in c, c
        assert c["out"] <= 1e-5 and c["x grad"] <= 1e-5, c  # own kernel: twice the gradient, in both
        for name, (diff, mine, theirs, none) in c["grads"].items():
            assert mine == theirs, name  # frozen stays frozen
            assert (diff is None) == none, name
            assert diff is None or diff <= 1e-5, (name, diff)


# ---------------------------------------------------------------- without ranks

def test_tp_refuses_before_any_communication():
    dense = build("plain")
    dense.drop.p = 0.1
    with pytest.raises(ValueError, match=r"TPMLP: dense.drop has p=0.1; .*dropout=0"):
        TP.TPMLP(dense, rank=0, world=2)
    tied = build("plain")
    tied.up = nn.Linear(8, 8)
    tied.down = nn.Linear(8, 8)
    tied.down.weight = tied.up.weight
    with pytest.raises(ValueError, match="TPMLP: up.weight and down.weight are one tied parameter"):
        TP.TPMLP(tied, rank=0, world=2)
    with pytest.raises(ValueError, match="MLP, got Linear:"):
        TP.TPMLP(nn.Linear(8, 8), rank=0, world=2)
    assert TP.TPMLP(build("frozen"), rank=1, world=2).up_w.requires_grad is False  # frozen stays frozen
