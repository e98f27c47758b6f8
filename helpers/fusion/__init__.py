"""Fusion: torch.compile taken apart, and a fused softmax written in Triton: notebook 09.
Imports `gpt`, `cost`, `measure` and `show`.

`compiler`        the method: the workloads written as separate ops, the bytes eager mode moves against
                  one fused kernel, the kernels a call launches, the code Inductor writes, graph breaks
                  and their fixes, recompilations, TORCH_LOGS captured, fullgraph=True, regional
                  compilation (each block compiled)
`triton_softmax`  a fused row softmax in Triton (one program per row, online over blocks for long rows),
                  in Triton's interpreter without a GPU
`compile_lab`     notebook 09's measurements: each workload eager, compiled and library, the cost of
                  compiling (cold, warm, break-even), the softmax sweep, the course GPT's training step
                  and one-token forward compiled, whole model vs by block, the copy ceiling and cache size,
                  the generated sentences and claims, the instructor panel
"""
