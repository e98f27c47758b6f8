"""Speculative decoding on the course GPTs: the exact rule, generation with a draft, and its theory.

Speculative sampling (Leviathan et al., 2023, "Fast Inference from Transformers via Speculative
Decoding"; Chen et al., 2023, "Accelerating Large Language Model Decoding with Speculative Sampling"):
a cheap draft proposes γ tokens x_i ~ q_i (i = 0 .. γ−1), the target scores all of them in one forward pass
(p_0 .. p_γ, p_γ being its distribution after the last proposal), and

* x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)), in order;
* the first rejected position is resampled from the residual norm(max(0, p_i − q_i));
* when all γ are accepted, a bonus token is sampled from p_γ.

Every emitted token is then distributed exactly as the target's p (the rule's proof: P(emit x) =
q(x)·min(1, p/q) + (1 − Σ min(p, q)) · max(0, p − q)(x) / Σ max(0, p − q) = min(p, q)(x) + max(0, p − q)(x) = p(x)).

* `distribution(logits, temperature)`: probabilities (float64, CPU); one-hot argmax at temperature 0 (greedy).
* `accept_probability`, `residual`, `emitted_distribution`: the rule on distributions, pure and exact;
  `sample_rule(p, q, n, rule=...)` draws n emitted tokens with the rule (or the tempting wrong rule
  "accept when p ≥ q"), and `chi_square` tests counts against p.
* `speculative_generate(target, draft, prompt, n, gamma=..., temperature=...)`: the rounds, with a course GPT
  or `NGramDraft` (prompt lookup: copy what followed the last occurrence of the current n-gram) as the draft;
  returns a `SpecResult`. A round is `draft_proposals` (the draft loop), `verify` (the target's one pass) and
  `accept_prefix` (the rule in order: the first rejection resampled, else a bonus token), as notebook 11 shows;
  `rollback(cache, length)` makes a KVCache forget what follows `length` tokens.
* `alpha(p, q)` = Σ min(p, q), and the formulas `expected_tokens(alpha, gamma)` = (1 − α^{γ+1})/(1 − α) and
  `predicted_speedup(alpha, gamma, c)` = (1 − α^{γ+1}) / ((1 − α)(γc + 1)) (Leviathan et al., 2023, eq. 1 and
  Theorem 3.8), c being the draft's cost per token relative to the target's.
* `prompts(tokens, count, length, seed)`: prompts cut from the held-out corpus (notebooks 11 and 14).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from helpers.gpt.generation import KVCache, prefill
from helpers.gpt.model import GPT
from helpers.measure.params import positive

RULES = ("exact", "p>=q")

# ---------------------------------------------------------------- the rule, on distributions


def _check_pq(p: torch.Tensor, q: torch.Tensor) -> None:
    if p.shape != q.shape or p.dim() == 0:
        raise ValueError(f"p {tuple(p.shape)} and q {tuple(q.shape)} must be distributions of the same shape (..., V)")
    for name, d in (("p", p), ("q", q)):
        if (d < 0).any() or not torch.allclose(d.sum(-1), torch.ones((), dtype=d.dtype), atol=1e-6):
            raise ValueError(f"{name} must be non-negative and sum to 1 along its last dimension")


def distribution(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Next-token probabilities (..., V) in float64 on the CPU from logits (..., V): softmax(logits / T), or
    the one-hot of the argmax at temperature 0 (greedy). Raises ValueError for a negative or non-finite T."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature < 0:
        raise ValueError(f"temperature={temperature!r} must be a finite number >= 0")
    logits = logits.detach().to("cpu", torch.float64)
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).to(torch.float64)
    return torch.softmax(logits / temperature, dim=-1)


def accept_probability(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """min(1, p / q) per token (..., V); 1 where q is 0 (the draft never proposes such a token)."""
    return torch.where(q > 0, (p / q.clamp_min(1e-300)).clamp(max=1.0), torch.ones_like(p))


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)) (..., V), the distribution a rejected position is resampled from. Where p == q the
    residual is empty (a rejection never happens); p itself is returned there so the result is a distribution."""
    r = (p - q).clamp_min(0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(1e-300), p)


