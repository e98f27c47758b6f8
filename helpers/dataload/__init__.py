"""Data loading and sequence packing for the course GPT: notebook 12. Imports `measure` and `show`.

`loading`      documents of heavy-tailed lengths cut from the corpus (numpy or Python-list store), the
               map-style dataset, the seeded DataLoader and its pad/pack collate, DistributedSampler's
               shards per rank, the memory-mapped token file baseline, one training step on a batch,
               written host buffers for pinned copies
`packing`      whole documents in fixed-length rows (first-fit decreasing), the block-diagonal causal mask,
               positions restarting per document, the GPT forward on packed rows, per-document losses,
               FlexAttention's block mask and cu_seqlens for attention without a T^2 mask
`loading_sweep_lab`    notebook 12's measurement protocol over loaders (fresh loaders warmed up until steady, blocks
               of steps interleaved in rotated rounds within a seconds budget, medians and IQRs), the contention
               it met (the main thread's share of its compute's wall time, a probe loop), and the sentences
               generated from it, rankings withheld on a shared machine
`packing_lab`  notebook 12's variable-length attention: dense mask and FlexAttention checked against each
               document alone, the bytes of the dense mask, the BlockMask and cu_seqlens counted
`loading_lab`  notebook 12's measurements: the wait / copy / compute breakdown of a step, loader sweeps,
               persistent workers, a forked worker's memory growth, host-to-device bandwidth and
               copy/compute overlap (CUDA), the breakdown figure, the notebook's parameter checks
`loading_takeaways_lab`  notebook 12's closing sentences, generated from the run's numbers
"""
