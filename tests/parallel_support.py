"""What the tests of helpers/parallel share (tests/parallel/): rank functions that plant failures, and the
module zoo the wrappers (DDP, ZeRO, FSDP, tensor and pipeline parallelism) are checked on against torch's own.

Everything here that runs on ranks is a function defined at the top level of this module, so that the ranks
started by `helpers.parallel.launch.run_on_ranks` can import it: this folder is on pytest's pythonpath, and a
fork server started from a pytest process (or from a script that puts tests/ on sys.path) passes its sys.path on.

The zoo: modules that say something about themselves (a frozen layer, an unused one, tied parameters, one
registered twice and one also read outside its layer, a layer whose gradient is its own autograd Function, a
parameter only some ranks' batches use, an Embedding with padding_idx and scale_grad_by_freq tied to a head).
`run_matrix` runs every (wrapper, zoo module) pair with its torch reference on ranks; `check_agreement`
asserts that a pair matches torch after two steps or is refused with one sentence.
"""
from __future__ import annotations

import ctypes
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from helpers.gpt.model import MLP, GPTConfig
from helpers.parallel.collectives import all_gather_single


# ---------------------------------------------------------------- rank functions that plant failures

def fail_on(rank: int, world: int, bad_rank: int) -> int:
    """Raises on `bad_rank` (the others wait at a barrier that never completes)."""
    if rank == bad_rank:
        raise ValueError(f"planted failure on rank {rank}")
    dist.barrier()
    return rank


def sleep_forever(rank: int, world: int) -> None:
    """Never returns: for the interrupt and timeout tests."""
    while True:
        time.sleep(1)


def returns_tensors(rank: int, world: int) -> dict:
    return {"t": torch.arange(4) * rank, "p": torch.nn.Parameter(torch.full((2,), float(rank)))}


def returns_unpicklable_on(rank: int, world: int, bad: int, what: str):
    if rank != bad:
        return rank
    if what == "generator":
        return {"values": (i for i in range(3))}
    return threading.Lock()


def killed_on(rank: int, world: int, bad: int) -> int:
    """`bad` SIGKILLs itself after a barrier; the others enter an all-reduce that its death breaks."""
    dist.barrier()
    if rank == bad:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(4))
    return rank


def exits_on(rank: int, world: int, bad: int) -> int:
    dist.barrier()
    if rank == bad:
        os._exit(3)
    dist.all_reduce(torch.ones(4))
    return rank


def hangs_on(rank: int, world: int, bad: int) -> int:
    if rank == bad:
        while True:
            time.sleep(1)
    return rank


def pid_then_deadlock(rank: int, world: int, folder: str) -> None:
    """Writes its PID to `folder`/rank<k>, then deadlocks: rank 0 in a barrier that rank 1 never reaches,
    rank 1 in libc's pause() called with the GIL held (no Python thread of its own can run any more)."""
    Path(folder, f"rank{rank}.tmp").write_text(str(os.getpid()))
    os.replace(Path(folder, f"rank{rank}.tmp"), Path(folder, f"rank{rank}"))
    if rank == 0:
        dist.barrier()
    ctypes.PyDLL(None).pause()


# ---------------------------------------------------------------- the module zoo

SEED, STEPS, ROWS, LR = 0, 2, 4, 0.1  # ROWS per rank; SGD with momentum, so ZeRO has optimizer state to shard
BUCKET_MB = 0.0005  # 524 bytes: buckets of several parameters (the unused one shares a bucket with down's)
TOL = 1e-6


def zoo_config() -> GPTConfig:
    return GPTConfig(n_layer=1, n_head=2, d_model=8, d_ff=16, seq_len=4, vocab_size=16)


class RoundSTE(torch.autograd.Function):
    """Weights rounded to multiples of 1/8 in forward; the gradient passes straight through (Bengio et al., 2013)."""

    @staticmethod
    def forward(ctx, w):
        return torch.round(w * 8) / 8

    @staticmethod
    def backward(ctx, g):
        return g


class STELinear(nn.Linear):
    """A Linear whose forward (and so gradient) is its own: straight-through rounded weights."""

    def forward(self, x):
        return F.linear(x, RoundSTE.apply(self.weight), self.bias)


class WithSpare(MLP):
    """An MLP with a layer its forward never uses."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.spare = nn.Linear(cfg.d_model, cfg.d_model)


class Tied(MLP):
    """down2 is registered with down's weight; forward also reads up's weight, transposed, outside up's forward."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.down2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)
        self.down2.weight = self.down.weight

    def forward(self, x):
        h = F.gelu(self.up(x), approximate="tanh")
        return self.down(h) + self.down2(h.flip(-1)) + 0.1 * F.linear(h, self.up.weight.t())


