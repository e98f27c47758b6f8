"""DDP, ZeRO-1/2 and FSDP against torch's DDP, ZeroRedundancyOptimizer and FSDP2 on a zoo of modules that say
something about themselves: a frozen layer, an unused one, tied parameters (one registered twice, one also
read outside its layer), a layer whose gradient is its own autograd Function, a parameter only some ranks'
batches use, and an Embedding with padding_idx and scale_grad_by_freq tied to a head. Every wrapper x module
pair either matches torch after two steps (parameters, gradients, which parameters train, replicas equal) or
is refused with one sentence. All the pairs run in one start of 2 gloo ranks."""
import math
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from helpers.gpt.model import MLP, GPTConfig
from helpers.parallel import data_parallel as P
from helpers.parallel import distributed as D
from helpers.parallel.distributed import all_gather_single

SEED, STEPS, ROWS, LR = 0, 2, 4, 0.1  # ROWS per rank; SGD with momentum, so ZeRO has optimizer state to shard
BUCKET_MB = 0.0005  # 524 bytes: buckets of several parameters (the unused one shares a bucket with down's)
TOL = 1e-6


# ---------------------------------------------------------------- the module zoo

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


def _frozen(cfg):
    m = MLP(cfg)
    m.up.requires_grad_(False)
    return m


ZOO = {"plain": MLP, "frozen": _frozen, "unused": WithSpare, "tied": Tied, "custom": Custom,
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


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _refused(fn) -> dict:
    try:
        return fn()
    except Exception as err:  # noqa: BLE001  a refusal is the result this cell reports
        return {"refused": f"{type(err).__name__}: {err}"}


# ---------------------------------------------------------------- the cells, on ranks

def _train(forward, opt, xs, rank, world, sync=None):
    for x in xs:
        opt.zero_grad()
        forward(local(x, rank, world)).pow(2).mean().backward()
        if sync is not None:
            sync()
        opt.step()


def torch_ddp(kind, rank, world, find_unused, zero=False):
    m = build(kind)
    d = nn.parallel.DistributedDataParallel(m, find_unused_parameters=find_unused)
    if zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.SGD, lr=LR, momentum=0.9)
    else:
        opt = sgd(m.parameters())
    _train(d, opt, batches(kind, world), rank, world)
    return snapshot(m.named_parameters())


def ours_ddp(kind, rank, world, **kw):
    m = build_on_rank(kind, rank)
    d = P.DDP(m, **kw)
    _train(d, sgd(m.parameters()), batches(kind, world), rank, world, d.finish_gradient_synchronization)
    return snapshot(m.named_parameters())


def ours_zero(kind, rank, world, stage):
    m = build_on_rank(kind, rank)
    if stage == 1:
        d = P.DDP(m, find_unused_parameters=True)
        opt = P.ShardedOptimizer(m.parameters(), torch.optim.SGD, lr=LR, momentum=0.9)
        _train(d, opt, batches(kind, world), rank, world, d.finish_gradient_synchronization)
    else:
        P.broadcast_module(m)
        opt = P.ShardedOptimizer(m.parameters(), torch.optim.SGD, lr=LR, momentum=0.9)
        _train(m, opt, batches(kind, world), rank, world, opt.reduce_gradients)
    out = snapshot(m.named_parameters())
    out["owned"] = sorted(n for n, p in m.named_parameters() if any(p is q for q in opt.owned))
    return out


def torch_fsdp2(kind, rank, world):
    from torch.distributed.device_mesh import init_device_mesh  # optional: FSDP2 is not in every torch build
    from torch.distributed.fsdp import fully_shard

    m = build(kind)
    fully_shard(m, mesh=init_device_mesh("cpu", (world,)))
    _train(m, sgd(m.parameters()), batches(kind, world), rank, world)
    named = [(n, p) for n, p in m.named_parameters()]
    return {"params": {n: _full(p).detach().clone() for n, p in named},
            "grads": {n: None if p.grad is None else _full(p.grad).clone() for n, p in named},
            "trainable": sorted(n for n, p in named if p.requires_grad)}


