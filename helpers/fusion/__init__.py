"""Fusion: torch.compile taken apart, and a fused softmax written in Triton: notebook 09.
Imports `gpt`, `cost`, `measure` and `show`.

`compiler`           the method: the workloads written as separate ops, the bytes eager mode moves against
                     one fused kernel, the kernels a call launches, the code Inductor writes, regional
                     compilation (each block compiled), Inductor's FX-graph cache counts
`dynamo`             what Dynamo captures: graph breaks and their fixes, recompilations, TORCH_LOGS
                     captured, fullgraph=True
`triton_softmax`     a fused row softmax in Triton (one program per row, online over blocks for long rows),
                     in Triton's interpreter without a GPU
`compiler_lab`        notebook 09's parameters and workload measurements: each workload eager, compiled and
                     library against the copy ceiling, the softmax sweep, the generated sentences, the panel
`compiler_model_lab`  notebook 09's cost of compiling (cold, warm, break-even) and the course GPT compiled: its
                     training step, its one-token forward under each mode, whole model vs by block, the claim
`compiler_profile_lab`  notebook 09's profile of a compiled call, read: the fused kernel's share, Inductor's
                     record names labelled, the sentence built from them
`compiler_takeaways_lab`  notebook 09's closing sentences, generated from the run's numbers
`compiler_modes_lab`  notebook 09's one-token forward under each torch.compile mode, and CUDA graphs two ways:
                     mode="reduce-overhead" (Inductor's kernels) and backend="cudagraphs" (no fusion)
`onnx_backend`       the course GPT exported to ONNX and run in ONNX Runtime on one thread, beside eager and
                     Inductor: the export, ORT's graph rewrites and node counts, the three-way check and timing
`xla`                the course GPT's forward written in JAX and compiled by XLA (jax.jit) on the CPU, on one
                     thread; the fusions of its optimized HLO (jax is imported inside the functions that need it)
`graph_passes`       dead-code elimination and constant folding written over a torch.fx graph, each checked
                     against torch's own pass
"""
