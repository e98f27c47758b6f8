"""Numbers in fewer bits: FP8 training (notebook 07); quantisation, LoRA and QLoRA (notebook 08).

`fp8`           FP8 formats (e4m3fn, e5m2), the saturating cast, the scaling recipes (tensorwise,
                delayed, rowwise, DeepSeek-V3's blockwise, MX), the fp8 matmuls, `Float8Linear` and the
                model swap; torchao's float8 training imported quietly, and probed per recipe
`fp8_lab`       notebook 07's measurements: the formats side by side, quantisation error on the GPT's
                tensors and with a planted outlier, delayed vs current scaling, parity with torchao,
                training with every recipe, speed and profiles on GPUs with FP8 tensor cores, the panel
`quant`         integer grids (absmax, zero-point; per tensor, channel or group), int4 packing, NF4 and
                double quantisation, equal to bitsandbytes
`quant_linear`  LLM.int8's outlier decomposition, weight-only int8 / int4 linears, the Triton int4
                kernel (it switches Triton's interpreter on for itself without a GPU), torchao's
                weight-only configs
`gptq`          GPTQ and AWQ against round-to-nearest, on one layer or the whole GPT, with their
                calibration data and layer inputs
`lora`          LoRA and QLoRA adapters and their merges, the fine-tuning loop, the fine-tuning memory
                formulas and the bytes counted from tensors
`quant_lab`     notebook 08's quantisation measurements: weight and activation error, GPTQ / AWQ layer
                errors and perplexity, the grid of formats, decode speed (GPU), 8-bit optimizer state
`lora_lab`      notebook 08's fine-tuning measurements: full vs LoRA vs QLoRA, memory measured against
                the formula, our LoRA and QLoRA against peft
"""