def _gather_grad(shard):
    if shard.param.grad is None:
        return None
    out = torch.empty(shard.per * shard.world, dtype=shard.dtype)
    all_gather_single(out, shard.param.grad.contiguous())
    return out[: shard.numel].view(shard.shape)


def ours_fsdp(kind, rank, world):
    m = build_on_rank(kind, rank)
    f = P.FSDP(m)
    _train(f, sgd(f.parameters()), batches(kind, world), rank, world, f.finish_gradient_synchronization)
    rest = dict(m.named_parameters(remove_duplicate=False))
    return {"params": f.gather_full_params(),
            "grads": {**{n: _gather_grad(s) for n, s in f.names.items()},
                      **{n: None if p.grad is None else p.grad.clone() for n, p in rest.items()}},
            "trainable": sorted([n for n, s in f.names.items() if s.param.requires_grad]
                                + [n for n, p in rest.items() if p.requires_grad]),
            "trainable elements": sum(p.numel() for p in f.parameters() if p.requires_grad),
            "sharded": sorted(f.names)}


REFERENCES = {  # torch's counterpart, fn(kind, rank, world) -> snapshot
    "torch ddp": lambda k, r, w: torch_ddp(k, r, w, False),
    "torch ddp find_unused": lambda k, r, w: torch_ddp(k, r, w, True),
    "torch ddp find_unused + ZeroRedundancyOptimizer": lambda k, r, w: torch_ddp(k, r, w, True, zero=True),
    "torch fsdp2": torch_fsdp2,
}
WRAPPERS = {  # name -> (ours, the name of torch's reference)
    "ddp": (lambda k, r, w: ours_ddp(k, r, w), "torch ddp"),
    "ddp bucketed": (lambda k, r, w: ours_ddp(k, r, w, bucket_mb=BUCKET_MB), "torch ddp"),
    "ddp after backward": (lambda k, r, w: ours_ddp(k, r, w, overlap=False), "torch ddp"),
    "ddp find_unused": (lambda k, r, w: ours_ddp(k, r, w, find_unused_parameters=True), "torch ddp find_unused"),
    "ddp bucketed find_unused": (lambda k, r, w: ours_ddp(k, r, w, bucket_mb=BUCKET_MB, find_unused_parameters=True),
                                 "torch ddp find_unused"),
    "zero-1": (lambda k, r, w: ours_zero(k, r, w, 1), "torch ddp find_unused + ZeroRedundancyOptimizer"),
    "zero-2": (lambda k, r, w: ours_zero(k, r, w, 2), "torch ddp find_unused + ZeroRedundancyOptimizer"),
    "fsdp": (ours_fsdp, "torch fsdp2"),
}
DEFAULT_DDP = ("ddp", "ddp bucketed", "ddp after backward")
NOT_RUN = {(w, "sometimes"): "a parameter only some ranks use makes the ranks' buckets differ, which torch DDP's "
                             "default mode cannot pair up either; find_unused_parameters=True is the mode for it"
           for w in DEFAULT_DDP}
# FSDP2 reduce-scatters only the gradients a rank has, so a rank-dependently used parameter has no FSDP2
# reference; torch DDP with find_unused_parameters gives the same numbers FSDP must
REFERENCE_FOR = {("fsdp", "sometimes"): "torch ddp find_unused"}


