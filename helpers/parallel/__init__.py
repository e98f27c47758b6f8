"""Distributed training on `torch.distributed`, written from scratch and checked against PyTorch's own:
notebook 13 (and `scripts/ddp_torchrun.py`). Imports `gpt`, `measure` and `show`.

Technique modules:

`collectives`      the ring all-reduce from send/recv and its schedule (`ring_schedule`, `simulate_ring`),
                   the alpha-beta model and nccl-tests' bus bandwidth
`ddp`              DDP (per-parameter or bucketed all-reduce overlapped with backward, no_sync,
                   find_unused_parameters as torch's; `bucket_assignment`, torch's rule; `overlap_prediction`)
                   and the helpers ZeRO and FSDP share
`zero`             ZeRO-1/2 (`ShardedOptimizer`), bytes per rank, the ZeRO paper's memory and communication formulas
`fsdp`             FSDP (ZeRO-3) over Linear and Embedding layers
`tensor_parallel`  Megatron tensor parallelism (column/row-split MLP, head-split attention) and its bytes per layer
`pipeline`         the GPipe and 1F1B pipeline schedules, `pipeline_step` (one training step of a real module
                   split into stages by them), GPipe's bubble formula and `replay_schedule` (a schedule
                   replayed as events with given step, delivery and in-between times)

Launching ranks:

`launch`           ranks on one machine (`run_on_ranks`, a fork-server launcher that leaves nothing behind)
`payload`          what travels between the launcher and its ranks (the function out, the results back)
`torchrun`         torchrun launchers at a local rendezvous, one per stand-in machine (`torchrun_two_nodes`)
`in_process`       the notebook's own cells run where no rank can run them: ranks as threads of this process
                   (`on_threads`), or a process group of one rank (`one_rank`)

Notebook 13's labs, one per section, each named after the technique it measures:

`collectives_lab`  the ring checked against `dist.all_reduce`, ping-pong and all-reduce timings, the
                   course's timing protocol on ranks (`rounds`), the machine's load around a section on
                   ranks (`on_ranks`, `Load`: rankings withheld on a shared machine), the notebook's parameters
`ddp_lab`          DDP, ZeRO and FSDP checked against single-process training, DDP step times by the
                   protocol, DDP's overlap with timed waits, the bucketing and overlap sentences
`zero_lab`         memory per ZeRO stage measured on ranks, the formulas' plan and figure
`pipeline_lab`     tensor parallelism checked against dense layers, the pipeline executed with a fixed
                   compute time, its bubble, where its idle time went, and what the ledger judges of GPipe's formula
`wording`          sentences printed under the notebook's tables (DDP's speed and ring targets, the sweep's spread,
                   what each torchrun node did), generated from the same numbers as the tables
"""
