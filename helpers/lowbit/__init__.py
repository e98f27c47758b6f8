"""Numbers in fewer bits: FP8 training (notebook 07); quantisation, LoRA and QLoRA (notebook 08).

Technique modules:

`fp8`               FP8 formats (e4m3fn, e5m2), the saturating cast, the scaling recipes (tensorwise,
                    delayed, rowwise, DeepSeek-V3's blockwise, MX) and their quantisation error
`fp8_linear`        the fp8 matmuls (torch._scaled_mm or its fp32 emulation, the blockwise K-chunked
                    product), `Float8Linear` and its backward, the model swap; torchao's float8 training
                    imported quietly, probed per recipe, and its model swap
`quant`             integer grids (absmax, zero-point; per tensor, channel or group), int4 packing, NF4 and
                    double quantisation (bitsandbytes' `compress_statistics`), equal to bitsandbytes
`quant_linear`      LLM.int8's outlier decomposition, weight-only int8 / int4 linears, the Triton int4
                    kernel (it switches Triton's interpreter on for itself without a GPU), torchao's
                    weight-only configs
`w8a8`              int8 activation scales (static, calibrated, against dynamic), W8A8 matmuls through
                    torch._int_mm, PyTorch's CPU int4 weight kernels' layout
`qat`               quantization-aware training: the straight-through fake quantizer on the block linears,
                    against post-training quantization by held-out loss
`gptq`              GPTQ and AWQ against round-to-nearest, on one layer or the whole GPT, with their
                    calibration data and layer inputs
`lora`              LoRA and QLoRA adapters and their merges, the fine-tuning loop, the fine-tuning memory
                    formulas and the bytes counted from tensors

Labs (the notebooks' measurements):

`fp8_lab`           notebook 07's parameters and numerics: the formats side by side, quantisation error on
                    the GPT's tensors and with a planted outlier, delayed vs current scaling, parity with
                    torchao, the panel
`fp8_train_lab`     notebook 07's training with every recipe, and speed and profiles on GPUs with FP8
                    tensor cores
`quant_lab`         notebook 08's parameters, weight and activation error, the sweep of formats, the highest
                    held-out loss beyond the noise (`helpers.gpt.heldout`), the takeaways on quality
`gptq_lab`          notebook 08's GPTQ / AWQ layer errors and perplexity against RTN
`quant_decode_lab`  notebook 08's decode speed of weight-only int8 / int4 linears (GPU and CPU), as tokens/s
                    and as bandwidth against the copy ceiling
`lora_lab`          notebook 08's fine-tuning measurements: full vs LoRA vs QLoRA, memory measured against
                    the formula
`peft_lab`          notebook 08's check of our LoRA and QLoRA against peft
`optim8bit_lab`     notebook 08's 8-bit optimizer state (bitsandbytes AdamW8bit) against AdamW
"""