def _misc(rank, world) -> dict:
    """The refusals that need ranks, each with its message (both ranks refuse at the same point)."""
    out = {}
    m = build("plain")
    P.DDP(m)
    out["wrapped twice"] = _refused(lambda: P.DDP(m))
    frozen = build("plain").requires_grad_(False)
    out["nothing trainable"] = _refused(lambda: P.DDP(frozen))

    def two_backwards():
        d = P.DDP(build("plain"), bucket_mb=BUCKET_MB)
        x = torch.randn(2, 3, 8)
        d(x).sum().backward()
        d.module(x).sum().backward()  # the same parameters get a second gradient before synchronising
        return {}

    out["second gradient"] = _refused(two_backwards)

    def forgot_finish():
        d = P.DDP(build("plain"))
        x = torch.randn(2, 3, 8)
        d(x).sum().backward()
        d(x)
        return {}

    out["forgot finish"] = _refused(forgot_finish)
    out["max_norm"] = _refused(lambda: P.FSDP(nn.Sequential(nn.Embedding(5, 4, max_norm=1.0))))
    out["sparse"] = _refused(lambda: P.FSDP(nn.Sequential(nn.Embedding(5, 4, sparse=True))))
    f = P.FSDP(build("plain"))
    out["weight outside forward"] = _refused(lambda: f.module.up.weight)
    out["fsdp twice"] = _refused(lambda: P.FSDP(f.module))
    out["repr"] = repr(f.module)
    idx = torch.tensor([[0, 1, 1, 3], [3, 3, 0, 2]])
    torch.manual_seed(SEED)
    dense = nn.Embedding(5, 4, padding_idx=0, scale_grad_by_freq=True)
    e = P.FSDP(nn.Sequential(nn.Embedding(5, 4, padding_idx=0, scale_grad_by_freq=True)))
    for m in (dense, e):
        (m(idx) * torch.arange(4.0)).sum().backward()
    out["embedding grads"] = (_gather_grad(e.names["0.weight"]), dense.weight.grad)  # the same idx on every rank
    return out


def zoo_matrix(rank: int, world: int) -> dict:
    """Every (wrapper, zoo module) pair: {"ours": snapshot or {"refused"}, "torch": snapshot or {"refused"}}."""
    out = {}
    for kind in ZOO:
        refs = {}
        for name, (ours, ref) in WRAPPERS.items():
            if (name, kind) in NOT_RUN:
                continue
            ref = REFERENCE_FOR.get((name, kind), ref)
            if ref not in refs:
                refs[ref] = _refused(lambda: REFERENCES[ref](kind, rank, world))
            out[f"{name}|{kind}"] = {"ours": _refused(lambda: ours(kind, rank, world)), "torch": refs[ref],
                                     "reference": ref}
            dist.barrier()
    out["misc"] = _misc(rank, world)
    return out


# ---------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def zoo():
    """Both ranks' results of every pair (one start of the ranks for the whole file)."""
    return D.run_on_ranks(zoo_matrix, 2, timeout=240)


def _diff(a, b) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def _match(ours: dict, theirs: dict, names=None) -> None:
    """Same parameters, gradients (None where torch's are) and trainable names, over torch's names (FSDP also
    lists a tied parameter's second name, which torch's named_parameters leaves out)."""
    names = sorted(theirs["params"]) if names is None else names
    assert [n for n in ours["trainable"] if n in theirs["params"]] == theirs["trainable"]
    for n in names:
        assert _diff(ours["params"][n], theirs["params"][n]) <= TOL, n
        g, h = ours["grads"][n], theirs["grads"][n]
        assert (g is None) == (h is None), (n, g, h)
        if g is not None:
            assert _diff(g, h) <= TOL, n


REFUSALS = {  # (wrapper, kind) -> what the sentence must say
    **{(w, "unused"): r"DDP: 'spare.weight', 'spare.bias' got no gradient.*find_unused_parameters=True"
       for w in DEFAULT_DDP},
}


@pytest.mark.parametrize("kind", list(ZOO))
@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_wrapper_agrees_with_torch_or_refuses(zoo, wrapper, kind):
    if (wrapper, kind) in NOT_RUN:
        pytest.skip(NOT_RUN[(wrapper, kind)])
    cells = [r[f"{wrapper}|{kind}"] for r in zoo]
    if (wrapper, kind) in REFUSALS:
        for c in cells:
            assert "refused" in c["ours"], c["ours"].keys()
            assert c["ours"]["refused"].startswith("RuntimeError: ")
            assert len(c["ours"]["refused"].split(". ")) == 1  # one sentence
            assert re.search(REFUSALS[(wrapper, kind)], c["ours"]["refused"]), c["ours"]["refused"]
            assert "refused" in c["torch"], "torch DDP raises too (at the next forward)"
        return
    for rank, c in enumerate(cells):
        assert "refused" not in c["torch"], c["torch"]
        assert "refused" not in c["ours"], c["ours"]["refused"]
        ours, theirs = c["ours"], c["torch"]
        if wrapper == "zero-2":  # a rank keeps only the gradients it owns
            for n in theirs["params"]:
                if n not in ours["owned"]:
                    assert ours["grads"][n] is None, n
                    ours["grads"][n] = theirs["grads"][n]
        _match(ours, theirs)
    a, b = (c["ours"]["params"] for c in cells)
    assert max(_diff(a[n], b[n]) for n in a) == 0.0  # replicas identical