class Custom(MLP):
    """An MLP whose up projection is an STELinear."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.up = STELinear(cfg.d_model, cfg.d_ff)


class Sometimes(MLP):
    """A gate only batches with a positive mean use: which parameters are used depends on the rank's data."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.gate = nn.Parameter(torch.linspace(0.5, 1.5, cfg.d_model))

    def forward(self, x):
        y = super().forward(x)
        return y * self.gate if bool(x.mean() > 0) else y


class Embedded(nn.Module):
    """An Embedding (padding_idx, scale_grad_by_freq) on indices read from the input, tied to a Linear head."""

    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(10, cfg.d_model, padding_idx=0, scale_grad_by_freq=True)
        self.head = nn.Linear(cfg.d_model, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        # clamped, and NaN-proof: torch.distributed.pipelining runs a stage once on uninitialised tensors
        idx = (torch.nan_to_num(x[..., 0].detach()).abs() * 3).clamp(0, 9).long()
        y = x + self.emb(idx)
        return y * self.head(y).softmax(-1)[..., :1]


def frozen_mlp(cfg):
    m = MLP(cfg)
    m.up.requires_grad_(False)
    return m


ZOO = {"plain": MLP, "frozen": frozen_mlp, "unused": WithSpare, "tied": Tied, "custom": Custom,
       "sometimes": Sometimes, "embedding": Embedded}


def build(kind: str, seed: int = SEED) -> nn.Module:
    """Zoo module `kind`, its weights drawn from `seed`."""
    torch.manual_seed(seed)
    return ZOO[kind](zoo_config())


def build_on_rank(kind: str, rank: int) -> nn.Module:
    """`build(kind)` on rank 0, other weights elsewhere (frozen ones too): a wrapper must broadcast rank 0's."""
    m = build(kind, SEED + 100 + rank)
    if rank == 0:
        m.load_state_dict(build(kind).state_dict())
    return m


def batches(kind: str, world: int) -> list[torch.Tensor]:
    """STEPS global batches (world * ROWS, 3, d_model), the same on every rank; rank r's rows have mean > 0
    exactly when r is even (so Sometimes's gate is used on rank 0 only)."""
    g = torch.Generator().manual_seed(SEED + 1)
    out = []
    for _ in range(STEPS):
        x = torch.randn(world * ROWS, 3, zoo_config().d_model, generator=g)
        for r in range(world):
            x[r * ROWS:(r + 1) * ROWS] += 1.0 if r % 2 == 0 else -1.0
        out.append(x)
    return out


def local(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    return x.chunk(world)[rank]


def sgd(params):
    return torch.optim.SGD(params, lr=LR, momentum=0.9)


def snapshot(named) -> dict:
    """{"params", "grads", "trainable"} of (name, tensor) pairs: detached copies (grads None where None)."""
    named = list(named)
    return {"params": {n: p.detach().clone() for n, p in named},
            "grads": {n: None if p.grad is None else p.grad.detach().clone() for n, p in named},
            "trainable": sorted(n for n, p in named if p.requires_grad)}


def full(t):
    """A DTensor's full tensor; any other tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def refused(fn: Callable[[], dict]) -> dict:
    """`fn()`, or {"refused": "<type>: <message>"} when it raises."""
    try:
        return fn()
    except Exception as err:  # noqa: BLE001  a refusal is the result a cell reports
        return {"refused": f"{type(err).__name__}: {err}"}


def train(forward, opt, xs, rank, world, sync=None):
    """Steps of `opt` on this rank's share of each batch in `xs`, `sync()` between backward and step."""
    for x in xs:
        opt.zero_grad()
        forward(local(x, rank, world)).pow(2).mean().backward()
        if sync is not None:
            sync()
        opt.step()


def torch_ddp(kind, rank, world, find_unused, zero=False):
    """torch's DDP on zoo module `kind` (with ZeroRedundancyOptimizer when `zero`): the reference snapshot."""
    m = build(kind)
    d = nn.parallel.DistributedDataParallel(m, find_unused_parameters=find_unused)
    if zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.SGD, lr=LR, momentum=0.9)
    else:
        opt = sgd(m.parameters())
    train(d, opt, batches(kind, world), rank, world)
    return snapshot(m.named_parameters())


def gather_grad(shard):
    """The full gradient of an FSDP shard, gathered from every rank (None where the shard has none)."""
    if shard.param.grad is None:
        return None
    out = torch.empty(shard.per * shard.world, dtype=shard.dtype)
    all_gather_single(out, shard.param.grad.contiguous())
    return out[: shard.numel].view(shard.shape)


def run_matrix(rank: int, world: int, wrappers: dict, references: dict, not_run: dict | None = None,
               reference_for: dict | None = None) -> dict:
    """Every (wrapper, zoo module) pair on this rank: {"name|kind": {"ours", "torch", "reference"}}, each a
    snapshot or {"refused"}. `wrappers`: name -> (fn(kind, rank, world), the name of its reference in
    `references`); `reference_for` overrides that name for a pair; `not_run` pairs are left out. Each
    reference runs once per module."""
    not_run, reference_for, out = not_run or {}, reference_for or {}, {}
    for kind in ZOO:
        refs = {}
        for name, (ours, ref) in wrappers.items():
            if (name, kind) in not_run:
                continue
            ref = reference_for.get((name, kind), ref)
            if ref not in refs:
                refs[ref] = refused(lambda: references[ref](kind, rank, world))
            out[f"{name}|{kind}"] = {"ours": refused(lambda: ours(kind, rank, world)), "torch": refs[ref],
                                     "reference": ref}
            dist.barrier()
    return out


def diff(a, b) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def match(ours: dict, theirs: dict, names=None) -> None:
    """Same parameters, gradients (None where torch's are) and trainable names, over torch's names (FSDP also
    lists a tied parameter's second name, which torch's named_parameters leaves out)."""
    names = sorted(theirs["params"]) if names is None else names
    assert [n for n in ours["trainable"] if n in theirs["params"]] == theirs["trainable"]
    for n in names:
        assert diff(ours["params"][n], theirs["params"][n]) <= TOL, n
        g, h = ours["grads"][n], theirs["grads"][n]
        assert (g is None) == (h is None), (n, g, h)
        if g is not None:
            assert diff(g, h) <= TOL, n


def check_agreement(results: list[dict], wrapper: str, kind: str, refusals: dict) -> None:
    """Both ranks' cell `wrapper|kind` of `run_matrix`: refused in one sentence matching `refusals[(wrapper,
    kind)]` (torch refusing too), or equal to torch's on every rank and identical across the replicas. A
    wrapper that keeps only the gradients a rank owns (ZeRO-2 lists them in "owned") is compared on those."""
    cells = [r[f"{wrapper}|{kind}"] for r in results]
    if (wrapper, kind) in refusals:
        for c in cells:
            assert "refused" in c["ours"], c["ours"].keys()
            assert c["ours"]["refused"].startswith("RuntimeError: ")
            assert len(c["ours"]["refused"].split(". ")) == 1  # one sentence
            assert re.search(refusals[(wrapper, kind)], c["ours"]["refused"]), c["ours"]["refused"]
            assert "refused" in c["torch"], "torch DDP raises too (at the next forward)"
        return
    for c in cells:
        assert "refused" not in c["torch"], c["torch"]
        assert "refused" not in c["ours"], c["ours"]["refused"]
        ours, theirs = c["ours"], c["torch"]
        if "owned" in ours:  # a rank keeps only the gradients it owns
            for n in theirs["params"]:
                if n not in ours["owned"]:
                    assert ours["grads"][n] is None, n
                    ours["grads"][n] = theirs["grads"][n]
        match(ours, theirs)
    a, b = (c["ours"]["params"] for c in cells)
    assert max(diff(a[n], b[n]) for n in a) == 0.0  # replicas identical


# ---------------------------------------------------------------- model parallelism on the zoo

def io_batches(world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """STEPS (input, target) batches of 4 rows, the same on every rank."""
    g = torch.Generator().manual_seed(SEED + 2)
    return [(torch.randn(4, 3, 8, generator=g) + 0.5, torch.randn(4, 3, 8, generator=g)) for _ in range(STEPS)]


def same_as_torch(ours: dict, theirs: dict) -> None:
    """Neither refused; the same trainable names, parameters and gradients (None where torch's are) within
    TOL, and the same losses where both report them."""
    assert "refused" not in theirs, theirs
    assert "refused" not in ours, ours
    assert ours["trainable"] == theirs["trainable"]
    for n in theirs["params"]:
        assert diff(ours["params"][n], theirs["params"][n]) <= TOL, n
        g, h = ours["grads"][n], theirs["grads"][n]
        assert (g is None) == (h is None), n
        if g is not None:
            assert diff(g, h) <= TOL, n
    if "losses" in ours and ours["losses"][0] is not None:
        for mine, torchs in zip(ours["losses"], theirs["losses"]):
            assert mine == pytest.approx(torchs, abs=TOL)
