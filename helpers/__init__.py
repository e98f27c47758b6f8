"""The shared code of the course "LLM efficiency, measured": a package per layer and per part of the course.

The layers, from the bottom up; each imports only the ones below it (import-linter checks it):

`show/`       tables, plots, widgets: how notebooks print and draw
`measure/`    device facts, ceilings, the timer, records, claims, parameters, profiling
`gpt/`        the course GPT, its corpus, its trained weights, generation with a KV cache
`cost/`       notebooks 00-02        `training/`   notebooks 03-05        `attention/`  notebook 06
`lowbit/`     notebooks 07-08        `fusion/`     notebook 09            `decode/`     notebooks 10-11
`dataload/`   notebook 12            `parallel/`   notebook 13            `capstone/`   notebook 14
`course/`     exercises, the headless runner and its report (the maintainers' GPU capture and performance
              goals are tools/capture/ in the repository, not part of this package)

A part of the course may use the parts before it, never those after it. In each part, technique modules
hold the method and one `<topic>_lab` module per notebook holds that notebook's measurements, figures,
panels and sentences. Notebook by notebook (lab first, then the technique modules it teaches):

00  hardware           cost/hardware_lab; measure/hardware, measure/ceilings, measure/bench
01  roofline           cost/roofline_lab; cost/roofline
02  FLOPs and MFU      cost/mfu_lab; cost/flops, cost/mfu
03  mixed precision    training/precision_lab, training/mixed_precision_lab; training/precision,
                       training/mixed_precision
04  checkpointing      training/checkpointing_lab, training/activation_bytes_lab; training/checkpointing
05  accumulation       training/accumulation_lab; training/accumulation
06  FlashAttention     attention/flash_lab, attention/flash_speed_lab; attention/kernels, attention/flash_v1,
                       attention/flash_triton, attention/triton_aot, attention/sdpa_choice
07  FP8 training       lowbit/fp8_lab, lowbit/fp8_train_lab; lowbit/fp8, lowbit/fp8_linear
08  quantisation       lowbit/quant_lab, lowbit/gptq_lab, lowbit/quant_decode_lab, lowbit/lora_lab,
                       lowbit/peft_lab, lowbit/optim8bit_lab; lowbit/quant, lowbit/quant_linear, lowbit/gptq,
                       lowbit/lora, lowbit/w8a8, lowbit/qat
09  torch.compile      fusion/compiler_lab, fusion/compiler_model_lab, fusion/compiler_modes_lab; fusion/compiler,
                       fusion/dynamo, fusion/triton_softmax, fusion/onnx_backend, fusion/xla, fusion/graph_passes
10  KV cache, serving  decode/kv_cache_lab, decode/kv_decode_lab, decode/paged_lab, decode/serving_lab;
                       gpt/generation, decode/kv_cache, decode/paged, decode/paged_attention, decode/serving,
                       decode/prefill, decode/kv_quant, decode/gqa_uptrain
11  speculative        decode/speculative_lab, decode/speculative_report_lab; decode/speculative
12  data loading       dataload/loading_lab, dataload/loading_sweep_lab, dataload/packing_lab; dataload/loading, dataload/packing
13  distributed        parallel/collectives_lab, parallel/ddp_lab, parallel/zero_lab, parallel/pipeline_lab;
                       parallel/collectives, parallel/ddp, parallel/zero, parallel/fsdp, parallel/tensor_parallel,
                       parallel/pipeline, parallel/launch, parallel/payload, parallel/torchrun,
                       parallel/in_process, parallel/wording
14  capstone           capstone/stack_lab; capstone/stack (every technique above, stacked)

Every notebook also uses `measure/params`, `measure/results`, `measure/claims`, `show/` and its exercises
in `course/exercises/nbNN`. Packages are imported on demand, so `import helpers` stays cheap.
"""

__version__ = "0.1.0"