def test_fsdp_shards_keep_requires_grad_and_count_only_trainable_elements(zoo):
    for kind in ("frozen", "plain"):
        c = zoo[0][f"fsdp|{kind}"]["ours"]
        m = build(kind)
        trainable = [p for n, p in m.named_parameters() if p.requires_grad]
        assert c["trainable elements"] == sum(math.ceil(p.numel() / 2) for p in trainable), kind
    assert zoo[0]["fsdp|frozen"]["ours"]["trainable"] == ["down.bias", "down.weight"]


def test_fsdp_keeps_layers_whole_that_define_their_own_gradient(zoo):
    assert "up.weight" not in zoo[0]["fsdp|custom"]["ours"]["sharded"]  # STELinear: its own forward
    assert {"down.weight", "down2.weight", "up.weight"} <= set(zoo[0]["fsdp|tied"]["ours"]["sharded"])
    assert {"emb.weight", "head.weight"} <= set(zoo[0]["fsdp|embedding"]["ours"]["sharded"])
    ours, dense = zoo[0]["misc"]["embedding grads"]
    assert torch.count_nonzero(ours[0]) == 0 and torch.count_nonzero(ours[1:]) > 0  # padding_idx's row: none
    assert _diff(ours, dense) <= TOL  # and scale_grad_by_freq divides each row by its count, as nn.Embedding's


def test_refusals_on_ranks_are_one_sentence(zoo):
    for misc in (r["misc"] for r in zoo):
        want = {"wrapped twice": r"ValueError: DDP: parameter 'up.weight' is already hooked by another DDP",
                "nothing trainable": r"ValueError: DDP: the MLP has no parameter that requires a gradient",
                "second gradient": r"RuntimeError: DDP: parameter '.*' got a second gradient before "
                                   r"finish_gradient_synchronization\(\)",
                "forgot finish": r"RuntimeError: DDP: the last backward's gradients were never averaged",
                "max_norm": r"ValueError: FSDP: Embedding '0' has max_norm=1.0: it rescales rows",
                "sparse": r"ValueError: FSDP: Embedding '0' has sparse=True: its gradient is sparse.*sparse=False",
                "weight outside forward": r"RuntimeError: FSDP shards this Linear's weight over 2 ranks.*"
                                          r"gather_full_params",
                "fsdp twice": r"ValueError: FSDP: this module is already wrapped"}
        for key, pattern in want.items():
            assert re.match(pattern, misc[key]["refused"]), (key, misc[key])
        assert "sharded over 2 ranks" in misc["repr"]  # printing on one rank gathers nothing


# ---------------------------------------------------------------- without ranks

def test_arguments_are_checked_before_any_communication():
    with pytest.raises(ValueError, match="bucket_mb=0.0 must be a positive float"):
        P.DDP(build("plain"), bucket_mb=0)
    with pytest.raises(ValueError, match="find_unused_parameters='yes' is not allowed"):
        P.DDP(build("plain"), find_unused_parameters="yes")
    with pytest.raises(ValueError, match="DDP wraps an nn.Module, got a list"):
        P.DDP([nn.Parameter(torch.ones(1))])
    with pytest.raises(ValueError, match="not parameter groups: got a dict with keys \\['lr', 'params'\\]"):
        P.ShardedOptimizer([{"params": build("plain").parameters(), "lr": 0.1}], torch.optim.SGD)
    with pytest.raises(ValueError, match="needs at least one parameter that requires a gradient"):
        P.ShardedOptimizer(build("plain").requires_grad_(False).parameters(), torch.optim.SGD)
    assert [n for n, _ in build("tied").named_parameters()] == ["up.weight", "up.bias", "down.weight", "down.bias"]
    assert len(P.unique_params(build("tied"))) == 4 and len(P.unique_params(build("frozen"))) == 2
