"""Decoding and serving: the KV cache, decode as a bandwidth problem, paged caches and batching (notebook
10) and speculative decoding (notebook 11). Imports `lowbit`, `gpt`, `measure` and `show`; the contiguous
cache, prefill, the decode step and the sampler are `gpt`'s `generation`.

`kv_cache`         the static cache and decode step for compiled decode (with their Inductor options),
                   the MLA-style latent cache on a factorised k/v projection, KV bytes per token and
                   published models' caches
`paged`            the paged KV cache (vLLM): free list with reference counts, block tables, prefix
                   sharing with copy-on-write (`fork`), the cache GPT.forward runs on, waste against
                   preallocation
`paged_attention`  decode and prefill attention read through block tables: PyTorch, a Triton kernel
                   (interpreted without a GPU, compiled ahead of time for sm_90), references
`serving`          seeded request mixes, the static and continuous batching scheduler with preemption,
                   a request served alone, shared-prefix generation, chunked prefill
`speculative`      speculative sampling: the exact rule on distributions, rollback, the n-gram draft,
                   generation with a draft, the tokens-per-pass and speedup formulas
`kv_lab`           notebook 10's measurements of one sequence's cache: with and without it, prefill
                   against decode, decode bandwidth and batching, attention variants, compiled decode
`serving_lab`      notebook 10's serving sections: paged waste (the course's mix and vLLM-like workloads) and
                   decode speed, prefix sharing, static against continuous batching, chunked prefill, the
                   KV-memory panel, the verdicts on paged waste and continuous batching
`spec_lab`         notebook 11's measurements: greedy and chi-square exactness, step costs, the speed
                   grid against the formula, acceptance by position, the formula's prediction on a
                   bandwidth-bound target with the costs measured, the ledger's verdicts, figures and sentences
"""
