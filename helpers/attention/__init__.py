"""Attention, from the naive N x N version to FlashAttention-2 in PyTorch tiles and in Triton: notebook 06.
Imports `gpt`, `measure` and `show`.

`kernels`       the method: the online softmax, FlashAttention-2 as a PyTorch autograd Function in tiles,
                the dispatcher over every attention implementation (grouped-query attention included) and
                why some cannot run here, the FLOP convention, the models of bytes kept for backward and
                of HBM traffic
`flash_triton`  FlashAttention-2 as Triton kernels (a forward, a backward in two kernels; autotuned on a
                GPU, in Triton's interpreter without one) and their autograd Function
`flash_v1`      FlashAttention-1's loop order (key tiles outside, O, m and l re-read and re-written per key
                tile), its HBM-traffic model and the GPU programs each order launches
`sdpa_choice`   which backend SDPA picks by itself for a call, read from the profiler's operators
`triton_aot`    the Triton kernels compiled for a GPU that need not be here (sm_90) and the compiler's
                report: registers, spills, shared memory, tensor-core instructions
`flash_lab`     notebook 06's measurements: its parameters, correctness by flash-attn's rule, the generated
                sentences, the course GPT per kernel, the instructor panel
`flash_speed_lab` notebook 06's speed and memory: timing, the TFLOP/s sweep and its goal, the memory wall,
                and their figures

The one-command GPU check of these kernels is maintainers' tooling outside the package:
`python -m tools.capture.gpu_check` from the repository root.
"""
