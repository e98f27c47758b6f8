"""The training-step techniques: mixed precision (notebook 03), activation checkpointing (04) and
gradient accumulation (05). Imports `gpt`, `measure` and `show`.

`precision`          number formats (bits, range, rounding to any of them), the dynamic loss scaler
                     with GradScaler's state machine, fp32 master weights; used by notebook 03 and
                     by `lowbit` (notebook 07's fp8 formats)
`mixed_precision`    the training variants of notebook 03 (fp32, fp16 with and without loss scaling,
                     bf16 autocast, bf16 weights with fp32 master weights) and one step of each
`precision_lab`      notebook 03's measurements of the formats: gradients against fp16's range, the
                     static scaling sweep, both scalers on identical gradients, the formats panel
`mixed_precision_lab` notebook 03's measurements of the training variants: bytes by part, the
                     summary row of each, and the sentences on training, memory and speed
`checkpointing`      activation checkpointing strategies applied to a live course GPT, and the
                     arithmetic of what they keep and recompute (Korthikanti et al.'s formula, the
                     length where activations outgrow the weights, the course block term by term, the
                     activation peak, the largest batch in a budget)
`checkpointing_lab`  notebook 04's measurements: saved bytes, step time, recomputed FLOPs, the
                     noise-aware Pareto front, the profiler's view of the overhead, the CUDA batch
                     fit, the strategy panel and the generated verdicts
`activation_bytes_lab` notebook 04's activations against weights (the crossover length, its claim) and
                     Hugging Face's gradient_checkpointing_enable beside the course's "every" policy
`accumulation`       gradient accumulation (notebook 05): micro-batches, loss weights (1/k or
                     token-weighted), the accumulated step, gradient comparisons, effective batch
`accumulation_lab`   notebook 05's measurements: the micro-batch sweep, its figures, the panel and the
                     generated sentences
`accumulation_profile_lab` notebook 05's profiled splits: one step at the smallest and the largest
                     micro-batch, matmul calls and time, and the sentences comparing them
"""