def emitted_distribution(p: torch.Tensor, q: torch.Tensor, accept: torch.Tensor, resample: torch.Tensor) -> torch.Tensor:
    """The exact distribution (..., V) of the token one verification step emits: the draft proposes x ~ q, keeps
    it with probability accept[x], else a token is drawn from `resample`. Equals p for the right rule."""
    kept = q * accept
    rejected = 1 - kept.sum(-1, keepdim=True)
    return kept + torch.where(rejected > 1e-12, rejected * resample, torch.zeros_like(resample))


def alpha(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Acceptance rate Σ_x min(p, q) (...,) of one position: the probability that x ~ q is accepted
    (Leviathan et al., 2023, Definition 3.1: β = 1 − D_LK(p, q))."""
    return torch.minimum(p, q).sum(-1)


def sample_rule(p: torch.Tensor, q: torch.Tensor, n: int, *, rule: str = "exact",
                generator: torch.Generator | None = None) -> torch.Tensor:
    """n emitted tokens (n,) int64 of one verification step with target p (V,) and draft q (V,): x ~ q,
    accepted by `rule` ("exact": with probability min(1, p/q); "p>=q": whenever p(x) ≥ q(x), the tempting wrong
    rule), otherwise replaced by a draw from the residual. Vectorised: fast for n = 10⁵.
    Raises ValueError for an unknown rule, a non-positive n or p, q that are not distributions."""
    if rule not in RULES:
        raise ValueError(f"rule={rule!r}; choose one of {', '.join(map(repr, RULES))}")
    positive("n", n)
    p, q = p.double(), q.double()
    _check_pq(p, q)
    g = generator or torch.Generator().manual_seed(0)
    x = torch.multinomial(q, n, replacement=True, generator=g)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    keep = u < accept_probability(p, q)[x] if rule == "exact" else p[x] >= q[x]
    res = torch.multinomial(residual(p, q), n, replacement=True, generator=g)
    return torch.where(keep, x, res)


@dataclass
class ChiSquare:
    """Pearson's chi-square test of observed counts against a distribution: statistic, degrees of freedom,
    p-value (probability of a statistic at least this large if the counts come from the distribution);
    `passes` is p_value ≥ threshold. Tokens of probability 0 that were emitted make the statistic infinite."""

    statistic: float
    dof: int
    p_value: float
    threshold: float

    @property
    def passes(self) -> bool:
        return self.p_value >= self.threshold


def chi_square(counts: torch.Tensor, p: torch.Tensor, threshold: float = 0.001) -> ChiSquare:
    """Chi-square goodness of fit of counts (V,) against p (V,): Σ (O − E)² / E over tokens with p > 0, dof =
    (number of such tokens) − 1, p-value = Q(dof/2, χ²/2) (the regularised upper incomplete gamma function).
    Raises ValueError for mismatched shapes, an empty sample or a threshold outside (0, 1)."""
    counts, p = counts.double(), p.double()
    if counts.shape != p.shape or counts.sum() <= 0:
        raise ValueError("counts and p must have the same shape (V,) and counts a positive total")
    if not 0 < threshold < 1:
        raise ValueError(f"threshold={threshold!r} must be in (0, 1)")
    expected = counts.sum() * p
    support = p > 0
    if (counts[~support] > 0).any():
        return ChiSquare(math.inf, int(support.sum()) - 1, 0.0, threshold)
    stat = float(((counts[support] - expected[support]) ** 2 / expected[support]).sum())
    dof = int(support.sum()) - 1
    pv = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                       torch.tensor(stat / 2, dtype=torch.float64))) if dof > 0 else 1.0
    return ChiSquare(stat, dof, pv, threshold)


# ---------------------------------------------------------------- the theory


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens per target pass, (1 − α^{γ+1}) / (1 − α) (γ + 1 at α = 1). Leviathan et al., 2023, eq. 1."""
    _check_theory(alpha, gamma, 0.0)
    return gamma + 1.0 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    """Walltime improvement (1 − α^{γ+1}) / ((1 − α)(γc + 1)) over plain decoding, for a draft costing c target
    passes per token and a verification pass costing one plain step (Leviathan et al., 2023, Theorem 3.8)."""
    _check_theory(alpha, gamma, c)
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def _check_theory(alpha: float, gamma: int, c: float) -> None:
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha={alpha!r} must be in [0, 1]")
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 0:
        raise ValueError(f"gamma={gamma!r} must be an int >= 0")
    if not (isinstance(c, (int, float)) and c >= 0 and math.isfinite(c)):
        raise ValueError(f"c={c!r} must be a finite number >= 0")


# ---------------------------------------------------------------- caches


def rollback(cache, length: int) -> None:
    """Make `cache` (a KVCache or anything with a `length`) forget every token after the first `length`: the
    stale slots are overwritten by the next write. Raises ValueError for a length outside 0 .. cache.length."""
    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= cache.length:
        raise ValueError(f"length={length!r} must be an int in 0..{cache.length} (the tokens cached)")
    cache.length = length


# ---------------------------------------------------------------- drafts


class NGramDraft:
    """Prompt lookup (a draft with no model): find the latest earlier occurrence of the sequence's last `n`
    tokens and propose the γ tokens that followed it, as one-hot q (a deterministic draft). Proposes nothing
    when the n-gram has not occurred before. Raises ValueError for n < 1."""

    def __init__(self, n: int = 3):
        self.n = positive("n", n)

    def propose(self, seq: list[int], gamma: int) -> list[int]:
        """Up to γ proposed tokens continuing `seq` (possibly none)."""
        if len(seq) <= self.n:
            return []
        tail = seq[-self.n:]
        for start in range(len(seq) - self.n - 1, -1, -1):
            if seq[start:start + self.n] == tail:
                return seq[start + self.n:start + self.n + gamma]
        return []


# ---------------------------------------------------------------- prompts


def prompts(tokens: torch.Tensor, count: int, length: int, seed: int = 0) -> list[torch.Tensor]:
    """`count` prompts (length,) int64 from random offsets of a 1-D token tensor (the held-out corpus), each
    starting after a newline when one is near, so that prompts open on a line. Raises ValueError if too short."""
    if len(tokens) < length + 200:
        raise ValueError(f"{len(tokens)} tokens are too few for prompts of {length}")
    g = torch.Generator().manual_seed(seed)
    out = []
    for start in torch.randint(0, len(tokens) - length - 200, (count,), generator=g).tolist():
        window = tokens[start:start + 200].tolist()
        nl = window.index(10) + 1 if 10 in window[:199] else 0
        out.append(tokens[start + nl:start + nl + length].long())
    return out


# ---------------------------------------------------------------- generation


@dataclass
class SpecResult:
    """What one speculative generation did.

    tokens: (n,) int64 emitted tokens; target_passes: verification passes of the target; draft_passes: draft
    forward passes; proposed / accepted: draft tokens proposed / accepted; betas: Σ min(p, q) at every verified
    position (positions whose draft prefix was accepted); window: the index i (0..γ-1) of each of those positions
    in its draft window; positions: its index among the generated tokens (0 .. n-1); accepted_at: whether each
    was accepted.
    """

    tokens: torch.Tensor
    target_passes: int = 0
    draft_passes: int = 0
    proposed: int = 0
    accepted: int = 0
    betas: list[float] = field(default_factory=list)
    window: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    accepted_at: list[bool] = field(default_factory=list)

    @property
    def tokens_per_pass(self) -> float:
        """Emitted tokens per target pass (the prefill excluded)."""
        return len(self.tokens) / max(self.target_passes, 1)

    @property
    def alpha(self) -> float:
        """Mean Σ min(p, q) over verified positions (nan when none were verified)."""
        return sum(self.betas) / len(self.betas) if self.betas else float("nan")

    @property
    def acceptance(self) -> float:
        """Share of proposed draft tokens that were accepted (nan when none were proposed)."""
        return self.accepted / self.proposed if self.proposed else float("nan")

    def add_round(self, ps: torch.Tensor, qs: list[torch.Tensor], xs: list[int], kept: int, start: int) -> None:
        """Count one round: `xs` proposed, the first `kept` accepted; every verified position (the kept ones and the
        first rejected one) adds its Σ min(p, q), window index, generated position (from `start`) and verdict."""
        self.proposed += len(xs)
        self.accepted += kept
        for i in range(min(kept + 1, len(xs))):
            self.betas.append(float(alpha(ps[i], qs[i])))
            self.window.append(i)
            self.positions.append(start + i)
            self.accepted_at.append(i < kept)


def draw(dist: torch.Tensor, g: torch.Generator) -> int:
    """One token id drawn from `dist` (V,) with generator `g`."""
    return int(torch.multinomial(dist, 1, generator=g))


def one_sequence(prompt: torch.Tensor) -> torch.Tensor:
    """A prompt of one sequence, (T,) or (1, T), as (T,); ValueError for a batch (this loop serves one) or no token."""
    if prompt.dim() > 2 or (prompt.dim() == 2 and prompt.size(0) != 1) or prompt.numel() < 1:
        raise ValueError(f"speculative decoding here serves one sequence of at least one token, (T,) or (1, T); "
                         f"got shape {tuple(prompt.shape)}")
    return prompt.reshape(-1)


def start_caches(target: GPT, draft, prompt: torch.Tensor, n: int, gamma: int, temperature: float):
    """Validate a speculative generation and start it: (target's KVCache, draft's KVCache or None for an NGramDraft),
    each holding the prompt (T,) but its last token, with room for n + γ - 1 more. Raises ValueError for bad n, gamma,
    temperature or draft, a vocabulary mismatch or a sequence longer than a model's seq_len."""
    positive("n", n)
    positive("gamma", gamma)
    distribution(torch.zeros(1), temperature)  # validates the temperature
    is_model = isinstance(draft, GPT)
    if not is_model and not isinstance(draft, NGramDraft):
        raise ValueError(f"draft must be a GPT or an NGramDraft, not {type(draft).__name__}")
    T, V = prompt.numel(), target.config.vocab_size  # T >= 1: one_sequence refused an empty prompt
    limit = min(target.config.seq_len, draft.config.seq_len if is_model else 10 ** 9)
    if T + n + gamma - 1 > limit:  # the last round's verification writes position T + n + γ - 2 at most
        raise ValueError(f"prompt {T} + n {n} + gamma {gamma} - 1 positions pass the models' seq_len={limit}")
    if is_model and draft.config.vocab_size != V:
        raise ValueError(f"draft vocabulary {draft.config.vocab_size} differs from the target's {V}")
    device = next(target.parameters()).device
    caches = []
    for model in (target, draft) if is_model else (target,):
        cache = KVCache(model.config, 1, T + n + gamma - 1, dtype=next(model.parameters()).dtype, device=device)
        if T > 1:
            prefill(model, prompt[None, :-1].to(device), cache)
        caches.append(cache)
    return caches[0], caches[1] if is_model else None


def lookup_proposals(draft: NGramDraft, seq: list[int], gamma: int, vocab: int) -> tuple[list[int], list[torch.Tensor]]:
    """Prompt lookup's proposals (up to γ, possibly none) and their q_i, one-hot (vocab,) float64."""
    xs = draft.propose(seq, gamma)
    return xs, [torch.nn.functional.one_hot(torch.tensor(x), vocab).double() for x in xs]


def draft_proposals(draft: GPT, cache: KVCache, pending: list[int], gamma: int, temperature: float,
                    g: torch.Generator) -> tuple[list[int], list[torch.Tensor]]:
    """The draft loop: γ tokens x_0 .. x_{γ-1}, each x_i ~ q_i, and the q_i ((V,) float64) they were drawn from.
    `pending` holds the tokens the draft's cache still lacks, the current token last. γ decode steps of the draft."""
    device = cache.k.device
    xs, qs = [], []
    feed = pending  # first step: catch the cache up on `pending`, then predict what follows the current token
    for _ in range(gamma):
        # reads the draft's weights and its cache; writes len(feed) new keys/values into the cache
        logits = draft(torch.tensor([feed], device=device), cache=cache)[0][0, -1]  # (V,) after the last fed token
        qs.append(distribution(logits, temperature))  # q_i: kept, the rule needs it
        xs.append(draw(qs[-1], g))  # x_i ~ q_i
        feed = [xs[-1]]  # the next step feeds only the token just drawn
    return xs, qs


def verify(target: GPT, cache: KVCache, current: int, xs: list[int], temperature: float) -> torch.Tensor:
    """The verification pass: the target's distributions p_0 .. p_k ((k + 1, V) float64) after `current` and after
    each of the k proposals `xs`, from ONE forward pass over k + 1 tokens against its cache."""
    tokens = torch.tensor([[current] + xs], device=cache.k.device)  # (1, k + 1): current, x_0 .. x_{k-1}
    # reads the target's weights once for all k + 1 tokens; writes k + 1 keys/values (the rejected ones are rolled back)
    logits = target(tokens, cache=cache)[0][0]  # (k + 1, V): row i predicts the token after tokens[i]
    return distribution(logits, temperature)  # p_i judges x_i; p_k is the bonus position's


def accept_prefix(ps: torch.Tensor, qs: list[torch.Tensor], xs: list[int], g: torch.Generator) -> list[int]:
    """The tokens one round emits: the proposals the rule keeps, in order (x_0 .. x_{k-1}), then one token more,
    drawn from the residual at the first rejection or, when all were kept, from p_k (the bonus token)."""
    for i, x in enumerate(xs):
        u = torch.rand(1, generator=g, dtype=torch.float64)  # one uniform draw per verified position
        if not bool(u < accept_probability(ps[i], qs[i])[x]):  # keep x_i with probability min(1, p_i(x_i) / q_i(x_i))
            # rejected: replace x_i by a draw from norm(max(0, p_i − q_i)); x_{i+1} .. are discarded
            return xs[:i] + [draw(residual(ps[i], qs[i]), g)]
    return xs + [draw(ps[len(xs)], g)]  # all kept: the target's pass already scored one position more


@torch.no_grad()
def speculative_generate(target: GPT, draft, prompt: torch.Tensor, n: int, *, gamma: int = 4,
                         temperature: float = 0.0, seed: int = 0, return_caches: bool = False):
    """n tokens after `prompt` (T,) or (1, T), T ≥ 1, every one distributed as the target's sampling would be.

    draft: a GPT with the target's vocabulary, or an `NGramDraft`. Each round the draft proposes γ tokens
    (fewer for an n-gram draft), the target runs the current token and all proposals in ONE forward pass
    against its KVCache, the rule accepts a prefix, a token is resampled or a bonus one drawn, and both caches
    are rolled back to the accepted sequence. temperature 0 is greedy (output identical to the target's greedy
    decoding). Draws come from a generator seeded with `seed`. Returns a `SpecResult` (and, with return_caches,
    (result, target_cache, draft_cache, committed tokens held in the caches)).
    Raises ValueError for bad n, gamma, a vocabulary mismatch, a batch, or a sequence longer than a model's seq_len.
    """
    prompt = one_sequence(prompt)  # (T,) or (1, T) -> (T,): one sequence, a batch is refused
    tcache, dcache = start_caches(target, draft, prompt, n, gamma, temperature)  # all of the prompt but its last token
    g = torch.Generator().manual_seed(seed)
    seq = prompt.tolist()  # every committed token; the last one (the current token) is not yet in the target's cache
    pending = [seq[-1]]  # the tokens the draft's cache still lacks, the current token last
    res = SpecResult(tokens=torch.empty(0, dtype=torch.long))
    out: list[int] = []
    while len(out) < n:
        committed = len(seq) - 1  # tokens in the target's cache that stay
        # 1. the draft proposes γ tokens x_i ~ q_i
        if dcache is None:
            xs, qs = lookup_proposals(draft, seq, gamma, target.config.vocab_size)
        else:
            xs, qs = draft_proposals(draft, dcache, pending, gamma, temperature, g)
            res.draft_passes += gamma
        # 2. the target scores the current token and every proposal in one pass: p_0 .. p_k
        ps = verify(target, tcache, seq[-1], xs, temperature)
        res.target_passes += 1
        # 3. accept a prefix, then resample the first rejection or draw the bonus token
        new = accept_prefix(ps, qs, xs, g)
        kept = len(new) - 1
        res.add_round(ps, qs, xs, kept, len(out))
        out += new
        seq += new
        # 4. roll both caches back to the committed sequence: the current token and the kept proposals stay
        rollback(tcache, committed + 1 + kept)
        if dcache is not None:
            # its cache: committed, then the old current token and x_0 .. x_{γ-2} (it drew x_{γ-1} but never fed it)
            rollback(dcache, min(dcache.length, committed + 1 + kept))  # keep old current + kept x's, if it holds them
            pending = seq[dcache.length:]  # what it lacks: [new current], or [x_{γ-1}, new current] if all γ were kept
    res.tokens = torch.tensor(out[:n], dtype=torch.long)
    if return_caches:
        return res, tcache, dcache, seq[:-1]
    return res
