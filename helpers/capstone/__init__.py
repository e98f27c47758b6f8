"""Notebook 14, the capstone: every technique of the course stacked on one training run, measured rung by
rung. It may import every technique package; only `course` imports it.

`stack`   the training ladder: the techniques of notebooks 03-12 as rungs, each adding one to the rung
          before it, the one sentence a device gives for a technique it cannot run, and the model,
          optimizer and step each rung trains with
`capstone_lab` notebook 14's parameters and measurements: the ladder trained rung by rung (interleaved in
          smoke), its table, sentences and waterfall, each technique alone against in the stack, the panel
"""
