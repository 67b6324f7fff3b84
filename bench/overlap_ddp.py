#!/usr/bin/env python3
"""The peer of bench/overlap_mlp.cpp: the same MLP, data and batch in PyTorch DistributedDataParallel over
gloo (Debian python3-torch), one process per worker, started by distribute-launch (which sets RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as torchrun does). Rank 0 prints the same CSV line:
    overlap_mlp,ddp,workers,params,batch,steps,steps_per_s,step_ms,allreduce_ms,compute_ms
(allreduce_ms and compute_ms are left empty: DDP does not expose them apart).

    distribute-launch -n 2 python3 bench/overlap_ddp.py --hidden 2048 --layers 5 --batch 16
    distribute-launch -n 2 python3 bench/overlap_ddp.py --compress fp16    # mode ddp_fp16
"""
import argparse
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--bucket-mb", type=float, default=4.0)
    p.add_argument("--compress", choices=("none", "fp16"), default="none",
                   help="fp16: DDP's fp16_compress_hook, float16 on the wire (the bytes of our bfloat16 wire)")
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(1)
    layers = []
    for k in range(a.layers):
        layers.append(torch.nn.Linear(a.hidden, a.hidden))
        if k + 1 < a.layers:
            layers.append(torch.nn.ReLU())
    model = DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=a.bucket_mb)
    if a.compress == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    params = sum(p.numel() for p in model.parameters())
    x = torch.randn(a.batch, a.hidden)
    y = torch.randn(a.batch, a.hidden)

    def step():
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

    for _ in range(3):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    dist.barrier()
    seconds = time.perf_counter() - t0
    if dist.get_rank() == 0:
        mode = "ddp" if a.compress == "none" else "ddp_" + a.compress
        print(f"overlap_mlp,{mode},{dist.get_world_size()},{params},{a.batch},{a.steps},{a.steps / seconds:.3f},"
              f"{1e3 * seconds / a.steps:.1f},,", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
