"""Train the course GPT with the course's DDP under torchrun: the same code on one machine or many.

One machine, two processes:
    .venv/bin/torchrun --nproc-per-node=2 scripts/ddp_torchrun.py --steps 5
Two machines (run once on each; node 0's address reachable from node 1):
    torchrun --nnodes=2 --node-rank=K --nproc-per-node=GPUS_PER_NODE \
             --rdzv-backend=c10d --rdzv-endpoint=NODE0_ADDR:29500 scripts/ddp_torchrun.py
torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for each process; the script
reads nothing else. `--fail-rank K` makes rank K raise (to see how a launch fails). Prints, on rank 0,
the loss of each step and whether every rank ends with the same parameters.
"""
from __future__ import annotations

import argparse
import gc
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from helpers.gpt.model import GPT
from helpers.parallel.ddp import DDP
from helpers.parallel.ddp_lab import global_batches, small_config


@record  # a rank's exception is written where torchrun reports it, with its rank and traceback
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--fail-rank", type=int, default=-1)
    ap.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    a = ap.parse_args()
    backend = a.backend if a.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    device = "cpu"
    if backend == "nccl":
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == a.fail_rank:
        raise RuntimeError(f"planted failure on rank {rank} (--fail-rank {a.fail_rank})")
    cfg = small_config()
    torch.manual_seed(rank)  # different on purpose: DDP broadcasts rank 0's weights
    model = DDP(GPT(cfg).to(device), bucket_mb=0.02)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, rows in enumerate(global_batches(cfg, a.steps, 4 * world)):
        local = rows.chunk(world)[rank].to(device)
        opt.zero_grad()
        loss = model(local[:, :-1], local[:, 1:])[1]
        loss.backward()
        model.finish_gradient_synchronization()
        opt.step()
        if rank == 0:
            print(f"step {step}: loss on rank 0's shard {loss.item():.4f}", flush=True)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    sums = [torch.zeros(2, dtype=torch.float64, device=device) for _ in range(world)]
    dist.all_gather(sums, torch.stack([flat.sum(), flat.abs().sum()]))
    same = all(torch.equal(s, sums[0]) for s in sums)
    if rank == 0:
        print(f"torchrun: world size {world} ({backend}), node rank {os.environ.get('GROUP_RANK', '?')}; "
              f"parameters identical on every rank: {same}", flush=True)
    # The DDP wrapper and its parameters form a reference cycle (each parameter's gradient hook is a
    # method of the wrapper), so only the garbage collector frees them. Left to the interpreter's
    # shutdown, that freeing aborted a rank now and then on a 2-core CPU (SIGABRT, "terminate called
    # without an active exception", 4 launches in 45); freed here, before the process group goes,
    # 0 in 65. A rank that aborts fails the launch although its training finished.
    del model, opt
    gc.collect()
    dist.destroy_process_group()
    if not same:
        raise SystemExit("parameters differ across ranks")


if __name__ == "__main__":
    main()
