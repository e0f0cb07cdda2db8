"""A short timed all-reduce over the launched ranks: ``python -m dstk.launch.allreduce``.

Started by ``dstk doctor`` through the same runner as training. Bandwidth is reported the way
nccl-tests does (doc/PERFORMANCE.md in NVIDIA/nccl-tests): for ``S`` bytes reduced in ``t``
seconds over ``n`` ranks,

    algbw = S / t
    busbw = algbw * 2 * (n - 1) / n

``busbw`` is comparable with the hardware's link speed whatever ``n`` is, because a ring
all-reduce moves ``2 (n-1)/n`` of the buffer through each rank's link. ``t`` is the slowest
rank's mean over the timed iterations (after warm-up), like nccl-tests' out-of-place time.
Rank 0 prints one line ``DSTK_ALLREDUCE {json}`` per size.
"""

from __future__ import annotations

import argparse
import json
import time

TAG = "DSTK_ALLREDUCE "


def bus_bandwidth(*, size_bytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes per second for one all-reduce of ``size_bytes`` taking ``seconds``."""
    algbw = size_bytes / seconds
    return algbw, algbw * 2 * (world_size - 1) / world_size


def parse_size(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def start_rank():
    """Join the run's process group on the accelerator's backend (NCCL on GPUs, gloo on CPUs; a group
    already up is kept) and bind this rank's device: ``(accelerator, backend name, torch.device)``."""
    import os

    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator()
    backend = accel.communication_backend_name()
    deepspeed.init_distributed(dist_backend=backend)
    device = torch.device(accel.device_name(int(os.environ.get("LOCAL_RANK", 0))))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return accel, backend, device


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dstk.launch.allreduce")
    parser.add_argument("--sizes", default="1M,8M", help="buffer sizes, comma-separated (K/M/G = KiB/MiB/GiB)")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # the runner adds it
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    accel, backend, device = start_rank()
    rank, world = dist.get_rank(), dist.get_world_size()
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        buf = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(args.warmup):
            dist.all_reduce(buf)
        accel.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(buf)
        accel.synchronize()
        elapsed = torch.tensor([(time.perf_counter() - start) / args.iters], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        # The buffer must hold world**(warmup+iters) after repeated sums of ones: a wrong result is a broken fabric.
        expected = float(world) ** (args.warmup + args.iters)
        correct = bool(torch.allclose(buf[:8].double().cpu(), torch.full((min(8, buf.numel()),), expected, dtype=torch.float64),
                                      rtol=1e-3))
        seconds = float(elapsed.item())
        algbw, busbw = bus_bandwidth(size_bytes=size, seconds=seconds, world_size=world)
        if rank == 0:
            print(TAG + json.dumps({"size_bytes": size, "seconds": seconds, "algbw_bytes_per_s": algbw,
                                    "busbw_bytes_per_s": busbw, "world_size": world, "backend": backend,
                                    "device": device.type, "correct": correct, "iters": args.iters}), flush=True)
    return 0


if __name__ == "__main__":
    from dstk.launch.rank import exit_rank

    exit_rank(main())
