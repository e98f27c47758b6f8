"""Notebook 11's exercises: the speculative sampling rule (checked by the exact distribution it emits and its
acceptance rate), and the speedup formula's prediction and best γ."""
from __future__ import annotations

import torch

from helpers.decode import speculative
from helpers.course.check import Case, register

# ---------------------------------------------------------------- 11.rule (code)


def _reference_rule(p, q):
    """accept (..., V) = min(1, p / q) (1 where q = 0), resample (..., V) = norm(max(0, p − q))."""
    return speculative.accept_probability(p, q), speculative.residual(p, q)


def _run(fn, case: Case):
    """The learner's rule applied to x ~ q: the exact distribution of the emitted token, and the acceptance rate
    Σ_x q(x)·accept(x) (must be Σ min(p, q), the most any exact rule can accept)."""
    p, q = case.args
    out = fn(p.clone(), q.clone())
    if out is None:
        raise NotImplementedError("the function returns None")
    accept, resample = out
    accept, resample = torch.as_tensor(accept, dtype=torch.float64), torch.as_tensor(resample, dtype=torch.float64)
    return speculative.emitted_distribution(p, q, accept, resample), (q * accept).sum(-1)


def _dirichlet(shape, seed, zeros=0):
    g = torch.Generator().manual_seed(seed)
    x = -torch.rand(shape, generator=g, dtype=torch.float64).log()
    if zeros:
        x[..., -zeros:] = 0  # tokens cut off (e.g. by top-k): probability 0 under this model
    return x / x.sum(-1, keepdim=True)


def _one_hot(i, V):
    return torch.nn.functional.one_hot(torch.tensor(i), V).double()


def _rule_cases() -> list[Case]:
    P = torch.tensor([0.30, 0.25, 0.05, 0.20, 0.15, 0.05], dtype=torch.float64)
    Q = torch.tensor([0.10, 0.15, 0.30, 0.10, 0.05, 0.30], dtype=torch.float64)
    both = _dirichlet((7,), 3, zeros=2)
    qz = _dirichlet((7,), 4, zeros=3)
    return [
        Case("vocabulary of 6, the draft over-proposes tokens 2 and 5", (P, Q)),
        Case("a batch of 3 positions, odd vocabulary of 7", (_dirichlet((3, 7), 1), _dirichlet((3, 7), 2))),
        Case("the draft never proposes 3 tokens the target likes (q = 0 there)", (_dirichlet((7,), 5), qz)),
        Case("tokens neither model allows (p = q = 0, as after top-k)", (both, _dirichlet((7,), 6, zeros=2))),
        Case("a perfect draft, p == q (nothing is ever rejected)", (P, P.clone())),
        Case("greedy, the two argmaxes agree (one-hot p and q)", (_one_hot(2, 5), _one_hot(2, 5))),
        Case("greedy, the argmaxes differ", (_one_hot(1, 5), _one_hot(3, 5))),
    ]


def _accept_when_larger(p, q):
    """Planted wrong: the tempting rule, accept whenever p(x) >= q(x)."""
    return (p >= q).double(), speculative.residual(p, q)


def _never_accept(p, q):
    """Planted wrong: exact but useless, it always samples from p itself (acceptance 0)."""
    return torch.zeros_like(p), p


def _unnormalised(p, q):
    """Planted wrong: the residual max(0, p − q) left unnormalised."""
    return speculative.accept_probability(p, q), (p - q).clamp_min(0)


register(
    "11.rule", "code",
    prompt="write speculative_rule(p, q): target and draft distributions (..., V) -> (accept, resample), the "
           "probability of keeping a proposed token x (per token, (..., V)) and the distribution to resample from "
           "after a rejection ((..., V)); where q = 0, accept must still be finite (never NaN), and where p = q it "
           "must be 1 wherever q > 0, with resample free of NaN though never drawn from",
    hint="keep x as often as the target allows relative to the draft, never more than always; after a rejection, "
         "draw only where the target has more mass than the draft, in proportion to the difference; guard the "
         "divisions where q or the difference is 0 (torch.where), so that no NaN appears",
    solution=_reference_rule,
    wrong=(_accept_when_larger, _never_accept, _unnormalised),
    cases=_rule_cases, run=_run, outputs=("distribution of the emitted token", "acceptance rate"),
    rtol=1e-9, atol=1e-12,
    tolerance="the emitted distribution and the acceptance rate to float64 rounding (atol 1e-12)",
)

# ---------------------------------------------------------------- 11.speedup, 11.best_gamma (value)

ALPHA, C, GAMMA = 0.8, 0.1, 4


def _speedup(gamma: int) -> float:
    return (1 - ALPHA ** (gamma + 1)) / ((1 - ALPHA) * (gamma * C + 1))


register(
    "11.speedup", "value",
    prompt="a draft accepted at rate alpha = 0.8 costs c = 0.1 of a target pass per token: what speedup over plain "
           "decoding does the formula predict at gamma = 4?",
    hint="expected tokens per target pass, divided by the cost of one round (gamma draft steps and one target pass) "
         "in target passes",
    solution=lambda: _speedup(GAMMA),
    wrong=((1 - ALPHA ** (GAMMA + 1)) / (1 - ALPHA), (1 - ALPHA ** GAMMA) / ((1 - ALPHA) * (GAMMA * C + 1)), 1.0),
    rtol=2e-3,
)

register(
    "11.best_gamma", "value",
    prompt="for the same draft (alpha = 0.8, c = 0.1), which gamma gives the largest predicted speedup?",
    hint="each extra draft token adds c to the cost of a round but only alpha^(gamma+1) to the expected tokens; "
         "evaluate the formula for gamma = 1, 2, 3, ... and stop when it turns down",
    solution=lambda: max(range(1, 30), key=_speedup),
    wrong=(GAMMA, 1, 10),
    rtol=1e-9,
)
