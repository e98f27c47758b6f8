"""Distributed training on `torch.distributed`, written from scratch and checked against PyTorch's own:
notebook 13 (and `scripts/ddp_torchrun.py`). Imports `gpt`, `measure` and `show`.

`distributed`     ranks on one machine (`run_on_ranks`, a fork-server launcher that leaves nothing behind),
                  two torchrun launchers at a local rendezvous, the ring all-reduce from send/recv and its
                  schedule, the alpha-beta model and nccl-tests' bus bandwidth
`data_parallel`   DDP (per-parameter or bucketed all-reduce overlapped with backward, no_sync,
                  find_unused_parameters as torch's; `bucket_assignment`, torch's rule; `overlap_prediction`),
                  ZeRO-1/2 (`ShardedOptimizer`), FSDP (ZeRO-3) over Linear and Embedding layers, bytes per rank,
                  the ZeRO paper's memory and communication formulas
`model_parallel`  Megatron tensor parallelism (column/row-split MLP, head-split attention) and its bytes per
                  layer, the GPipe and 1F1B pipeline schedules, `pipeline_step` (one training step of a real
                  module split into stages by them), GPipe's bubble formula and `replay_schedule` (a schedule
                  replayed as events with given step, delivery and in-between times)
`dist_lab`        notebook 13's work on ranks: the checks against single-process training and dense layers,
                  collective timings (ping-pong, ring, `dist.all_reduce`), DDP step times by the protocol,
                  DDP's overlap with timed waits, memory per ZeRO stage, the pipeline executed with a fixed
                  compute time, its bubble and where its idle time went; the notebook's sentences, ledger
                  verdict, plan figure and parameter checks
"""
