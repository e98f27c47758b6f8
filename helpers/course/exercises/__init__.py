"""The course's exercises, one module per notebook, named after its number; each registers that notebook's
exercises with `helpers.course.check.register`.

`nb00`  00 hardware
`nb01`  01 roofline
`nb02`  02 FLOPs and MFU
`nb03`  03 mixed precision
`nb04`  04 activation checkpointing
`nb05`  05 gradient accumulation
`nb06`  06 FlashAttention
`nb07`  07 FP8 training
`nb08`  08 quantisation
`nb09`  09 torch.compile
`nb10`  10 KV cache and inference
`nb11`  11 speculative decoding
`nb12`  12 data loading
`nb13`  13 distributed training
`nb14`  14 the capstone

An exercise's registration holds the expected value or the reference implementation, the cases a
learner's function is called on, the tolerance, a hint that does not contain the answer, and at least
one planted wrong answer that CI checks is refused. Notebooks only ever call
`check.exercise("NN.key", answer)`, so no expected value appears in them; `helpers.course.check.load("NN")`
imports module `nbNN` when a notebook first asks.
"""
