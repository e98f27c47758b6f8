"""Distributed training on `torch.distributed`, written from scratch and checked against PyTorch's own:
notebook 13 (and `scripts/ddp_torchrun.py`). Imports `gpt`, `measure` and `show`.

`distributed`     ranks on one machine (`run_on_ranks`, a fork-server launcher that leaves nothing behind),
                  two torchrun launchers at a local rendezvous, the ring all-reduce from send/recv and its
                  schedule, the alpha-beta model and nccl-tests' bus bandwidth
`data_parallel`   DDP (per-parameter or bucketed all-reduce overlapped with backward, no_sync,
                  find_unused_parameters as torch's), ZeRO-1/2 (`ShardedOptimizer`), FSDP (ZeRO-3) over Linear and Embedding layers, bytes per rank,
                  the ZeRO paper's memory and communication formulas
`model_parallel`  Megatron tensor parallelism (column/row-split MLP, head-split attention) and its bytes per
                  layer, the GPipe and 1F1B pipeline schedules, `pipeline_step` (one training step of a real
                  module split into stages by them) and GPipe's bubble formula
`dist_lab`        notebook 13's work on ranks: the checks against single-process training and dense layers,
                  collective timings (ping-pong, ring, `dist.all_reduce`), DDP step times, memory per ZeRO
                  stage, the pipeline executed with a fixed compute time and its bubble; the notebook's
                  sentences, plan figure and parameter checks
"""
