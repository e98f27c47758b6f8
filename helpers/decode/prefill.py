"""Prefill on the paged KV cache, two ways a server saves on it (notebook 10):

* `shared_prefix_generate`: requests that share a prompt, served on shared blocks with copy-on-write
  (`PagedKVCache.fork`, the vLLM paper's prefix sharing) or on their own blocks, for the comparison of tokens,
  logits and block counts.
* `chunked_prefill`: a long prompt prefilled in chunks interleaved with other requests' decode steps
  (Sarathi's and vLLM's chunked prefill), so that it never stalls them for a whole prefill.

Both decode greedily with the course GPT; the schedulers that serve a request mix are `helpers.decode.serving`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from helpers.decode.paged import PagedKVCache, blocks_for
from helpers.measure.params import positive


@dataclass
class SharedPrefixRun:
    """What `shared_prefix_generate` produced: each request's greedy tokens, the logits of every position it
    computed after the prompt (suffix and generated tokens, (n_requests, T, vocab)), and the cache's block
    counts at the end, before anything is freed: `physical` blocks held, `logical` blocks the tables name
    (what an unshared cache holds for the same tokens), `cow_copies` blocks copied on a shared write."""

    tokens: list[list[int]]
    logits: torch.Tensor
    physical: int
    logical: int
    cow_copies: int


@torch.no_grad()
def shared_prefix_generate(model, prompt: Sequence[int], suffixes: Sequence[Sequence[int]], new_tokens: int, *,
                           block_size: int = 16, share: bool = True) -> SharedPrefixRun:
    """Requests i = `prompt` + `suffixes[i]` (all suffixes one length), each continued greedily by
    `new_tokens` tokens, on one paged cache (the vLLM paper's prefix sharing, section 4.4).

    share=True: the prompt is prefilled once, as its own sequence; every request is `fork`ed from it (its
    blocks shared, counts + 1) and the prompt's own entry is freed, so only the requests hold the blocks.
    The requests' suffixes and decode steps then run as one batch; a request that writes into a block others
    still hold (the prompt's partly filled last block) gets a private copy first (copy-on-write), and the last
    holder writes in place. share=False: each request prefills the prompt into its own blocks, in one batch
    of the same requests, then the same suffix and decode steps. Raises ValueError for an empty prompt or
    suffix list, suffixes of different lengths, or new_tokens < 1.
    """
    positive("new_tokens", new_tokens)
    if not prompt or not suffixes or len({len(s) for s in suffixes}) != 1 or not suffixes[0]:
        raise ValueError("need a non-empty prompt and one or more non-empty suffixes of the same length")
    n, total = len(suffixes), len(prompt) + len(suffixes[0]) + new_tokens
    cache = PagedKVCache.for_model(model, num_blocks=n * blocks_for(total, block_size) + 1, block_size=block_size)
    dev = cache.k_pool.device
    rids = list(range(n))

    def forward(sids, rows):
        cache.set_batch(sids)
        return model(torch.tensor(rows, dtype=torch.long, device=dev), cache=cache)[0]

    if share:
        cache.add("prompt")
        forward(["prompt"], [list(prompt)])
        for r in rids:
            cache.fork("prompt", r)
        cache.free("prompt")
    else:
        for r in rids:
            cache.add(r)
        forward(rids, [list(prompt)] * n)
    logits = [forward(rids, [list(s) for s in suffixes])]
    out = [[t] for t in logits[-1][:, -1].argmax(-1).tolist()]
    for _ in range(new_tokens - 1):
        logits.append(forward(rids, [[o[-1]] for o in out]))
        for o, t in zip(out, logits[-1][:, -1].argmax(-1).tolist()):
            o.append(t)
    return SharedPrefixRun(out, torch.cat(logits, 1), cache.allocator.num_used, cache.logical_blocks(),
                           cache.cow_copies)


@torch.no_grad()
def chunked_prefill(model, prompt: Sequence[int], chunk: int, *, others: Sequence[Sequence[int]] = (),
                    decode_steps: int | None = None, block_size: int = 16) -> tuple[torch.Tensor, list[list[int]]]:
    """Prefill `prompt` in chunks of `chunk` tokens, each chunk one forward over the cached earlier chunks,
    interleaved with greedy decode steps of the requests `others` (their prompts, prefilled first), as a
    scheduler does so that a long prompt never stalls the running requests for a whole prefill (Agrawal et
    al., 2023, Sarathi; vLLM's chunked prefill).

    Each iteration runs one chunk of `prompt`, then one decode step of every request in `others`; after the
    prompt's last chunk the others go on until each has `decode_steps` tokens (default: the number of
    chunks). Returns (the prompt's logits at every position, (len(prompt), vocab); each other request's
    greedy tokens). With chunk >= len(prompt) this is a plain prefill. Raises ValueError for an empty prompt,
    chunk < 1, an empty prompt in `others`, or a request that would pass the model's seq_len.
    """
    positive("chunk", chunk)
    if not prompt or any(not o for o in others):
        raise ValueError("the prompt and every request of `others` need at least one token")
    n_chunks = blocks_for(len(prompt), chunk)
    steps = n_chunks if decode_steps is None else decode_steps
    if steps < n_chunks:
        raise ValueError(f"decode_steps={steps} must cover the {n_chunks} chunk iterations")
    longest = max([len(prompt)] + [len(o) + steps for o in others])
    if longest > model.config.seq_len:
        raise ValueError(f"a request would reach {longest} tokens, past seq_len={model.config.seq_len}")
    need = blocks_for(len(prompt), block_size) + sum(blocks_for(len(o) + steps, block_size) for o in others)
    cache = PagedKVCache.for_model(model, num_blocks=need, block_size=block_size)
    dev = cache.k_pool.device
    rows = [("other", i) for i in range(len(others))]

    def forward(sids, ids):
        cache.set_batch(sids)
        return model(torch.tensor(ids, dtype=torch.long, device=dev), cache=cache)[0]

    outs: list[list[int]] = []
    for sid, o in zip(rows, others):  # the running requests: prefilled, holding their first token
        cache.add(sid)
        outs.append([int(forward([sid], [list(o)])[0, -1].argmax())])
    cache.add("long")
    got = []
    for i in range(steps):
        if i < n_chunks:
            got.append(forward(["long"], [list(prompt[i * chunk:(i + 1) * chunk])])[0])
        if rows and i < steps - 1:
            nxt = forward(rows, [[o[-1]] for o in outs])[:, -1].argmax(-1).tolist()
            for o, t in zip(outs, nxt):
                o.append(t)
    return torch.cat(got, 0), outs
