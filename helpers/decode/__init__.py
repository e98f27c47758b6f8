"""Decoding and serving: the KV cache, decode as a bandwidth problem, paged caches and batching (notebook
10) and speculative decoding (notebook 11). Imports `lowbit`, `gpt`, `measure` and `show`; the contiguous
cache, prefill, the decode step and the sampler are `gpt`'s `generation`.

Technique modules:

`kv_cache`         the static cache and decode step for compiled decode (with their Inductor options),
                   the MLA-style latent cache on a factorised k/v projection, KV bytes per token,
                   published models' caches, and what each attention variant's cache holds in a budget
`gqa_uptrain`      GQA and MQA made from a trained multi-head model: each group's key and value heads
                   mean-pooled into one, then uptrained with the pre-training's recipe (Ainslie et al., 2023)
`kv_quant`         the int8 and fp8 KV cache (per-token, per-head scales), its bytes per token and budget
                   rows, greedy agreement and validation loss through it
`paged`            the paged KV cache (vLLM): free list with reference counts, block tables, prefix
                   sharing with copy-on-write (`fork`), the cache GPT.forward runs on, waste against
                   preallocation
`paged_attention`  decode and prefill attention read through block tables: PyTorch, a Triton kernel
                   (interpreted without a GPU, compiled ahead of time for sm_90), references
`serving`          seeded request mixes, the static and the continuous batching scheduler (with
                   preemption), a request served alone
`prefill`          shared-prefix generation on copy-on-write blocks, chunked prefill
`speculative`      speculative sampling: the exact rule on distributions, rollback, the n-gram draft,
                   generation with a draft, the tokens-per-pass and speedup formulas, prompts cut from
                   the held-out corpus

Labs (each notebook's measurements, by the technique they measure):

`kv_cache_lab`            notebook 10's parameters and one sequence's cache: with and without it, prefill
                          against decode on the roofline; the timing helpers both KV labs use
`kv_decode_lab`           notebook 10's decode speed: bandwidth and batching, attention variants, compiled
                          decode; GQA and MQA uptrained from the trained MHA model, by held-out loss
`paged_lab`               notebook 10's paged cache: waste (the course's mix and vLLM-like workloads) and
                          decode-attention speed, the KV-memory panel, the verdict on paged waste
`serving_lab`             notebook 10's serving: prefix sharing, chunked prefill, static against continuous
                          batching, the verdict on continuous batching
`speculative_lab`         notebook 11's parameters and measurements: greedy and chi-square exactness, step
                          costs, the speed grid
`speculative_report_lab`  notebook 11's readings of them: acceptance by position, the gap to the formula, the
                          formula's prediction on a bandwidth-bound target, the ledger's verdicts, sentences
                          and figures
"""
