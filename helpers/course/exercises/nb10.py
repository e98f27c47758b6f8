"""Notebook 10's exercises: the KV cache's update (checked down to identical greedy tokens), and a model's
KV-cache size from its published configuration."""
from __future__ import annotations

import torch

from helpers.course.check import Case, register
from helpers.gpt.generation import KVCache, generate
from helpers.gpt.model import GPT, GPTConfig

# ---------------------------------------------------------------- 10.update (code)


def _reference_update(k_buf, v_buf, k, v, length):
    """Write k, v (B, H_kv, T, hd) into slots length .. length+T of k_buf, v_buf (B, H_kv, max_len, hd) in place;
    return views of the filled slots 0 .. length+T."""
    end = length + k.size(2)
    k_buf[:, :, length:end] = k
    v_buf[:, :, length:end] = v
    return k_buf[:, :, :end], v_buf[:, :, :end]


class _LearnerCache(KVCache):
    """A KVCache whose only write is the learner's update function."""

    def __init__(self, fn, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fn = fn

    def update(self, layer, k, v):
        out = self.fn(self.k[layer], self.v[layer], k, v, self.length)
        if out is None:
            raise NotImplementedError("the function returns None")
        return out


def _tiny(n_kv_head: int, seed: int) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_kv_head=n_kv_head, d_model=32, d_ff=64, seq_len=40)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)  # far from ties, so that greedy tokens are a sharp test
    return model


def _run(fn, case: Case):
    """Direct cases: the returned views and both buffers afterwards. 'generate' cases: greedy tokens of a small
    GPT whose cache writes through fn (prefill, then one token at a time)."""
    if case.kwargs.get("generate"):
        n_kv_head, seed = case.args
        model = _tiny(n_kv_head, seed)
        prompt = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(seed))
        return generate(model, prompt, 24, make_cache=lambda *a, **k: _LearnerCache(fn, *a, **k))
    k_buf, v_buf, k, v, length = case.args
    out = fn(k_buf, v_buf, k, v, length)
    if out is None:
        raise NotImplementedError("the function returns None")
    keys, values = out
    return keys, values, k_buf, v_buf


def _direct(B, H, max_len, hd, T, length, seed):
    g = torch.Generator().manual_seed(seed)
    k_buf, v_buf = torch.randn(B, H, max_len, hd, generator=g), torch.randn(B, H, max_len, hd, generator=g)
    return (k_buf, v_buf, torch.randn(B, H, T, hd, generator=g), torch.randn(B, H, T, hd, generator=g), length)


def _update_cases() -> list[Case]:
    return [
        Case("first token into an empty cache", _direct(1, 2, 8, 4, 1, 0, 1)),
        Case("a prompt of 5 tokens after 3 cached, odd head_dim 7", _direct(2, 3, 12, 7, 5, 3, 2)),
        Case("one token filling the last slot (MQA, one kv head)", _direct(3, 1, 6, 4, 1, 5, 3)),
        Case("greedy generation, MHA: tokens must be identical", (4, 0), {"generate": True}),
        Case("greedy generation, GQA (2 kv heads)", (2, 1), {"generate": True}),
        Case("greedy generation, MQA (1 kv head)", (1, 2), {"generate": True}),
    ]


def _off_by_one(k_buf, v_buf, k, v, length):
    """Planted wrong: writes one slot too early (over the last cached token)."""
    start = max(0, length - 1)
    k_buf[:, :, start:start + k.size(2)] = k
    v_buf[:, :, start:start + k.size(2)] = v
    return k_buf[:, :, :length + k.size(2)], v_buf[:, :, :length + k.size(2)]


def _whole_buffer(k_buf, v_buf, k, v, length):
    """Planted wrong: returns every slot, the empty ones too."""
    _reference_update(k_buf, v_buf, k, v, length)
    return k_buf, v_buf


def _new_only(k_buf, v_buf, k, v, length):
    """Planted wrong: stores, but attends over the new tokens only (the cache is forgotten)."""
    _reference_update(k_buf, v_buf, k, v, length)
    return k, v


register(
    "10.update", "code",
    prompt="write the KV cache's update: store the new keys and values after the cached ones, return all of them",
    hint="the buffers' third dimension is time: the new tokens belong right after the cached ones, the "
         "buffers must change in place, and attention needs every filled slot but no empty one",
    solution=_reference_update,
    wrong=(_off_by_one, _whole_buffer, _new_only),
    cases=_update_cases,
    run=_run,
    rtol=0.0, atol=0.0,
    tolerance="exact: the same values in the same slots, and identical greedy tokens",
    outputs=("keys returned", "values returned", "k_buf after the call (write in place)", "v_buf after the call"),
)

# ---------------------------------------------------------------- 10.kv_gib (value)

register(
    "10.kv_gib", "value",
    prompt="Llama 3 70B (80 layers, 64 query heads, 8 kv heads, head_dim 128; Meta's model card and config.json) "
           "in bf16: how many GiB of KV cache does one sequence of 8192 tokens occupy?",
    hint="use the theory's bytes-per-token formula; ask yourself which of the two head counts has a cache, "
         "and remember a GiB is a power of two",
    solution=lambda: 2 * 80 * 8 * 128 * 2 * 8192 / 2**30,
    wrong=(2 * 80 * 64 * 128 * 2 * 8192 / 2**30, 80 * 8 * 128 * 2 * 8192 / 2**30, 2 * 80 * 8 * 128 * 4 * 8192 / 2**30),
    rtol=1e-3,
)
