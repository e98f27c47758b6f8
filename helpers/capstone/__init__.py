"""Notebook 14, the capstone: every technique of the course stacked on one training run and one server,
measured rung by rung. It may import every technique package; only `course` imports it.

`stack`   the training ladder: the techniques of notebooks 03-12 as rungs, each adding one to the rung
          before it, the one sentence a device gives for a technique it cannot run, and the model,
          optimizer and step each rung trains with
`stack_lab` notebook 14's parameters and measurements: the ladder trained rung by rung (interleaved in
          smoke), its table, sentences and waterfall, each technique alone against in the stack, the stack
          without each technique, the panel, the in-stack claims and the H200 targets
`stack_composition_lab` notebook 14's "where each rung's step goes": each rung's step split by the profiler
          into the parts a technique acts on, its figure, why a gain differs alone and in the stack, and the
          combination guide (fit memory, reach the batch, raise throughput) read off the measured rungs
`serve_stack` the serving ladder: the decoding techniques of notebooks 03 and 08-11 as rungs, each on the rung it
          stands on, the decoder each builds from the trained GPT, and the checks of its tokens
`waterfall` the figure both ladders draw: tokens/s per rung with its spread and its gain over the baseline
`serve_stack_lab` the serving ladder's parameters and measurements: tokens checked, held-out loss, ms/token timed by
          the protocol, bandwidth against the one copy ceiling, its table, sentences and waterfall, continuous
          against static batching on one request mix (`helpers.decode.serving`'s policies)
"""
